"""The C++ embedding (cpp/): build it with CMake, then hold its example to the Python runtime's outputs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cpp_helpers import CPP, stream_cpp
from cpp_helpers import translate_cpp as translate
from twostep.errors import BadArtifact, BadInput
from twostep.runtime.decoding import DecodeOptions
from twostep.runtime.decoding.constraints import Constraints
from twostep.runtime.translator import open_translator

pytestmark = pytest.mark.slow


def ids_lines(sequences) -> list[str]:
    return [" ".join(map(str, ids)) for ids in sequences]


def assert_same(what: str, python: list, cpp: list) -> None:
    assert len(cpp) == len(python), f"{what}: C++ printed {len(cpp)} lines for {len(python)} inputs"
    bad = [i for i, (p, c) in enumerate(zip(python, cpp)) if p != c]
    shown = "\n".join(f"  #{i}: python {python[i]!r}\n       c++    {cpp[i]!r}" for i in bad[:5])
    assert not bad, f"{what}: {len(bad)} of {len(python)} differ; first ones:\n{shown}"


@pytest.fixture(scope="session")
def test_sentences() -> list[str]:
    from twostep.model.tasks import get_task

    return [source for source, _ in get_task("numbers-en-de").split("test")]


# --io-binding: the path `provider cuda` always takes (decoder state kept in the provider's memory through
# Ort::IoBinding, beam rows moved by a Gather session), run on the CPU provider.
BINDINGS = pytest.mark.parametrize("binding", [(), ("--io-binding",)], ids=["host", "io-binding"])


@BINDINGS
@pytest.mark.parametrize("beam", [1, 4])
def test_cpp_matches_python_runtime(cpp_build, demo_artifact, test_sentences, beam, binding):
    translator, backend = open_translator(demo_artifact, "ort-cpu", options=DecodeOptions(beam_size=beam))
    with backend:
        py_text = translator.translate(test_sentences)
        sources = translator.encode(test_sentences)
        py_ids = translator.translate_ids(sources)

    text = translate(cpp_build, demo_artifact, test_sentences, "--beam", beam, *binding)
    assert text.returncode == 0, text.stderr
    assert_same(f"beam {beam} text", py_text, text.stdout.splitlines())

    ids = translate(cpp_build, demo_artifact, ids_lines(sources), "--beam", beam, "--ids", *binding)
    assert ids.returncode == 0, ids.stderr
    assert_same(f"beam {beam} ids", ids_lines(py_ids), ids.stdout.splitlines())


def test_cpp_decodes_an_int4_artifact_as_the_python_runtime(cpp_build, demo_int4, test_sentences):
    """int4 weights are ONNX Runtime's MatMulNBits (com.microsoft): the ONNX Runtime the library links runs them."""
    translator, backend = open_translator(demo_int4, "ort-cpu", options=DecodeOptions(beam_size=4))
    with backend:
        py_text = translator.translate(test_sentences)
    text = translate(cpp_build, demo_int4, test_sentences, "--beam", 4)
    assert text.returncode == 0, text.stderr
    assert_same("int4 beam 4 text", py_text, text.stdout.splitlines())


def streamed(events: list[dict], n: int, key: str = "delta") -> list:
    """Each sentence's deltas joined (key "tokens": its last tokens), after checking that each of the n got
    exactly one finished event, its last."""
    out: list = ["" if key == "delta" else None] * n
    finished = [False] * n
    for event in events:
        i = event["sentence"]
        assert not finished[i], f"sentence {i}: an event after its finished one: {event}"
        out[i] = out[i] + event["delta"] if key == "delta" else event["tokens"]
        finished[i] = event["finished"]
    assert all(finished), f"sentences without a finished event: {[i for i, f in enumerate(finished) if not f]}"
    return out


@BINDINGS
@pytest.mark.parametrize("beam", [1, 4])
def test_cpp_streams_what_it_translates(cpp_build, demo_artifact, test_sentences, beam, binding):
    """--stream (Model::translate with a StepCallback): each sentence's deltas joined are the text translate()
    gives without one; greedy sends the tokens so far after every step (one more each time), beam search one
    event a sentence."""
    text = translate(cpp_build, demo_artifact, test_sentences, "--beam", beam, *binding)
    assert text.returncode == 0, text.stderr
    events = stream_cpp(cpp_build, demo_artifact, test_sentences, "--beam", beam, *binding)
    assert_same(f"beam {beam} streamed text", text.stdout.splitlines(), streamed(events, len(test_sentences)))

    translator, backend = open_translator(demo_artifact, "ort-cpu")
    with backend:
        sources = ids_lines(translator.encode(test_sentences))
    ids = translate(cpp_build, demo_artifact, sources, "--beam", beam, "--ids", *binding)
    assert ids.returncode == 0, ids.stderr
    events = stream_cpp(cpp_build, demo_artifact, sources, "--beam", beam, "--ids", *binding)
    final = streamed(events, len(sources), key="tokens")
    assert_same(f"beam {beam} streamed ids", ids.stdout.splitlines(), ids_lines(final))
    counts = [sum(e["sentence"] == i for e in events) for i in range(len(sources))]
    if beam > 1:
        assert set(counts) == {1}
    else:
        assert counts == [len(tokens) + 1 for tokens in final]
        seen = [0] * len(sources)
        for event in events[:-1]:
            if not event["finished"]:
                i = event["sentence"]
                seen[i] += 1
                assert event["tokens"] == final[i][:seen[i]], f"sentence {i}: {event} after {seen[i] - 1} steps"


def test_cpp_streaming_unit_tests_on_a_model(cpp_build, demo_artifact):
    """cpp/tests/test_streaming.cpp's cases on a real Model (they skip without TWOSTEP_TEST_ARTIFACT): deltas
    joined = translate(), greedy and beam, across batches; false stops the call cleanly, a throw passes through,
    and the model translates as before after either."""
    proc = subprocess.run([str(cpp_build / "twostep-tests"), "--test-case=streaming on a model*"], capture_output=True,
                          text=True, env={**os.environ, "TWOSTEP_TEST_ARTIFACT": str(demo_artifact)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"test cases:\s*2 \|\s*2 passed \|\s*0 failed", proc.stdout), proc.stdout


def test_cpp_decodes_an_artifact_with_the_in_place_variant_as_python_does(cpp_build, demo_inplace, test_sentences):
    """The C++ library decodes an artifact that carries ONNX Runtime's in-place decoder with it, as Python's ort-cpu
    does, and its beam search gives what Python's gives."""
    translator, backend = open_translator(demo_inplace.path, "ort-cpu", options=DecodeOptions(beam_size=4))
    assert backend.inplace
    with backend:
        sources = translator.encode(test_sentences)
        py_ids = translator.translate_ids(sources)
    ids = translate(cpp_build, demo_inplace.path, ids_lines(sources), "--beam", 4, "--ids")
    assert ids.returncode == 0, ids.stderr
    assert_same("beam 4 ids", ids_lines(py_ids), ids.stdout.splitlines())


def scored(proc: subprocess.CompletedProcess) -> tuple[list[str], list[float]]:
    """twostep-translate --scores' best hypotheses: their tokens and scores."""
    assert proc.returncode == 0, proc.stderr
    best = [line.split("\t")[0].split(" ", 1) + [""] for line in proc.stdout.splitlines()]
    return [b[1] for b in best], [float(b[0]) for b in best]


@pytest.mark.parametrize("beam", [1, 4])
def test_cpp_in_place_decoder_decodes_as_the_plain_one_and_python(cpp_build, demo_inplace, test_sentences, beam):
    """--kv-cache inplace (auto's choice on an artifact that has it) gives the plain decoder's tokens (--kv-cache
    concat) and the Python runtime's, on one batch of sentences of different lengths decoding 48 tokens with eos
    suppressed: the cache grows past its first capacity, 32, and beam search reorders rows at every step."""
    options = DecodeOptions(beam_size=beam, suppress_eos=True, max_new_tokens=48)
    translator, backend = open_translator(demo_inplace.path, "ort-cpu", options=options)
    assert backend.inplace
    with backend:
        sources = translator.encode(test_sentences[:24])
        python = translator.decode_ids(sources)
    assert len({len(s) for s in sources}) > 3
    args = ["--ids", "--scores", "--beam", beam, "--suppress-eos", "--max-new-tokens", 48, "--batch-size", 24]
    runs = {kv: scored(translate(cpp_build, demo_inplace.path, ids_lines(sources), *args, "--kv-cache", kv))
            for kv in ("inplace", "auto", "concat")}
    py_tokens = [" ".join(map(str, hyps[0].tokens)) for hyps in python]
    assert {len(t.split()) for t in py_tokens} == {48}
    for kv, (tokens, _) in runs.items():
        assert_same(f"beam {beam} --kv-cache {kv} ids", py_tokens, tokens)
    if beam > 1:  # the same graph as Python's: the same scores; the plain one's attention rounds otherwise
        assert runs["inplace"][1] == pytest.approx([hyps[0].score for hyps in python], rel=1e-12, abs=1e-12)
        assert runs["concat"][1] == pytest.approx(runs["inplace"][1], rel=1e-6)


def test_cpp_in_place_session_unit_tests_on_a_model(cpp_build, demo_inplace, demo_artifact):
    """cpp/tests/test_inplace.cpp's cases on the demo model (they skip without the artifacts): the in-place session's
    search outputs are the plain session's step by step, through reorders that swap and copy rows and the cache's
    growth past 32 positions, with every present output its cache buffer itself (written in place); the Model picks
    the in-place decoder on the CPU, the plain one with --kv-cache concat or io_binding, and refuses what cannot be."""
    env = {**os.environ, "TWOSTEP_TEST_INPLACE_ARTIFACT": str(demo_inplace.path),
           "TWOSTEP_TEST_ARTIFACT": str(demo_artifact)}
    proc = subprocess.run([str(cpp_build / "twostep-tests"), "--test-case=in-place decoder*"], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"test cases:\s*2 \|\s*2 passed \|\s*0 failed", proc.stdout), proc.stdout


def test_cpp_n_best_matches_python(cpp_build, demo_artifact, test_sentences):
    options = DecodeOptions(beam_size=4, n_best=3, length_penalty=0.6)
    translator, backend = open_translator(demo_artifact, "ort-cpu", options=options)
    sources = translator.encode(test_sentences[:200])
    with backend:
        python = translator.decode_ids(sources)
    proc = translate(cpp_build, demo_artifact, ids_lines(sources), "--ids", "--scores", "--beam", 4, "--n-best", 3,
                     "--length-penalty", 0.6)
    assert proc.returncode == 0, proc.stderr
    cpp = [[(h.split(" ", 1) + [""])[:2] for h in line.split("\t")] for line in proc.stdout.splitlines()]
    assert_same("n-best ids", [[" ".join(map(str, h.tokens)) for h in hyps] for hyps in python],
                [[h[1] for h in hyps] for hyps in cpp])
    # Python keeps a finished sentence's rows in the batch until a quarter of them are free (decoding.RunningBatch),
    # C++ drops them at once: ONNX Runtime's GEMMs then see different batch sizes and round the float32 logits
    # differently in the last bit, so the scores agree to float32 noise, the tokens exactly
    for hyps, line in zip(python, cpp):
        assert [float(h[0]) for h in line] == pytest.approx([h.score for h in hyps], rel=1e-6, abs=1e-6)


@BINDINGS
@pytest.mark.parametrize("beam, n_best, suppress_eos, max_new_tokens", [
    (1, 1, False, 0), (1, 1, True, 12), (4, 4, False, 0), (4, 2, True, 12), (3, 1, False, 5),
])
def test_cpp_matches_python_on_random_model(cpp_build, tiny_artifact, beam, n_best, suppress_eos, max_new_tokens,
                                            binding):
    """A random model (near-ties everywhere), sentences of many lengths in two batches, and the max_new_tokens
    fallback of beam search: the same hypotheses in the same order, and the same scores."""
    art, _ = tiny_artifact
    rng = np.random.default_rng(beam * 10 + n_best)
    sources = [rng.integers(4, 50, int(n)).tolist() + [3] for n in rng.integers(0, 20, 40)]
    options = DecodeOptions(beam_size=beam, n_best=n_best, suppress_eos=suppress_eos,
                            max_new_tokens=max_new_tokens or None)
    translator, backend = open_translator(art, "ort-cpu", options=options)
    with backend:
        python = translator.decode_ids(sources)
    args = ["--ids", "--scores", "--beam", beam, "--n-best", n_best, "--max-new-tokens", max_new_tokens]
    proc = translate(cpp_build, art, ids_lines(sources), *args, *(["--suppress-eos"] if suppress_eos else []),
                     *binding)
    assert proc.returncode == 0, proc.stderr
    cpp = [[(h.split(" ", 1) + [""])[:2] for h in line.split("\t")] for line in proc.stdout.splitlines()]
    assert_same("ids", [[" ".join(map(str, h.tokens)) for h in hyps] for hyps in python],
                [[h[1] for h in hyps] for hyps in cpp])
    for hyps, line in zip(python, cpp):
        assert [float(h[0]) for h in line] == pytest.approx([h.score for h in hyps], rel=1e-12, abs=1e-12)


def test_cpp_decodes_an_artifact_with_external_data_as_python_does(cpp_build, demo_external, test_sentences,
                                                                    tmp_path):
    """A model past 2 GB keeps its weights in weights.data (twostep.exporter.shared): ONNX Runtime finds it
    beside the graph the library opens by path, and the library hashes it like every listed file."""
    translator, backend = open_translator(demo_external, "ort-cpu", options=DecodeOptions(beam_size=4))
    with backend:
        sources = translator.encode(test_sentences)
        py_ids = translator.translate_ids(sources)
    ids = translate(cpp_build, demo_external, ids_lines(sources), "--beam", 4, "--ids")
    assert ids.returncode == 0, ids.stderr
    assert_same("beam 4 ids", ids_lines(py_ids), ids.stdout.splitlines())
    art = tampered_copy(demo_external, tmp_path, "weights.data")
    proc = translate(cpp_build, art, ["three hundred and forty-two"])
    assert proc.returncode == 1
    assert f"{art / 'weights.data'}: sha256 does not match manifest.json" in proc.stderr


def tampered_copy(src: Path, tmp_path: Path, name: str) -> Path:
    """A copy of the artifact `src` with one byte of its file `name` flipped."""
    art = tmp_path / "art"
    shutil.copytree(src, art)
    data = bytearray((art / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (art / name).write_bytes(bytes(data))
    return art


def test_cpp_rejects_tampered_artifact(cpp_build, demo_artifact, tmp_path):
    art = tampered_copy(demo_artifact, tmp_path, "decoder.onnx")
    proc = translate(cpp_build, art, ["three hundred and forty-two"])
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert f"{art / 'decoder.onnx'}: sha256 does not match manifest.json" in proc.stderr


@pytest.mark.parametrize("line, message", [
    ("7 999 3", "sentence 1 has token ids outside the vocabulary [0, 256): [999]"),
    (" ".join(["7"] * 200), "sentence 1 has 200 tokens, the model takes at most 128 (max_positions)"),
    ("7 x 3", "line 1: 'x' is not a token id"),
])
def test_cpp_input_errors(cpp_build, demo_artifact, line, message):
    proc = translate(cpp_build, demo_artifact, [line], "--ids")
    assert proc.returncode == 1
    assert message in proc.stderr


# Just outside each end of the decoding options' BOUNDS (twostep.runtime.decoding.options), as twostep-translate's
# flags and as DecodeOptions' arguments.
OUTSIDE_BOUNDS = [
    (["--beam", 0], {"beam_size": 0}),
    (["--beam", 257], {"beam_size": 257}),
    (["--beam", 100000], {"beam_size": 100000}),
    (["--beam", 4, "--n-best", 0], {"beam_size": 4, "n_best": 0}),
    (["--beam", 256, "--n-best", 257], {"beam_size": 256, "n_best": 257}),
    (["--beam", 4, "--n-best", 5], {"beam_size": 4, "n_best": 5}),
    (["--length-penalty", -10.000001], {"length_penalty": -10.000001}),
    (["--length-penalty", 10.000001], {"length_penalty": 10.000001}),
    (["--length-penalty", 700], {"length_penalty": 700}),
    (["--max-new-tokens", -1], {"max_new_tokens": -1}),
    (["--max-new-tokens", 2**20 + 1], {"max_new_tokens": 2**20 + 1}),
    (["--min-new-tokens", -1], {"min_new_tokens": -1}),
    (["--min-new-tokens", 2**20 + 1], {"min_new_tokens": 2**20 + 1}),
]


@pytest.mark.parametrize("flags, python", OUTSIDE_BOUNDS, ids=lambda v: " ".join(map(str, v)) if
                         isinstance(v, list) else None)
def test_cpp_refuses_decoding_options_outside_pythons_bounds(cpp_build, tiny_artifact, flags, python):
    """A value just outside its range is one line, Python's message, exit 1, before any input is read (a
    max_new_tokens given to the C++ library may also be 0: automatic)."""
    with pytest.raises(BadInput) as refused:
        DecodeOptions(**python)
    message = str(refused.value).replace("max_new_tokens must be an integer in [1, 1048576]",
                                         "max_new_tokens must be an integer in [1, 1048576] or 0 (automatic)")
    proc = translate(cpp_build, tiny_artifact[0], ["not ids"], "--ids", *flags)  # read, it would be an error
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", f"error: {message}\n")


@pytest.mark.parametrize("flag, value, expected", [
    ("--beam", "99999999999", "an integer in [-2147483648, 2147483647]"),
    ("--max-new-tokens", "-99999999999", "an integer in [-2147483648, 2147483647]"),
    ("--n-best", "4.0", "an integer in [-2147483648, 2147483647]"),
    ("--min-new-tokens", "", "an integer in [-2147483648, 2147483647]"),
    ("--length-penalty", "1e400", "a finite number"),
    ("--length-penalty", "nan", "a finite number"),
    ("--length-penalty", "-inf", "a finite number"),
    ("--length-penalty", "0.5x", "a finite number"),
])
def test_cpp_example_refuses_a_number_that_does_not_parse(cpp_build, tiny_artifact, flag, value, expected):
    proc = translate(cpp_build, tiny_artifact[0], ["7 8 9 3"], "--ids", flag, value)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == f"error: {flag}: expected {expected}, got '{value}'\n"


def test_cpp_refuses_a_decoding_section_outside_pythons_bounds_as_python_does(cpp_build, tiny_artifact, tmp_path):
    """An artifact whose decoding defaults are out of range: Python's BadArtifact, the same line from C++."""
    import json

    art = tmp_path / "art"
    shutil.copytree(tiny_artifact[0], art)
    manifest = json.loads((art / "manifest.json").read_text())
    for decoding in ({"beam_size": 257, "n_best": 0, "length_penalty": -10.5},
                     {"beam_size": 0, "length_penalty": 700, "max_new_tokens": 0, "min_new_tokens": 2**20 + 1},
                     {"n_best": 257, "max_new_tokens": 2**20 + 1, "min_new_tokens": -1},
                     {"sampling": True, "temperature": 0.0099, "top_k": -1, "top_p": 0},
                     {"temperature": 100.5, "top_k": 2**31, "top_p": 1.5}):
        (art / "manifest.json").write_text(json.dumps({**manifest, "decoding": decoding}))
        with pytest.raises(BadArtifact) as refused:
            open_translator(art, "ort-cpu")
        proc = translate(cpp_build, art, ["7 8 9 3"], "--ids")
        assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", f"error: {refused.value}\n"), decoding


@pytest.mark.parametrize("options", [
    {"beam_size": 4, "n_best": 4, "length_penalty": -10},
    {"beam_size": 4, "n_best": 2, "length_penalty": 10},
    {"beam_size": 256, "n_best": 256, "max_new_tokens": 3},
    {"beam_size": 4, "max_new_tokens": 2**20, "min_new_tokens": 2**20},
    {"max_new_tokens": 1, "min_new_tokens": 0},
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_cpp_decodes_at_the_ends_of_pythons_bounds_as_python_does(cpp_build, tiny_artifact, options):
    """Values at the ends of their ranges decode, with Python's hypotheses and finite scores equal to Python's:
    length_penalty -10 and 10 (scores of 1e15 and 1e-13 on the random model), a beam and n_best of 256, and 2^20 new
    tokens at least and at most, where every hypothesis runs to max_positions."""
    art, _ = tiny_artifact
    rng = np.random.default_rng(7)
    sources = [rng.integers(4, 50, int(n)).tolist() + [3] for n in rng.integers(0, 20, 12 if options.get(
        "beam_size") != 256 else 3)]
    translator, backend = open_translator(art, "ort-cpu", options=DecodeOptions(**options))
    with backend:
        python = translator.decode_ids(sources)
    flags = {"beam_size": "--beam", "n_best": "--n-best", "length_penalty": "--length-penalty",
             "max_new_tokens": "--max-new-tokens", "min_new_tokens": "--min-new-tokens"}
    args = [arg for key, value in options.items() for arg in (flags[key], value)]
    proc = translate(cpp_build, art, ids_lines(sources), "--ids", "--scores", *args)
    assert proc.returncode == 0, proc.stderr
    cpp = [[(h.split(" ", 1) + [""])[:2] for h in line.split("\t")] for line in proc.stdout.splitlines()]
    assert_same("ids", [[" ".join(map(str, h.tokens)) for h in hyps] for hyps in python],
                [[h[1] for h in hyps] for hyps in cpp])
    scores = [[float(h[0]) for h in line] for line in cpp]
    assert all(np.isfinite(s) for line in scores for s in line)
    for hyps, line in zip(python, scores):
        assert line == pytest.approx([h.score for h in hyps], rel=1e-12, abs=1e-12)
    if options.get("min_new_tokens") == 2**20:
        assert {len(hyps[0].tokens) for hyps in python} == {translator.limits.max_positions}
    if options.get("beam_size") == 256:
        assert {len(hyps) for hyps in python} == {256}


def test_cpp_model_refuses_options_outside_the_bounds_in_its_one_batch_calls(cpp_build, tiny_artifact):
    """cpp/tests/test_manifest.cpp's case on a real Model (skipped without TWOSTEP_TEST_ARTIFACT): Model::greedy and
    Model::beam_search refuse what decode_ids refuses, and decode at the ends with finite scores."""
    env = {**os.environ, "TWOSTEP_TEST_ARTIFACT": str(tiny_artifact[0])}
    proc = subprocess.run([str(cpp_build / "twostep-tests"), "--test-case=decoding options on a model*"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"test cases:\s*1 \|\s*1 passed \|\s*0 failed", proc.stdout), proc.stdout


def test_cpp_cuda_provider_on_a_cpu_build_is_one_clear_error(cpp_build, demo_artifact):
    proc = translate(cpp_build, demo_artifact, ["three hundred and forty-two"], "--provider", "cuda")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.startswith("error: provider cuda: this ONNX Runtime build has no CUDAExecutionProvider")
    assert "onnxruntime-gpu" in proc.stderr and len(proc.stderr.splitlines()) == 1


def fake_wheel(root: Path, providers: list[str]) -> Path:
    """An interpreter whose `onnxruntime` package is a directory laid out like a wheel's: capi/ with the real
    libonnxruntime.so.1.* and, like onnxruntime-gpu's, provider libraries beside it."""
    import onnxruntime

    real = Path(onnxruntime.__file__).parent / "capi"
    capi = root / "site" / "onnxruntime" / "capi"
    capi.mkdir(parents=True)
    (capi.parent / "__init__.py").write_text("")
    for lib in real.glob("libonnxruntime.so.1.*"):
        shutil.copyfile(lib, capi / lib.name)
    for name in providers:
        (capi / f"libonnxruntime_providers_{name}.so").write_bytes(f"provider {name}".encode())
    python = root / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={root / 'site'} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


def test_fetch_deps_brings_the_gpu_wheels_provider_libraries_and_drops_stale_ones(cpp_build, tmp_path):
    out = tmp_path / "ort"
    shutil.copytree(CPP / "third_party" / "onnxruntime" / "include", out / "include")  # headers: no download

    def fetch(python: Path) -> set[str]:
        env = {**os.environ, "PYTHON": str(python), "ORT_OUT": str(out), "SKIP_APT_INSTALL": "1"}
        proc = subprocess.run(["bash", str(CPP / "fetch_deps.sh")], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return {p.name for p in (out / "lib").iterdir()}

    gpu = fetch(fake_wheel(tmp_path / "gpu", ["shared", "cuda", "tensorrt"]))
    assert {"libonnxruntime_providers_shared.so", "libonnxruntime_providers_cuda.so",
            "libonnxruntime_providers_tensorrt.so", "libonnxruntime.so.1", "libonnxruntime.so"} <= gpu
    assert (out / "lib" / "libonnxruntime_providers_cuda.so").read_bytes() == b"provider cuda"
    cpu = fetch(fake_wheel(tmp_path / "cpu", ["shared"]))
    assert "libonnxruntime_providers_cuda.so" not in cpu and "libonnxruntime_providers_tensorrt.so" not in cpu
    assert "libonnxruntime_providers_shared.so" in cpu


def test_cpp_cuda_provider_runs_fp32_with_tf32_off(cpp_build):
    """The options the library gives ONNX Runtime's CUDA provider, read without a GPU by their doctest case
    (cpp/tests/test_manifest.cpp): use_tf32=0, as the Python ort-cuda backend."""
    proc = subprocess.run([str(cpp_build / "twostep-tests"), "--test-case=cuda provider options*"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"test cases:\s*1 \|\s*1 passed \|\s*0 failed", proc.stdout), proc.stdout


def test_cpp_unit_tests(cpp_build):
    proc = subprocess.run(["ctest", "--output-on-failure"], cwd=cpp_build, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "100% tests passed" in proc.stdout


def test_cpp_decodes_pretrained_families_as_transformers_does(cpp_build, pretrained):
    """Marian (a >>fra<< source token, pad never generated, decoding from pad), M2M100, NLLB and mBART-50 (the
    source language's token first, the target's forced after eos), T5 (no languages, decoding from pad) and MADLAD
    (<2fr> before the source, source languages without tokens, so none is needed): transformers' generate() text,
    greedy and beam 4 with its stopping rule, from the manifest alone (`--beam 4` and no --beam-stop: the
    manifest's decoding defaults say transformers' rule). NLLB with a tokenizer.json alone: text is
    refused with one line that says what to pass instead (tests/cpp's token-id test covers its ids)."""
    import hf_models
    from conftest import NEW_TOKENS

    langs = [arg for key, flag in (("src_lang", "--src-lang"), ("tgt_lang", "--tgt-lang"))
             if key in pretrained.langs for arg in (flag, pretrained.langs[key])]
    common = ["--max-new-tokens", NEW_TOKENS, *langs]
    if not pretrained.text_in_cpp:
        refused = translate(cpp_build, pretrained.art, hf_models.TEST_SENTENCES, *common)
        assert refused.returncode == 1 and "tokenizer.json, which the C++ library does not read" in refused.stderr
        assert "translate_ids" in refused.stderr and "Traceback" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        from twostep.model.checkpoint import read_tokenizer
        from twostep.runtime.tokenizer import Tokenizer

        tokenizer = Tokenizer.load(pretrained.ckpt, read_tokenizer(pretrained.ckpt))  # the ids, from Python
        ids = [" ".join(map(str, tokenizer.encode_source(s, **pretrained.langs))) for s in hf_models.TEST_SENTENCES]
        by_ids = translate(cpp_build, pretrained.art, ids, "--ids", "--max-new-tokens", NEW_TOKENS, "--tgt-lang",
                           pretrained.langs["tgt_lang"])
        assert by_ids.returncode == 0, by_ids.stderr
        assert [[int(i) for i in line.split()] for line in by_ids.stdout.splitlines()] == pretrained.greedy[0]
        return
    greedy = translate(cpp_build, pretrained.art, hf_models.TEST_SENTENCES, *common)
    assert greedy.returncode == 0, greedy.stderr
    assert greedy.stdout.splitlines() == pretrained.greedy[1]
    beam = translate(cpp_build, pretrained.art, hf_models.TEST_SENTENCES, "--beam", 4, *common)
    assert beam.returncode == 0, beam.stderr
    assert beam.stdout.splitlines() == pretrained.beam[1]
    bad = translate(cpp_build, pretrained.art, ["hello"], "--tgt-lang", "xx", *langs[:2] if "src_lang" in
                    pretrained.langs else [])
    assert bad.returncode == 1 and "unknown target language 'xx'" in bad.stderr


# Decoding sections of a transformers model's generation config, each of which decodes the session's M2M100 model
# (its target language forced after a start token that is eos) otherwise than without its setting
# (tests/guarantees/test_pretrained.py's GENERATION).
GENERATE_DECODING = [
    {"beam_size": 5, "beam_stop": "transformers_early", "max_new_tokens": 20},
    {"beam_size": 4, "beam_stop": "transformers_never", "length_penalty": 3.0, "max_new_tokens": 40},
    {"beam_size": 4, "beam_stop": "transformers", "no_repeat_ngram_size": 1, "max_new_tokens": 20},
    {"no_repeat_ngram_size": 1, "max_new_tokens": 20},
]


@pytest.mark.parametrize("pretrained", ["m2m100"], indirect=True)
def test_cpp_decodes_with_generates_decoding_defaults_as_python_does(cpp_build, pretrained, tmp_path):
    """A manifest's decoding section as an import records a generation config's early_stopping (true, "never"),
    length_penalty and no_repeat_ngram_size: twostep-translate with no decoding flags gives the Python runtime's
    text on the same artifact, and `--no-repeat-ngram-size 0 --beam-stop transformers` what Python gives with
    those options."""
    import json

    import hf_models

    langs = ["--src-lang", pretrained.langs["src_lang"], "--tgt-lang", pretrained.langs["tgt_lang"]]
    art = tmp_path / "art"
    shutil.copytree(pretrained.art, art)
    manifest = json.loads((art / "manifest.json").read_text())
    for decoding in GENERATE_DECODING:
        (art / "manifest.json").write_text(json.dumps({**manifest, "decoding": decoding}))
        translator, backend = open_translator(art)
        with backend:
            want = translator.translate(hf_models.TEST_SENTENCES, **pretrained.langs)
            plain = translator.translate(hf_models.TEST_SENTENCES, translator.options_with(
                no_repeat_ngram_size=0, beam_stop="transformers"), **pretrained.langs)
        got = translate(cpp_build, art, hf_models.TEST_SENTENCES, *langs)
        assert got.returncode == 0, got.stderr
        assert_same(f"{decoding}", want, got.stdout.splitlines())
        undone = translate(cpp_build, art, hf_models.TEST_SENTENCES, *langs, "--no-repeat-ngram-size", 0,
                           "--beam-stop", "transformers")
        assert undone.returncode == 0, undone.stderr
        assert_same(f"{decoding} undone", plain, undone.stdout.splitlines())


def test_cpp_takes_standard_language_codes_as_python_does(cpp_build, pretrained):
    """fr, fra, fre, fr-FR, FR (and en-US for the source) translate as the model's own code (NLLB's fra_Latn,
    mBART-50's fr_XX, Marian's fra) through the manifest's aliases; xx is refused with Languages.pick's message.
    A tokenizer.json-only artifact takes ids: its forced target tokens follow the code the same way. MADLAD's source
    languages have no tokens: en-US is taken and adds none."""
    import hf_models
    from conftest import NEW_TOKENS
    from twostep.artifact import load_artifact
    from twostep.errors import BadInput

    if "tgt_lang" not in pretrained.langs:
        pytest.skip(f"{pretrained.name} has no target languages")
    languages = load_artifact(pretrained.art).manifest.tokenizer.languages
    lines, args = hf_models.TEST_SENTENCES, ["--max-new-tokens", NEW_TOKENS]
    if not pretrained.text_in_cpp:
        from twostep.model.checkpoint import read_tokenizer
        from twostep.runtime.tokenizer import Tokenizer

        tokenizer = Tokenizer.load(pretrained.ckpt, read_tokenizer(pretrained.ckpt))
        lines = [" ".join(map(str, tokenizer.encode_source(s, **pretrained.langs))) for s in lines]
        args.append("--ids")
    elif "src_lang" in pretrained.langs or (languages.source and not any(languages.source.values())):
        args += ["--src-lang", "en-US"]
    want = translate(cpp_build, pretrained.art, lines, *args, "--tgt-lang", pretrained.langs["tgt_lang"])
    assert want.returncode == 0, want.stderr
    assert want.stdout.splitlines() == (pretrained.greedy[1] if pretrained.text_in_cpp else ids_lines(
        pretrained.greedy[0]))
    for code in ("fr", "fra", "fre", "fr-FR", "FR", "fr_CA"):
        got = translate(cpp_build, pretrained.art, lines, *args, "--tgt-lang", code)
        assert got.returncode == 0, f"{code}: {got.stderr}"
        assert got.stdout == want.stdout, code
    with pytest.raises(BadInput) as python:
        languages.pick("target", "xx")
    bad = translate(cpp_build, pretrained.art, lines[:1], *args, "--tgt-lang", "xx")
    assert bad.returncode == 1 and str(python.value) in bad.stderr, bad.stderr


@pytest.mark.parametrize("beam", [1, 4])
def test_cpp_streams_pretrained_families_as_it_translates(cpp_build, pretrained, beam):
    """--stream on each family (forced target-language tokens, decoding from pad, never-generated ids): each
    sentence's deltas joined are what twostep-translate prints without --stream; NLLB with a tokenizer.json
    alone streams token ids, its last ones those of the unstreamed run."""
    import hf_models
    from conftest import NEW_TOKENS

    langs = [arg for key, flag in (("src_lang", "--src-lang"), ("tgt_lang", "--tgt-lang"))
             if key in pretrained.langs for arg in (flag, pretrained.langs[key])]
    args = ["--max-new-tokens", NEW_TOKENS, "--beam", beam, "--beam-stop", "transformers"]
    sentences = hf_models.TEST_SENTENCES
    if not pretrained.text_in_cpp:
        from twostep.model.checkpoint import read_tokenizer
        from twostep.runtime.tokenizer import Tokenizer

        tokenizer = Tokenizer.load(pretrained.ckpt, read_tokenizer(pretrained.ckpt))
        ids = [" ".join(map(str, tokenizer.encode_source(s, **pretrained.langs))) for s in sentences]
        args += ["--ids", "--tgt-lang", pretrained.langs["tgt_lang"]]
        plain = translate(cpp_build, pretrained.art, ids, *args)
        assert plain.returncode == 0, plain.stderr
        final = streamed(stream_cpp(cpp_build, pretrained.art, ids, *args), len(ids), key="tokens")
        assert_same("streamed ids", plain.stdout.splitlines(), ids_lines(final))
        return
    plain = translate(cpp_build, pretrained.art, sentences, *args, *langs)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == (pretrained.greedy if beam == 1 else pretrained.beam)[1]
    events = stream_cpp(cpp_build, pretrained.art, sentences, *args, *langs)
    assert_same("streamed text", plain.stdout.splitlines(), streamed(events, len(sentences)))


# The sentences tests/model/test_ct2.py decodes its CTranslate2 imports on.
CT2_SENTENCES = ["the dog sat in the garden", "a dog ran over the mat", "good dog"]


@pytest.mark.parametrize("flags", [(), ("--beam", 1), ("--keep-unknowns",)],
                         ids=["argos-defaults", "greedy", "keep-unknowns"])
def test_cpp_decodes_an_argos_package_as_python_does(cpp_build, argos_artifact, ct2_models, flags):
    """An artifact imported from an Argos Translate package (the session's argos_artifact): without flags both take
    its manifest's decoding defaults (beam 4, length_penalty 0.2, CTranslate2's beam rule, min_new_tokens 1, at most
    256 tokens, replace_unknowns), with --beam 1 greedy over the rest of them; the same tokens and scores, and text
    joined as argostranslate joins it (detokenize "argos"), each <unk> replaced by the source piece the alignment
    weighs most, as argostranslate's own text has it; with --keep-unknowns both leave the <unk> out of the text."""
    import hf_models
    from ct2_models import argos_reference
    from twostep.artifact import load_artifact

    decoding = load_artifact(argos_artifact).manifest.decoding
    assert decoding["beam_stop"] == "ctranslate2" and decoding["replace_unknowns"] is True
    sentences = hf_models.TEST_SENTENCES + CT2_SENTENCES
    options = {"beam_size": 1} if "--beam" in flags else {"replace_unknowns": False} if flags else None
    translator, backend = open_translator(argos_artifact, "ort-cpu", options=options)
    assert translator.options.beam_size == (1 if "--beam" in flags else 4) and translator.options.min_new_tokens == 1
    assert translator.options.replace_unknowns == ("--keep-unknowns" not in flags)
    with backend:
        py_text = translator.translate(sentences)
        sources = translator.encode(sentences)
        python = translator.decode_ids(sources)
    assert len(set(py_text)) >= 4, py_text  # the outputs vary with the input
    unk = translator.limits.specials.unk_id
    unknown = [i for i, hyps in enumerate(python) if unk in hyps[0].tokens]
    assert unknown, [translator.tokenizer.decode(h[0].tokens) for h in python]  # "dog" says <unk>
    replaced = [i for i in unknown if python[i][0].replacements]
    assert replaced == (unknown if translator.options.replace_unknowns else []), python
    assert all(py_text[i] == translator.tokenizer.decode(python[i][0].tokens) for i in set(range(len(sentences))) -
               set(replaced))  # only the replaced texts differ from the plain decode

    text = translate(cpp_build, argos_artifact, sentences, *flags)
    assert text.returncode == 0, text.stderr
    assert_same("text", py_text, text.stdout.splitlines())
    if not flags:  # argostranslate's own text, replacements and all
        assert_same("text", [t for t, _ in argos_reference(ct2_models.argos_dir, sentences)], py_text)
    proc = translate(cpp_build, argos_artifact, ids_lines(sources), "--ids", "--scores", *flags)
    assert proc.returncode == 0, proc.stderr
    cpp = [line.split(" ", 1) + [""] for line in proc.stdout.splitlines()]
    assert_same("ids", [" ".join(map(str, hyps[0].tokens)) for hyps in python], [c[1] for c in cpp])
    if not flags:
        assert [float(c[0]) for c in cpp] == pytest.approx([hyps[0].score for hyps in python], rel=1e-6, abs=1e-6)


def test_cpp_refuses_a_bad_decoding_section_and_detokenize_as_one_line(cpp_build, argos_artifact, tmp_path):
    """A manifest's decoding section with a value Python's DecodeOptions refuses, or an unknown detokenize: one
    line, exit 1, nothing printed."""
    import json

    for name, change, message in (
            ("decoding", lambda m: m["decoding"].update(beam_stop="fairseq"),
             "decoding: bad decoding options: beam_stop must be one of n_best, transformers, transformers_early, "
             "transformers_never, ctranslate2"),
            ("detokenize", lambda m: m["tokenizer"].update(detokenize="moses"),
             "detokenize 'moses' is not one of sentencepiece, argos")):
        art = tmp_path / name
        shutil.copytree(argos_artifact, art)
        manifest = json.loads((art / "manifest.json").read_text())
        change(manifest)
        (art / "manifest.json").write_text(json.dumps(manifest))
        proc = translate(cpp_build, art, ["good dog"])
        assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
        assert message in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr


# tests/model/test_argos.py's OPUS_MT_SENTENCES: Moses' escapes and BPE's "@@" pieces among their ids.
BPE_SENTENCES = ["the cat's hat is on the mat.", "a dog ran in the park, today!", "hello world?",
                 "the quick brown fox & the lazy dog.", 'good morning, "friend".', "zebra xylophone!"]


@pytest.mark.parametrize("flags", [(), ("--beam", 1)], ids=["argos-defaults", "greedy"])
def test_cpp_decodes_the_ids_of_a_moses_bpe_package_as_python_does(cpp_build, opus_mt_bpe_artifact, flags):
    """An OPUS-MT bpe.model package (tokenizer kind moses-bpe) loads in C++, and the ids Python's tokenizer gives
    decode to Python's tokens and scores: with the manifest's decoding defaults (beam 4), and greedy."""
    translator, backend = open_translator(opus_mt_bpe_artifact, "ort-cpu",
                                          options={"beam_size": 1} if flags else None)
    assert translator.tokenizer.spec.kind == "moses-bpe"
    assert translator.options.beam_size == (1 if flags else 4)
    with backend:
        sources = translator.encode(BPE_SENTENCES)
        python = translator.decode_ids(sources)
    assert len({tuple(hyps[0].tokens) for hyps in python}) >= 3, python  # the outputs vary with the input
    proc = translate(cpp_build, opus_mt_bpe_artifact, ids_lines(sources), "--ids", "--scores", *flags)
    assert proc.returncode == 0, proc.stderr
    cpp = [line.split(" ", 1) + [""] for line in proc.stdout.splitlines()]
    assert_same("ids", [" ".join(map(str, hyps[0].tokens)) for hyps in python], [c[1] for c in cpp])
    assert [float(c[0]) for c in cpp] == pytest.approx([hyps[0].score for hyps in python], rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("flags", [(), ("--stream",)], ids=["text", "stream"])
def test_cpp_refuses_text_for_a_moses_bpe_package_with_one_line(cpp_build, opus_mt_bpe_artifact, flags):
    """Text in C++ for a moses-bpe artifact: no Moses tokenizer there, so one line saying what to do instead,
    exit 1, nothing printed (the artifact itself loads: the test above decodes its ids)."""
    proc = translate(cpp_build, opus_mt_bpe_artifact, ["hello world?"], *flags)
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
    assert proc.stderr == ("error: tokenizer kind 'moses-bpe' (Moses tokenization + BPE codes) has no C++ "
                           "implementation: pass token ids (translate_ids; twostep-translate --ids), or translate "
                           "text with the Python runtime (twostep translate, twostep serve)\n")


def random_terms(rng, ids: list[int]) -> list:
    """A sentence's terms: 1-3 of them, each 1-2 sequences of 1-3 ids drawn from `ids`."""
    return [[rng.choice(ids, int(rng.integers(1, 4))).tolist() for _ in range(int(rng.integers(1, 3)))]
            for _ in range(int(rng.integers(1, 4)))]


def hypotheses(proc: subprocess.CompletedProcess) -> list[list[tuple[list[int], float, list[int]]]]:
    """twostep-translate --ids --scores --unmet: each sentence's hypotheses, (tokens, score, unmet terms)."""
    assert proc.returncode == 0, proc.stderr
    out = []
    for line in proc.stdout.splitlines():
        hyps = []
        for h in line.split("\t"):
            score, unmet, tokens = (h.split(" ", 2) + [""])[:3]
            hyps.append(([int(t) for t in tokens.split()], float(score), json.loads(unmet)))
        out.append(hyps)
    return out


@pytest.mark.parametrize("model, beam, n_best, max_new_tokens", [
    ("tiny", 1, 1, 0), ("tiny", 4, 3, 0), ("tiny", 4, 2, 5), ("demo", 1, 1, 0), ("demo", 4, 2, 0),
])
def test_cpp_decodes_constrained_sentences_as_python_does(cpp_build, tiny_artifact, demo_artifact, test_sentences,
                                                          tmp_path, model, beam, n_best, max_new_tokens):
    """--constraints (DecodeOptions::constraints): on random terms, sentences of several lengths in two batches,
    a third of them unconstrained, C++ gives each sentence Python's Translator.decode_ids(constraints=)
    hypotheses, in the same order, with their unmet terms and scores; the demo's terms are pieces of other
    sentences' translations (words the model can say), the tiny model's any ids, some out of reach of a short
    limit."""
    rng = np.random.default_rng(beam * 10 + n_best + max_new_tokens)
    if model == "tiny":
        art = tiny_artifact[0]
        sources = [rng.integers(4, 50, int(n)).tolist() + [3] for n in rng.integers(0, 20, 40)]
    else:
        art = demo_artifact
    options = DecodeOptions(beam_size=beam, n_best=n_best, max_new_tokens=max_new_tokens or None)
    translator, backend = open_translator(art, "ort-cpu", options=options)
    with backend:
        if model == "demo":
            sources = translator.encode(test_sentences[:40])
            ids = sorted({t for tokens in translator.translate_ids(sources[::-1]) for t in tokens})
        else:
            ids = list(range(4, 60))
        terms = [random_terms(rng, ids) if i % 3 else [] for i in range(len(sources))]
        plain = translator.decode_ids(sources)
        python = translator.decode_ids(sources, constraints=[Constraints.of(t) if t else None for t in terms])
    unconstrained = [i for i, t in enumerate(terms) if not t]
    assert [python[i][0].tokens for i in unconstrained] == [plain[i][0].tokens for i in unconstrained]
    file = tmp_path / "constraints.jsonl"
    file.write_text("".join(json.dumps(t) + "\n" for t in terms))
    args = ["--ids", "--scores", "--unmet", "--beam", beam, "--n-best", n_best, "--max-new-tokens", max_new_tokens,
            "--constraints", file]
    cpp = hypotheses(translate(cpp_build, art, ids_lines(sources), *args))
    assert_same("constrained hypotheses", [[(h.tokens, list(h.unmet)) for h in hyps] for hyps in python],
                [[(tokens, unmet) for tokens, _, unmet in hyps] for hyps in cpp])
    # ONNX Runtime's GEMMs see other batch sizes than Python's (the constrained sentences decode apart): the
    # scores agree to float32 noise, the tokens exactly
    for hyps, line in zip(python, cpp):
        assert [score for _, score, _ in line] == pytest.approx([h.score for h in hyps], rel=1e-6, abs=1e-6)
    constrained = [i for i, t in enumerate(terms) if t]
    assert any(python[i][0].tokens != plain[i][0].tokens for i in constrained)  # the terms changed something
    assert any(not python[i][0].unmet for i in constrained)
    if max_new_tokens:
        assert any(h.unmet for i in constrained for h in python[i])
    for i in constrained:
        assert len(python[i]) == n_best


def test_cpp_refuses_bad_constraints_with_one_line(cpp_build, tiny_artifact, tmp_path):
    """An empty term or sequence, too many terms, an id outside the vocabulary, a line that is not terms, a count
    that is not the sentences', a model whose decoding samples: one line, exit 1 (Python's words where it has
    them)."""
    art = tiny_artifact[0]
    file = tmp_path / "constraints.jsonl"

    def run(lines: list[str], artifact: Path = art) -> subprocess.CompletedProcess:
        file.write_text("".join(line + "\n" for line in lines))
        return translate(cpp_build, artifact, ["7 8 9 3", "5 6 3"], "--ids", "--constraints", file)

    for terms, python in [([[[]]], True), ([[]], True), ([[[7]]] * 33, True), ([[[7, 60]]], False)]:
        if python:
            with pytest.raises(BadInput) as refused:
                Constraints.of(terms)
            message = f"sentence 2: {refused.value}"
        else:
            message = "sentence 2: a constraint has token id 60, outside the target vocabulary [0, 60)"
        proc = run(["[]", json.dumps(terms)])
        assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", f"error: {message}\n"), terms
    proc = run(["[[[7]]]", "[[7]]"])
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (f"error: --constraints {file} line 2: expected a list of terms, each a list of token-id "
                           "lists ([[[12, 7], [30]], [[25]]])\n")
    proc = run(["[[[7]]]"])
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", f"error: --constraints {file}: 1 lines for 2 "
                                                                   "sentences\n")
    sampling = tmp_path / "sampling"
    shutil.copytree(art, sampling)
    manifest = json.loads((sampling / "manifest.json").read_text())
    (sampling / "manifest.json").write_text(json.dumps({**manifest, "decoding": {"sampling": True}}))
    translator, backend = open_translator(sampling, "ort-cpu")
    with backend, pytest.raises(BadInput, match="not sampling"):
        translator.decode_ids([[7, 8, 9, 3]], constraints=[Constraints.of([[[7]]])])
    proc = run(["[]", "[[[7]]]"], sampling)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.startswith("error: a glossary or constraints need beam search or greedy decoding, not "
                                  "sampling") and proc.stderr.count("\n") == 1
