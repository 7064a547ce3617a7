"""Artifact trust: every file the runtime opens is listed and hashed, and every name stays inside the artifact.
Each crafted artifact is refused by Python (always) and by C++ (where it builds) with the same message; a
well-formed one with ONNX external data loads in both and decodes as before, its data hashed like any listed
file. Built engines are checked against their own records."""

from __future__ import annotations

import hashlib
import json
import shutil

import onnx
import pytest

from cpp_helpers import translate_cpp
from twostep.artifact import check_ledger, record_ledger, sha256_file
from twostep.errors import BadArtifact
from twostep.runtime.backends.trt import read_engine, write_engine
from twostep.runtime.translator import open_translator

SENTENCES = ["three hundred and forty-two", "seventy-one thousand and five", "nine"]


def manifest_of(art):
    return json.loads((art / "manifest.json").read_text())


def save_manifest(art, manifest):
    (art / "manifest.json").write_text(json.dumps(manifest, indent=2))


def relist(art, manifest=None):
    """Hash every listed file again, as a tamperer would."""
    manifest = manifest or manifest_of(art)
    manifest["files"] = {name: sha256_file(art / name) for name in manifest["files"]}
    save_manifest(art, manifest)


def to_external_data(art, location="decoder.data"):
    """The decoder with its weights in an external-data file, as ONNX writes graphs over 2 GB."""
    model = onnx.load(str(art / "decoder.onnx"))
    onnx.save_model(model, str(art / "decoder.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="decoder.data", size_threshold=1024)
    if location != "decoder.data":  # point the graph somewhere else, e.g. outside the artifact
        model = onnx.load(str(art / "decoder.onnx"), load_external_data=False)
        for tensor in model.graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = location
        onnx.save(model, str(art / "decoder.onnx"))
        shutil.move(art / "decoder.data", art / location)


def flip_byte(path, offset=100):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0xFF]))


def changed(name):
    def damage(art, tmp_path):
        flip_byte(art / name)
    return damage


def unlisted(name):
    def damage(art, tmp_path):
        manifest = manifest_of(art)
        del manifest["files"][name]
        save_manifest(art, manifest)
    return damage


def dotdot_name(art, tmp_path):
    shutil.copy(art / "encoder.onnx", tmp_path / "x.onnx")
    manifest = manifest_of(art)
    manifest["files"]["../x.onnx"] = sha256_file(tmp_path / "x.onnx")
    save_manifest(art, manifest)


def absolute_graph(art, tmp_path):
    shutil.copy(art / "decoder.onnx", tmp_path / "decoder.onnx")
    manifest = manifest_of(art)
    manifest["graphs"]["decoder"]["file"] = str(tmp_path / "decoder.onnx")
    manifest["files"][str(tmp_path / "decoder.onnx")] = manifest["files"].pop("decoder.onnx")
    save_manifest(art, manifest)
    (art / "decoder.onnx").unlink()


def symlink_out(art, tmp_path):
    shutil.move(art / "decoder.onnx", tmp_path / "decoder.onnx")
    (art / "decoder.onnx").symlink_to(tmp_path / "decoder.onnx")


def external_unlisted(art, tmp_path):
    to_external_data(art)
    relist(art)


def external_escapes(art, tmp_path):
    to_external_data(art, "../decoder.data")
    relist(art)


CASES = {
    "graph changed": (changed("decoder.onnx"), "decoder.onnx: sha256 does not match manifest.json"),
    "tokenizer changed": (changed("tokenizer.model"), "tokenizer.model: sha256 does not match manifest.json"),
    "graph not listed": (unlisted("decoder.onnx"), "decoder.onnx is not listed in 'files' with its sha256"),
    "tokenizer not listed": (unlisted("tokenizer.model"), "tokenizer.model is not listed in 'files' with its sha256"),
    "name with ..": (dotdot_name, "file name '../x.onnx' must be a plain relative path inside the artifact"),
    "absolute graph file": (absolute_graph, "must be a plain relative path inside the artifact"),
    "link leading out": (symlink_out, "decoder.onnx: leads outside the artifact directory"),
    "external data not listed": (external_unlisted, "external data 'decoder.data' is not listed in manifest.json"),
    "external data outside": (external_escapes,
                              "file name '../decoder.data' must be a plain relative path inside the artifact"),
}


def crafted(case, demo_artifact, tmp_path):
    """A copy of the demo artifact damaged as CASES[case] says."""
    art = tmp_path / "art"
    shutil.copytree(demo_artifact, art)
    CASES[case][0](art, tmp_path)
    return art


@pytest.mark.parametrize("case", CASES)
def test_python_refuses_the_crafted_artifacts(case, demo_artifact, tmp_path):
    art = crafted(case, demo_artifact, tmp_path)
    with pytest.raises(BadArtifact) as info:
        open_translator(art)
    assert CASES[case][1] in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_cpp_refuses_the_crafted_artifacts_with_the_same_message(case, demo_artifact, tmp_path, cpp_build):
    proc = translate_cpp(cpp_build, crafted(case, demo_artifact, tmp_path), SENTENCES)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and CASES[case][1] in proc.stderr, proc.stderr


def with_listed_external_data(demo_artifact, tmp_path):
    """A copy of the demo artifact whose decoder keeps its weights in a listed, hashed external-data file."""
    art = tmp_path / "art"
    shutil.copytree(demo_artifact, art)
    to_external_data(art)
    manifest = manifest_of(art)
    manifest["files"]["decoder.data"] = ""
    relist(art, manifest)
    assert (art / "decoder.data").stat().st_size > (art / "decoder.onnx").stat().st_size
    return art


def translations(art):
    translator, backend = open_translator(art)
    with backend:
        return translator.translate(SENTENCES)


def test_listed_external_data_loads_decodes_the_same_and_is_hashed(demo_artifact, tmp_path):
    art = with_listed_external_data(demo_artifact, tmp_path)
    assert translations(art) == translations(demo_artifact)
    flip_byte(art / "decoder.data")
    with pytest.raises(BadArtifact, match="decoder.data: sha256 does not match"):
        open_translator(art)


@pytest.mark.slow
def test_cpp_loads_listed_external_data_decodes_the_same_and_hashes_it(demo_artifact, tmp_path, cpp_build):
    art = with_listed_external_data(demo_artifact, tmp_path)
    proc = translate_cpp(cpp_build, art, SENTENCES)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == translations(demo_artifact)
    flip_byte(art / "decoder.data")
    assert "decoder.data: sha256 does not match" in translate_cpp(cpp_build, art, SENTENCES).stderr


def test_engines_are_used_only_when_their_record_matches(tmp_path):
    plan = tmp_path / "decoder-abc.plan"
    assert read_engine(plan) is None  # not built yet
    write_engine(plan, b"serialized engine", {"graph": "decoder"})
    assert read_engine(plan) == b"serialized engine"
    record = json.loads(plan.with_suffix(".json").read_text())
    assert record["sha256"] == hashlib.sha256(b"serialized engine").hexdigest() and record["graph"] == "decoder"
    plan.write_bytes(b"a swapped engine")
    with pytest.raises(BadArtifact, match="sha256 does not match decoder-abc.json"):
        read_engine(plan)
    plan.with_suffix(".json").unlink()
    with pytest.raises(BadArtifact, match="no record decoder-abc.json"):
        read_engine(plan)


def test_onnx_runtime_trt_cache_is_opened_only_as_recorded(tmp_path):
    cache = tmp_path / "engines" / "ort-trt"
    cache.mkdir(parents=True)
    check_ledger(cache)  # empty: nothing to trust yet
    (cache / "TensorrtExecutionProvider_abc.engine").write_bytes(b"engine")
    with pytest.raises(BadArtifact, match="not in ort-trt.sha256.json"):
        check_ledger(cache)
    record_ledger(cache)  # what the backend does after ONNX Runtime built its engines
    check_ledger(cache)
    (cache / "TensorrtExecutionProvider_abc.engine").write_bytes(b"changed")
    with pytest.raises(BadArtifact, match="TensorrtExecutionProvider_abc.engine: not in ort-trt.sha256.json"):
        check_ledger(cache)
    (cache / "TensorrtExecutionProvider_abc.engine").unlink()
    (cache / "planted.engine").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(BadArtifact, match="planted.engine"):
        check_ledger(cache)
