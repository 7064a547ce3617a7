"""What a first run on a GPU would break, held on the CPU (issue 10): TF32, one engine profile derived from the
model, rows beyond the profile, ort-trt that silently is CUDA or opens an engine cache twostep did not record,
per-graph TensorRT provider options, the reorder Gather's IR version, beam reorder work, empty-tensor
addresses, threads on one trt backend, stream order, install order.

TensorRT itself is replaced by tests/fake_tensorrt.py: it records flags, profiles, addresses and the stream
of each enqueue, returns False from set_input_shape outside the profile like TensorRT, refuses a second thread
inside one execution context's call, and runs each engine's graph with ONNX Runtime on the CPU at the
addresses it is given, so the trt backend's own binding code decodes real tokens here. ONNX Runtime's GPU
providers are checked where their options arrive: a spy on `onnxruntime.InferenceSession` (`opened`).
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from search import SPECIALS, beam_search, greedy
from twostep.artifact import load_artifact, record_ledger
from twostep.errors import BackendUnavailable, BadArtifact, BadInput
from twostep.runtime import backends, decoding
from twostep.runtime.backends.ort import OrtBackend, OrtTrtBackend
from twostep.runtime.backends.profile import Profile

COMMON = dict(specials=SPECIALS)
SOURCES = [[5, 9, 13, 7, 3], [11, 3], [8, 8, 21, 33, 40, 12, 6, 3]]


@pytest.fixture()
def fake_trt(monkeypatch):
    """The stand-in TensorRT, with its stand-in CUDA stream in place of torch's."""
    import torch

    import fake_tensorrt
    from twostep.runtime.backends import trt

    fake_tensorrt.calls.clear()
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt)
    monkeypatch.setattr(trt, "gpu_name", lambda: "Fake GPU 80GB")
    monkeypatch.setattr(trt.TrtBackend, "device", "cpu")
    monkeypatch.setattr(trt.TrtBackend, "unavailable", classmethod(lambda cls: None))
    monkeypatch.setattr(trt.TrtBackend, "new_stream", lambda self: fake_tensorrt.Stream())
    monkeypatch.setattr(torch.cuda, "stream", fake_tensorrt.stream)
    return fake_tensorrt


@pytest.fixture()
def opened(monkeypatch):
    """Each ONNX Runtime session opened from here on: (the graph file's name, or an array graph's kind, and
    the providers it was asked for as [(name, options)]). Each opens for real on the CPU provider; ONNX
    Runtime lists the GPU providers as available."""
    real = ort.InferenceSession
    sessions: list[tuple[str, list]] = []

    def spy(model, sess_options=None, providers=None, provider_options=None, **kwargs):
        asked = [(p, {}) if isinstance(p, str) else (p[0], dict(p[1])) for p in providers or []]
        if provider_options is not None:
            asked = [(name, dict(options)) for (name, _), options in zip(asked, provider_options)]
        what = Path(model).name if isinstance(model, (str, Path)) else onnx.load_from_string(model).graph.name
        sessions.append((what, asked))
        return real(model, sess_options, providers=["CPUExecutionProvider"], **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", spy)
    monkeypatch.setattr(ort, "get_available_providers", lambda: [
        "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    return sessions


def graph_sessions(opened) -> dict[str, list]:
    return {what: providers for what, providers in opened if what.endswith(".onnx")}


def array_sessions(opened) -> list[tuple[str, list]]:
    return [(what, providers) for what, providers in opened if not what.endswith(".onnx")]


@pytest.fixture()
def demo_copy(demo_artifact, tmp_path):
    """Engines are written into the artifact: each test gets its own copy."""
    return shutil.copytree(demo_artifact, tmp_path / "art")


def builds(fake) -> list[dict]:
    return [c[1] for c in fake.calls if c[0] == "build"]


# -- 1. TF32 ------------------------------------------------------------------------------------------------
def test_fp32_engines_build_with_tf32_off_and_tf32_is_an_opt_in_precision(fake_trt, demo_copy):
    from twostep.runtime.backends.trt import TrtBackend

    artifact = load_artifact(demo_copy)
    with TrtBackend(artifact) as fp32:
        assert fp32.precision == "fp32"
        plain = fp32.engine_paths()
    assert [b["flags"] for b in builds(fake_trt)] == [[], []]  # TF32 cleared on both graphs
    fake_trt.calls.clear()
    with TrtBackend(artifact, tf32=True) as tf32:
        assert tf32.precision == "tf32"
        opted = tf32.engine_paths()
    assert [b["flags"] for b in builds(fake_trt)] == [["TF32"], ["TF32"]]
    assert set(plain.values()).isdisjoint(opted.values())  # precision is in the cache key
    records = [json.loads(p.with_suffix(".json").read_text())["precision"] for p in opted.values()]
    assert records == ["tf32", "tf32"]


@pytest.mark.parametrize("tf32", [False, True])
def test_onnx_runtime_cuda_sessions_open_with_tf32_off_unless_asked(opened, demo_artifact, tf32):
    """What reaches InferenceSession, for both graphs and for the IO-binding session's array graphs."""
    with backends.create("ort-cuda", artifact=load_artifact(demo_artifact), tf32=tf32) as backend:
        assert backend.precision == ("tf32" if tf32 else "fp32")
        backend.session()
    cuda = ("CUDAExecutionProvider", {"use_tf32": "1" if tf32 else "0"})
    assert graph_sessions(opened) == {"encoder.onnx": [cuda, ("CPUExecutionProvider", {})],
                                      "decoder.onnx": [cuda, ("CPUExecutionProvider", {})]}
    arrays = array_sessions(opened)
    assert sorted(what for what, _ in arrays) == ["pad", "pad", "put", "put", "take", "take"]  # float32, int64
    assert all(providers == [cuda] for _, providers in arrays)
    # ORT's TensorRT provider has no TF32 switch, so its fp32 runs are held to the tf32 tolerances
    assert OrtTrtBackend(load_artifact(demo_artifact)).precision == "tf32"


# -- 2. One profile, derived once ---------------------------------------------------------------------------
def corner_feeds(artifact, profile: Profile, k: int) -> dict[str, dict[str, np.ndarray]]:
    """Inputs of both graphs at corner k (0 min, 1 opt, 2 max) of the profile, with valid values."""
    c, rng = artifact.config, np.random.default_rng(k)
    feeds = {}
    for graph, spec in artifact.graphs.items():
        feeds[graph] = {}
        for t in spec.inputs:
            shape = profile.shapes(t.shape)[k]
            if t.dtype == "int64" and t.name == "input_ids":
                vocab = c.src_vocab_size if graph == "encoder" else c.tgt_vocab_size
                feeds[graph][t.name] = rng.integers(4, vocab, shape, dtype=np.int64)
            elif t.dtype == "int64":
                feeds[graph][t.name] = np.ones(shape, np.int64)
            else:
                feeds[graph][t.name] = rng.standard_normal(shape).astype(t.dtype)
    return feeds


def run_corners(art_dir) -> Profile:
    artifact = load_artifact(art_dir)
    profile = Profile.derive(artifact.config)
    batch_axes = {"min": 0, "opt": 1, "max": 2}
    low, opt, high = (profile.axis(a) for a in ("past_len", "new_len", "batch"))
    assert low[2] + opt[2] <= artifact.config.max_positions  # past + new at the max corner
    sessions = {g: ort.InferenceSession(str(artifact.graph_file(g)), providers=["CPUExecutionProvider"])
                for g in artifact.graphs}
    for corner, k in batch_axes.items():
        for graph, feeds in corner_feeds(artifact, profile, k).items():
            out = sessions[graph].run(None, feeds)
            assert all(np.isfinite(o).all() for o in out), (graph, corner)
    return profile


@pytest.mark.parametrize("preset", ["tiny", "demo"])
def test_every_profile_corner_runs_on_the_real_graphs(preset, tiny_artifact, demo_artifact):
    art = tiny_artifact[0] if preset == "tiny" else demo_artifact
    profile = run_corners(art)
    config = load_artifact(art).config
    assert profile.max_new_tokens + profile.max_new_len - 1 <= config.max_positions
    assert profile.axis("past_len")[1] <= profile.axis("past_len")[2]


@pytest.mark.slow
def test_every_profile_corner_runs_on_the_base_preset(base_export):
    profile = run_corners(base_export.path)
    assert (profile.max_batch, profile.max_src_len, profile.max_new_tokens) == (64, 256, 256)


def test_build_engine_writes_the_engines_the_backend_reuses(fake_trt, demo_copy):
    from typer.testing import CliRunner

    from twostep.cli import app
    from twostep.runtime.backends.trt import TrtBackend

    result = CliRunner().invoke(app, ["build-engine", str(demo_copy), "--max-batch", "8"])  # below the default
    assert result.exit_code == 0, result.output
    written = dict(line.split(": ", 1) for line in result.stdout.split("\n") if line.strip())
    assert len(builds(fake_trt)) == 2
    with TrtBackend(load_artifact(demo_copy)) as backend:
        assert {g: str(p) for g, p in backend.engine_paths().items()} == written
        assert len(builds(fake_trt)) == 2  # found in the cache, not built again
    # ort-trt asks ONNX Runtime's TensorRT provider for the same profile
    options = OrtTrtBackend(load_artifact(demo_copy)).trt_options("decoder")
    built = builds(fake_trt)[1]["profile"]
    assert options["trt_profile_max_shapes"] == ",".join(
        f"{name}:" + "x".join(map(str, shapes[2])) for name, shapes in built.items())


# -- 3. Rows beyond the profile ----------------------------------------------------------------------------
def test_a_shape_tensorrt_refuses_is_a_bad_input_naming_axis_value_and_max(fake_trt, demo_copy):
    from twostep.runtime.backends.trt import TrtBackend

    artifact = load_artifact(demo_copy)
    with TrtBackend(artifact, profile=Profile.derive(artifact.config, rows=4)) as backend:
        feeds = {"input_ids": np.full((5, 3), 7, np.int64), "attention_mask": np.ones((5, 3), np.int64)}
        inputs = {k: backend.torch.from_numpy(v) for k, v in feeds.items()}
        with pytest.raises(BadInput, match=r"encoder.input_ids: batch 5 is outside the engine profile \(1..4\)"):
            backend.execute("encoder", inputs)  # set_input_shape said False: checked, not ignored
        assert ("set_input_shape", "input_ids", (5, 3)) in fake_trt.calls
        with pytest.raises(BadInput, match=r"batch 8 is outside the engine profile \(1..4\).*--max-batch"):
            beam_search(backend.session(), SOURCES[:2], beam_size=4, max_new_tokens=5, **COMMON)


def test_verify_bench_and_translate_size_the_profile_for_batch_times_beam(fake_trt, demo_copy, demo_model_dir):
    from twostep.bench import Workload, run_backend
    from twostep.runtime.translator import open_translator
    from twostep.verify import verify

    config = load_artifact(demo_copy).config
    assert backends.workload_options("trt", config, rows=8) == {"profile": Profile.derive(config)}  # reuse
    assert backends.workload_options("ort-trt", config, rows=128)["profile"].max_batch == 128
    assert backends.workload_options("ort-cpu", config, rows=128) == {}

    report = verify(demo_copy, demo_model_dir, "trt", beam_size=4, batch_size=32, limit=40)
    assert report.ok, [s.to_dict() for s in report.sequences]
    assert [b["profile"]["input_ids"][2][0] for b in builds(fake_trt)] == [128, 128]  # 32 x 4 rows
    translator, backend = open_translator(demo_copy, "trt", batch_size=20,
                                          options=decoding.DecodeOptions(beam_size=4))
    assert backend.profile.max_batch == 80
    assert translator.translate(["seven hundred and two"]) == ["siebenhundertzwei"]
    results = run_backend("trt", demo_copy, None, [Workload(batch=24, new_tokens=4, beam=4)], 0, 1, None)
    assert [r.error for r in results] == [None]


def test_a_decode_longer_than_the_profile_is_a_bad_input_not_a_shorter_translation(fake_trt, demo_copy):
    from twostep.runtime.translator import open_translator

    translator, backend = open_translator(demo_copy, "trt")
    with backend:
        assert backend.target_positions == 125 < backend.config.max_positions  # 128 - 4 + 1: a 4-token step fits
        assert translator.translate_ids([[7, 3]]) == [translator.translate_ids([[7, 3]])[0]]  # short: fine
        with pytest.raises(BadInput, match=r"decoding up to 128 target positions, but the engine profile holds 125"):
            translator.translate_ids([[7] * 59 + [3]])  # 2 x 60 + 16 = 136, capped by max_positions 128
        with pytest.raises(BadInput, match="build-engine --max-new-tokens 126"):
            translator.decode_ids([[7, 3]], decoding.DecodeOptions(max_new_tokens=126))


# -- 4. ort-trt is TensorRT or nothing ---------------------------------------------------------------------
def test_ort_trt_that_falls_back_to_cuda_is_unavailable(demo_copy, monkeypatch):
    # get_available_providers() lists TensorRT even without its libraries; the session then quietly runs on
    # the next provider. Here, as on such a machine: the provider is "available" but the session is CPU.
    monkeypatch.setattr(OrtTrtBackend, "unavailable", classmethod(lambda cls: None))
    with pytest.warns(UserWarning), pytest.raises(
            BackendUnavailable, match=r"did not start its TensorRT provider for encoder.onnx.*CPUExecutionProvider"):
        backends.create("ort-trt", artifact=load_artifact(demo_copy))


def test_ort_trt_refuses_an_engine_cache_it_did_not_record_before_onnx_runtime_opens_it(opened, demo_copy):
    """ONNX Runtime's TensorRT provider deserializes whatever engines its cache directory holds: one that
    twostep did not record (planted, or changed since) is refused at load, before any session opens it, and
    the refusal records nothing, so the next load refuses it too."""
    artifact = load_artifact(demo_copy)
    cache, ledger = demo_copy / "engines" / "ort-trt", demo_copy / "engines" / "ort-trt.sha256.json"
    cache.mkdir(parents=True, exist_ok=True)
    planted = cache / "TensorrtExecutionProvider_TRTKernel_graph_main_0_0.engine"
    planted.write_bytes(b"an engine twostep did not build")
    for attempt in range(2):
        with pytest.raises(BadArtifact) as refused:
            backends.create("ort-trt", artifact=artifact)
        assert str(refused.value) == (f"{planted}: not in ort-trt.sha256.json with this sha256 (the engine cache "
                                      "holds a file that twostep did not record, or it changed); delete "
                                      f"{cache} to rebuild"), attempt
        assert opened == [] and not ledger.exists(), attempt
    record_ledger(cache)  # as after a run in which ONNX Runtime built it
    with pytest.raises(BackendUnavailable):  # past the ledger: the sessions open (on the CPU here)
        backends.create("ort-trt", artifact=artifact)
    assert set(graph_sessions(opened)) == {"encoder.onnx", "decoder.onnx"}
    opened.clear()
    planted.write_bytes(b"the same name, changed since it was recorded")
    with pytest.raises(BadArtifact, match=r"TRTKernel_graph_main_0_0.engine: not in ort-trt.sha256.json with this"):
        backends.create("ort-trt", artifact=artifact)
    assert opened == []


# -- 5. TensorRT provider options per graph -----------------------------------------------------------------
def test_ort_trt_sessions_open_with_each_graphs_profile_and_the_cache(opened, demo_copy):
    """What reaches InferenceSession: the TensorRT provider with the engine cache and the profile, each graph
    input named once, the CUDA provider with TF32 off after it; the array graphs on the CUDA provider only."""
    from twostep.runtime.backends.iobinding import IoBindingSession

    artifact = load_artifact(demo_copy)
    profile = Profile.derive(artifact.config)
    with pytest.raises(BackendUnavailable, match="did not start its TensorRT provider"):  # CPU here
        backends.create("ort-trt", artifact=artifact)
    cache = demo_copy / "engines" / "ort-trt"
    cuda = ("CUDAExecutionProvider", {"use_tf32": "0"})
    sessions = graph_sessions(opened)
    assert set(sessions) == {"encoder.onnx", "decoder.onnx"}
    for graph, spec in artifact.graphs.items():
        (name, trt), *rest = sessions[f"{graph}.onnx"]
        assert name == "TensorrtExecutionProvider" and rest == [cuda, ("CPUExecutionProvider", {})]
        assert (trt["trt_engine_cache_enable"], trt["trt_engine_cache_path"], trt["trt_fp16_enable"]) == (
            True, str(cache), False)
        for k, key in enumerate(("trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes")):
            entries = [e.split(":") for e in trt[key].split(",")]
            assert [name for name, _ in entries] == spec.input_names  # each input once, this graph's only
            assert [tuple(map(int, dims.split("x"))) for _, dims in entries] == [
                profile.shapes(t.shape)[k] for t in spec.inputs]
    assert cache.is_dir()
    opened.clear()
    IoBindingSession(OrtTrtBackend(artifact), "cuda", profile=profile)  # the ort-trt step session's array graphs
    assert len(opened) == 6 and all(providers == [cuda] for _, providers in array_sessions(opened))  # no TensorRT


# -- 6. The array graphs' IR version ------------------------------------------------------------------------
def test_array_models_are_never_newer_than_the_exported_graphs(demo_artifact, demo_int8):
    from twostep.runtime.backends.iobinding import array_model

    data = np.arange(24).reshape(4, 3, 2)
    for art in (demo_artifact, demo_int8):
        artifact = load_artifact(art)
        graph = onnx.load(str(artifact.graph_file("decoder")), load_external_data=False)
        opset = artifact.manifest.opset
        for dtype in ("float32", "float16", "int64"):
            x = data.astype(dtype)
            cases = {"take": ({"indices": np.array([2, 2, 0]), "starts": np.array([1]), "ends": np.array([3]),
                               "axes": np.array([1])}, x[[2, 2, 0], 1:3]),
                     "pad": ({"pads": np.array([0, 0, 1, 0, 0, 2])}, np.pad(x, [(0, 0), (0, 0), (1, 2)])),
                     "put": ({"indices": np.array([[3], [0]]), "updates": -x[:2]},
                             np.concatenate([-x[1:2], x[1:3], -x[:1]]))}
            for kind, (inputs, want) in cases.items():
                model = onnx.load_from_string(array_model(kind, dtype, opset))
                assert model.ir_version <= graph.ir_version
                assert [o.version for o in model.opset_import] == [opset]
                session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
                (out,) = session.run(None, {"data": x, **inputs})
                np.testing.assert_array_equal(out, want)


# -- 7. Beam reorder work -----------------------------------------------------------------------------------
def test_beam_search_expands_cross_kv_once_then_reorders_only_the_self_cache(demo_artifact):
    from twostep.runtime.backends.iobinding import IoBindingSession

    with OrtBackend(load_artifact(demo_artifact)) as backend:
        layers = backend.config.n_decoder_layers
        bound, runs = IoBindingSession(backend, "cpu"), []
        ops_run = bound.ops.run
        bound.ops.run = lambda kind, x, **inputs: (runs.append(kind), ops_run(kind, x, **inputs))[1]
        reorders = []  # (cache_only, array operations it ran)
        original = bound.reorder

        def reorder(origin, cache_only=False):
            before = len(runs)
            original(origin, cache_only)
            reorders.append((cache_only, len(runs) - before))

        bound.reorder = reorder
        got = beam_search(bound, SOURCES, beam_size=4, max_new_tokens=12, **COMMON)
        assert reorders[0] == (False, 2 * layers + 2 * layers + 1)  # self K/V, cross K/V, mask: expanded once
        assert len(reorders) > 2 and all(r == (True, 2 * layers) for r in reorders[1:])  # then self K/V only

        host = backend.session()
        cross = {}
        original_step = host.step

        def step(tokens):
            tensors = host.rows.tensors
            cross.setdefault("first", {k: v for k, v in tensors.items() if "cross" in k or "mask" in k})
            assert all(tensors[k] is v for k, v in cross["first"].items())  # never copied again
            return original_step(tokens)

        host.step = step
        want = beam_search(host, SOURCES, beam_size=4, max_new_tokens=12, **COMMON)
    assert [[h.tokens for h in x] for x in got] == [[h.tokens for h in x] for x in want]


# -- 8. Distinct addresses for empty tensors; max_positions in the trt step ---------------------------------
def test_empty_tensors_get_distinct_non_null_addresses(fake_trt, demo_copy):
    from twostep.runtime.backends.trt import TrtBackend

    with TrtBackend(load_artifact(demo_copy)) as backend, OrtBackend(load_artifact(demo_copy)) as cpu:
        got = greedy(backend.session(), SOURCES, max_new_tokens=12, **COMMON)
        assert got == greedy(cpu.session(), SOURCES, max_new_tokens=12, **COMMON)
    first_step = next(c[2] for c in fake_trt.calls if c[0] == "execute" and c[1].endswith("decoder.onnx"))
    assert all(first_step.values()), "a null address"
    assert len(set(first_step.values())) == len(first_step), "two tensors share an address"


def test_trt_step_stops_at_max_positions_like_the_host_session(fake_trt, demo_copy):
    from twostep.runtime.backends.trt import TrtBackend

    artifact = load_artifact(demo_copy)
    loose = Profile(max_batch=4, opt_batch=1, max_src_len=16, opt_src_len=8, max_new_tokens=10_000,
                    opt_past_len=4, max_new_len=4)  # a profile that would not stop it
    with TrtBackend(artifact, profile=loose) as backend:
        session = backend.session()
        session.start(np.array([[5, 6, 3]]), np.ones((1, 3), np.int64))
        session.rows.lengths[:] = artifact.config.max_positions - 1  # a history that long, as if decoded
        with pytest.raises(BadInput, match=r"decoding past max_positions 128"):
            session.step(np.array([[4, 4]]))


# -- 9. Threads on one trt backend ---------------------------------------------------------------------------
def test_trt_threads_take_turns_on_each_execution_context(fake_trt, demo_copy):
    """docs/guarantees.md "Threads": Backend.run and step sessions from many threads on one trt backend give
    what they give alone. An execution context holds one call's shapes and addresses from set_input_shape to
    the enqueue; the stand-in refuses a second thread in between (TensorRT would mix the two calls)."""
    from twostep.runtime.backends.trt import TrtBackend

    rng = np.random.default_rng(0)
    feeds = [{"input_ids": rng.integers(4, 200, (b, s)), "attention_mask": np.ones((b, s), np.int64)}
             for b, s in [(1, 3), (2, 9), (3, 5), (4, 2)]]
    with TrtBackend(load_artifact(demo_copy)) as backend:
        alone = [(backend.run("encoder", f), greedy(backend.session(), SOURCES[i % 3:], max_new_tokens=6, **COMMON))
                 for i, f in enumerate(feeds)]
        together, errors = {}, []

        def work(i: int) -> None:
            try:
                together[i] = (backend.run("encoder", feeds[i]),
                               greedy(backend.session(), SOURCES[i % 3:], max_new_tokens=6, **COMMON))
            except Exception as exc:  # reported below, with the thread's index
                errors.append((i, repr(exc)))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(feeds))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert [c for c in fake_trt.calls if c[0] == "overlap"] == [] and errors == []
    assert len(together) == len(feeds)
    for i, (encoded, tokens) in enumerate(alone):
        got_encoded, got_tokens = together[i]
        assert got_tokens == tokens, i
        assert encoded.keys() == got_encoded.keys() and all(np.array_equal(encoded[k], got_encoded[k]) for k in encoded)


# -- 10. Stream order -----------------------------------------------------------------------------------------
def device_work(backend, session) -> list[tuple[str, object]]:
    """From here on, each device copy (upload, download), allocation (empty) and row move (take, pad, put) of
    the backend and the session, with the stream that was current when it ran."""
    import fake_tensorrt

    work = []

    def watch(owner, name: str) -> None:
        original = getattr(owner, name)

        def call(*args, **kwargs):
            work.append((name, fake_tensorrt.current_stream()))
            return original(*args, **kwargs)

        setattr(owner, name, call)

    for name in ("upload", "download", "empty"):
        watch(backend, name)
    for name in ("take", "pad", "put"):
        watch(session.rows.ops, name)
    return work


def test_every_device_copy_of_the_trt_backend_runs_on_its_stream(fake_trt, demo_copy):
    """On a GPU, work queued on another stream than the engines' races with them: a row moved on the default
    stream while the engine still writes the cache. Each call of the session (and the backend's run and
    execute) is made here, with the device work it did and the stream it did it on: all on the backend's,
    and every enqueue given the backend's stream."""
    from twostep.runtime.backends.trt import TrtBackend

    with TrtBackend(load_artifact(demo_copy)) as backend:
        session = backend.session()
        work = device_work(backend, session)
        ids, mask = np.array([[8, 8, 21, 33, 40, 12, 6, 3], [11, 3, 0, 0, 0, 0, 0, 0]]), np.ones((2, 8), np.int64)
        mask[1, 2:] = 0
        one, two = np.array([[4], [4]]), np.array([[4], [4], [4]])
        calls = {
            "start": lambda: session.start(ids, mask),
            "step": lambda: session.step(one),
            "admit": lambda: session.admit(np.array([[5, 9, 3]]), np.ones((1, 3), np.int64), np.array([0]),
                                           np.array([2])),
            "reorder": lambda: session.reorder(np.array([2, 1, 0])),
            "step again": lambda: session.step(two),
            "release": lambda: session.release(np.array([2])),  # the 8-token source leaves: its columns are cut
            "run": lambda: backend.run("encoder", {"input_ids": ids, "attention_mask": mask}),
            "execute": lambda: backend.execute("encoder", {"input_ids": backend.torch.from_numpy(ids),
                                                           "attention_mask": backend.torch.from_numpy(mask)}),
        }
        done = {}
        for name, call in calls.items():
            before = len(work)
            call()
            done[name] = work[before:]
        assert session.rows.tensors["encoder_attention_mask"].shape[1] == 3  # the release did cut
        stream = backend.stream
    assert all(done.values()), [name for name, w in done.items() if not w]  # each call did device work
    off = {name: [what for what, s in w if s is not stream] for name, w in done.items()}
    assert off == {name: [] for name in calls}, "device work outside the backend's stream"
    enqueues = [c[3] for c in fake_trt.calls if c[0] == "execute"]
    assert len(enqueues) >= 6 and set(enqueues) == {stream.cuda_stream}


# -- 11. Install order --------------------------------------------------------------------------------------
def test_both_onnxruntime_wheels_installed_is_diagnosed_with_the_fix(monkeypatch):
    from twostep.runtime.backends import ort as ort_backend

    monkeypatch.setattr(ort_backend, "installed_ort_wheels", lambda: ["onnxruntime", "onnxruntime-gpu"])
    reason = backends.unavailable_reason("ort-cuda")
    assert "onnxruntime and onnxruntime-gpu are both installed" in reason
    assert "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu" in reason


def test_readme_installs_the_gpu_wheel_after_removing_the_cpu_one():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## GPU"):]
    section = section[:section.index("\n## ", 4)]
    lines = [line.strip() for line in section.splitlines()]
    uninstall = next(i for i, line in enumerate(lines) if line.startswith("pip uninstall -y onnxruntime"))
    install = next(i for i, line in enumerate(lines) if line.startswith("pip install") and "onnxruntime-gpu" in line)
    assert uninstall < install
    assert not any("uninstall" in line and "onnxruntime" in line
                   for line in lines[install + 1:] if line.startswith("pip"))
