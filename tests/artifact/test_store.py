"""Bad artifacts: one clear message naming the file, exit 1, no traceback (loading an artifact directory)."""

from __future__ import annotations

import json
import shutil

import pytest

from cli_helpers import assert_user_error, twostep
from twostep.artifact import load_artifact, sha256_file
from twostep.errors import BadArtifact


def rehash(art):
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["files"] = {name: sha256_file(art / name) for name in manifest["files"]}
    (art / "manifest.json").write_text(json.dumps(manifest))


def test_missing_file(art_copy):
    (art_copy / "decoder.onnx").unlink()
    assert_user_error(twostep("translate", art_copy, "one"), "decoder.onnx: missing")


def test_sha256_mismatch(art_copy):
    with open(art_copy / "encoder.onnx", "ab") as f:
        f.write(b"\0")
    assert_user_error(twostep("translate", art_copy, "one"), "encoder.onnx: sha256 does not match")


def test_manifest_not_json(art_copy):
    (art_copy / "manifest.json").write_text("{")
    assert_user_error(twostep("translate", art_copy, "one"), "manifest.json: not valid JSON")


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_or_truncated_onnx(art_copy, damage):
    path = art_copy / "decoder.onnx"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3] if damage == "truncate" else b"not an onnx model" * 100)
    rehash(art_copy)  # so that it is the ONNX reader, not the hash check, that meets the damage
    result = twostep("translate", art_copy, "one")
    assert_user_error(result, "decoder.onnx: ")
    assert "not a readable ONNX model" in result.stderr or "ONNX Runtime cannot load it" in result.stderr


def test_library_errors_name_the_file(art_copy):
    (art_copy / "tokenizer.model").write_bytes(b"broken")
    with pytest.raises(BadArtifact, match="tokenizer.model: sha256"):
        load_artifact(art_copy)


def test_engines_directory_must_be_a_real_directory(tmp_path, tiny_artifact):
    art = tmp_path / "art"
    shutil.copytree(tiny_artifact[0], art)
    (tmp_path / "elsewhere").mkdir()
    (art / "engines").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(BadArtifact, match="found a link or a file"):
        load_artifact(art).engine_dir("ort-trt")
    assert list((tmp_path / "elsewhere").iterdir()) == []
