"""manifest.json (twostep/artifact/manifest.py): schema versions, and the decoder variants' entries."""

from __future__ import annotations

import json
import shutil

import pytest

from cli_helpers import assert_user_error, twostep
from twostep.artifact import load_artifact
from twostep.artifact.spec import INPLACE, INPLACE_FILE, STANDARD_INPLACE
from twostep.errors import BadArtifact


def edit_manifest(art, **changes):
    manifest = json.loads((art / "manifest.json").read_text())
    manifest.update(changes)
    (art / "manifest.json").write_text(json.dumps(manifest))


def test_unknown_schema_version(art_copy):
    edit_manifest(art_copy, schema_version=99)
    assert_user_error(twostep("inspect", art_copy), "schema version 99", "this twostep reads versions 2 and 3")


def test_a_schema_2_artifact_still_translates_as_before(art_copy):
    """Schema 2 named one SentencePiece file and had no start id or never-generated ids: it reads as the plain
    SentencePiece tokenizer of its special ids, and translates as the schema 3 export of the same model."""
    sentences = ["three hundred and forty-two", "seventy-one thousand and five"]
    want = twostep("translate", art_copy, *sentences)
    manifest = json.loads((art_copy / "manifest.json").read_text())
    for key in ("activation", "positions", "position_offset", "decoder_start_id", "never_generate"):
        del manifest["model"][key]
    manifest.update(schema_version=2, tokenizer="tokenizer.model")
    (art_copy / "manifest.json").write_text(json.dumps(manifest))
    got = twostep("translate", art_copy, *sentences)
    assert (got.returncode, got.stdout) == (0, want.stdout) and want.stdout.strip(), got.stderr


@pytest.mark.parametrize("command", ["inspect", "translate", "serve"])
def test_an_artifact_of_the_older_schema_asks_to_be_re_exported(art_copy, command):
    edit_manifest(art_copy, schema_version=1)
    args = {"translate": ["one"], "serve": ["--port", "0"]}.get(command, [])
    assert_user_error(twostep(command, art_copy, *args), "schema version 1, exported by an older twostep",
                      "re-export it from its checkpoint with `twostep export CHECKPOINT --out DIR --force`")


def copy_of(result, tmp_path):
    dst = tmp_path / "art"
    shutil.copytree(result.path, dst)
    return dst


def test_a_tampered_variant_is_refused(demo_inplace, tmp_path):
    art = copy_of(demo_inplace, tmp_path)
    data = bytearray((art / INPLACE_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (art / INPLACE_FILE).write_bytes(bytes(data))
    with pytest.raises(BadArtifact, match="sha256 does not match"):
        load_artifact(art)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["variants"][INPLACE]["inputs"].pop(2), "inputs/outputs are not those"),
    (lambda m: m["files"].pop(INPLACE_FILE), "not listed in 'files'"),
    (lambda m: m["variants"][INPLACE].update(file="../elsewhere.onnx"), "plain relative path"),
    (lambda m: m.update(variants=[]), "'variants' is list"),
])
def test_a_wrong_variant_entry_is_refused(demo_inplace, tmp_path, edit, message):
    art = copy_of(demo_inplace, tmp_path)
    manifest = json.loads((art / "manifest.json").read_text())
    edit(manifest)
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BadArtifact, match=message):
        load_artifact(art)


def test_an_unknown_variant_from_a_newer_twostep_is_ignored(demo_inplace, tmp_path):
    art = copy_of(demo_inplace, tmp_path)
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["variants"]["decoder_someday"] = {"file": "someday.onnx"}
    (art / "manifest.json").write_text(json.dumps(manifest))
    assert list(load_artifact(art).variants) == [INPLACE, STANDARD_INPLACE]
