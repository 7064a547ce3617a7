"""Bad artifacts and inputs: one clear message naming the file or input, exit 1, no traceback."""

from __future__ import annotations

import json
import shutil

import pytest

from twostep.artifact import load_artifact, sha256_file
from twostep.errors import BadArtifact, BadInput
from twostep.runtime.translator import open_translator
from test_cli import assert_user_error, twostep


@pytest.fixture()
def art_copy(demo_artifact, tmp_path):
    target = tmp_path / "art"
    shutil.copytree(demo_artifact, target)
    return target


def rehash(art):
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["files"] = {name: sha256_file(art / name) for name in manifest["files"]}
    (art / "manifest.json").write_text(json.dumps(manifest))


def edit_manifest(art, **changes):
    manifest = json.loads((art / "manifest.json").read_text())
    manifest.update(changes)
    (art / "manifest.json").write_text(json.dumps(manifest))


def test_missing_file(art_copy):
    (art_copy / "decoder.onnx").unlink()
    assert_user_error(twostep("translate", art_copy, "one"), "decoder.onnx: missing")


def test_sha256_mismatch(art_copy):
    with open(art_copy / "encoder.onnx", "ab") as f:
        f.write(b"\0")
    assert_user_error(twostep("translate", art_copy, "one"), "encoder.onnx: sha256 does not match")


def test_unknown_schema_version(art_copy):
    edit_manifest(art_copy, schema_version=99)
    assert_user_error(twostep("inspect", art_copy), "schema version 99", "this twostep reads version 2")


@pytest.mark.parametrize("command", ["inspect", "translate", "serve"])
def test_an_artifact_of_the_older_schema_asks_to_be_re_exported(art_copy, command):
    edit_manifest(art_copy, schema_version=1)
    args = {"translate": ["one"], "serve": ["--port", "0"]}.get(command, [])
    assert_user_error(twostep(command, art_copy, *args), "schema version 1, exported by an older twostep",
                      "re-export it from its checkpoint with `twostep export CHECKPOINT --out DIR --force`")


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


def test_sentence_longer_than_max_positions(demo_artifact):
    long = " ".join(["seven hundred and seventy-seven thousand"] * 40)
    assert_user_error(twostep("translate", demo_artifact, long), "sentence 1 has", "at most 128 (max_positions)")


def test_empty_input(demo_artifact):
    assert_user_error(twostep("translate", demo_artifact, "   "), "sentence 1 is empty")
    assert_user_error(twostep("translate", demo_artifact, stdin=""), "no input")


def test_token_ids_outside_the_vocabulary(demo_artifact):
    assert_user_error(twostep("translate", demo_artifact, "--ids", "5 9999 3"),
                      "sentence 1 has token ids outside the vocabulary [0, 256): [9999]")
    assert_user_error(twostep("translate", demo_artifact, "--ids", "5 x 3"), "is not a list of token ids")
    translator, backend = open_translator(demo_artifact, "ort-cpu")
    with backend, pytest.raises(BadInput, match=r"token ids outside the vocabulary \[0, 256\): \[9999\]"):
        translator.translate_ids([[5, 9999, 3]])


def test_token_id_interface_matches_text(demo_artifact):
    from num2words import num2words

    from twostep.runtime.tokenizer import Tokenizer

    tokenizer = Tokenizer(demo_artifact / "tokenizer.model")
    ids = " ".join(map(str, tokenizer.encode_source("four hundred and two")))
    result = twostep("translate", demo_artifact, "--ids", ids)
    assert result.returncode == 0, result.stderr
    assert tokenizer.decode(int(t) for t in result.stdout.split()) == num2words(402, lang="de")


def test_unavailable_backend_on_the_cli(demo_artifact):
    assert_user_error(twostep("translate", demo_artifact, "one", "--backend", "ort-cuda"),
                      "backend 'ort-cuda' is not available here")
    assert_user_error(twostep("translate", demo_artifact, "one", "--backend", "nope"), "unknown backend 'nope'")


def test_library_errors_name_the_file(art_copy):
    (art_copy / "tokenizer.model").write_bytes(b"broken")
    with pytest.raises(BadArtifact, match="tokenizer.model: sha256"):
        load_artifact(art_copy)
