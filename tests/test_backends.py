"""Parity of every registered backend with eager PyTorch on the shape grid (trace shapes excluded)."""

from __future__ import annotations

import pytest

from twostep.artifact import load_artifact
from twostep.errors import BackendUnavailable
from twostep.exporter.graphs import TRACE_SIZES
from twostep.exporter.validate import SHAPE_GRID, compare_graphs
from twostep.model.checkpoint import load_checkpoint
from twostep.runtime import backends
from twostep.runtime.backends.torch_backend import TorchBackend

# Every registered backend must appear here; GPU ones are skipped with a reason where there is no GPU.
PARITY_MATRIX = {
    "torch": {},
    "ort-cpu": {},
    "ort-cuda": {"marks": [pytest.mark.gpu]},
    "ort-trt": {"marks": [pytest.mark.gpu, pytest.mark.trt]},
    "trt": {"marks": [pytest.mark.gpu, pytest.mark.trt]},
}


def test_every_registered_backend_is_in_the_parity_matrix():
    assert set(PARITY_MATRIX) == set(backends.BACKENDS)


def test_grid_differs_from_trace_shapes_and_covers_the_edges():
    for axis, sizes in SHAPE_GRID.items():
        assert TRACE_SIZES[axis] not in sizes
    assert 0 in SHAPE_GRID["past_len"] and 1 in SHAPE_GRID["new_len"] and 1 in SHAPE_GRID["batch"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=v.get("marks", [])) for n, v in PARITY_MATRIX.items()])
def test_backend_matches_eager_on_the_shape_grid(name, tiny_artifact):
    art, ckpt = tiny_artifact
    reason = backends.unavailable_reason(name)
    if reason:
        pytest.skip(f"{name} unavailable here: {reason}")
    candidate = backends.create(name, artifact=load_artifact(art), checkpoint_dir=ckpt)
    with candidate, TorchBackend(load_checkpoint(ckpt).model) as reference:
        report = compare_graphs(candidate, reference)
    assert report.ok, report.failures[:5]
    assert report.cases == 6 * (1 + 6)  # (batch, src_len) encoder cases, each with 6 decoder cases
    assert set(report.max_error) >= {"decoder.logits", "encoder.present_key_cross_0", "decoder.present_value_self_1"}


@pytest.mark.gpu
def test_torch_on_cuda_matches_torch_on_cpu(tiny_artifact):
    art, ckpt = tiny_artifact
    reason = backends.unavailable_reason("torch", device="cuda")
    if reason:
        pytest.skip(f"torch on cuda unavailable here: {reason}")
    model = load_checkpoint(ckpt).model
    with TorchBackend(model, device="cuda") as gpu, TorchBackend(load_checkpoint(ckpt).model) as cpu:
        report = compare_graphs(gpu, cpu)
    assert report.ok, report.failures[:5]


def test_unknown_backend_lists_what_is_available():
    with pytest.raises(BackendUnavailable, match=r"unknown backend 'tensorflow'; available: torch, ort-cpu"):
        backends.create("tensorflow")


def test_gpu_backend_without_gpu_says_how_to_install(tiny_artifact):
    if backends.unavailable_reason("ort-cuda") is None:
        pytest.skip("ort-cuda is available on this machine")
    with pytest.raises(BackendUnavailable, match=r"not available here: .*CUDAExecutionProvider.*twostep\[gpu\]"):
        backends.create("ort-cuda", artifact=load_artifact(tiny_artifact[0]))


def test_io_binding_session_decodes_like_the_host_session(demo_artifact):
    """ort-cuda's session (OrtValues bound in place, device-side beam reorder) run on the CPU provider."""
    from search import SPECIALS, beam_search, greedy
    from twostep.runtime.backends.ort import OrtBackend
    from twostep.runtime.backends.iobinding import IoBindingSession

    sources = [[5, 9, 13, 7, 3], [11, 3], [8, 8, 21, 33, 40, 12, 6, 3]]
    common = dict(specials=SPECIALS, max_new_tokens=12)
    with OrtBackend(load_artifact(demo_artifact)) as backend:
        bound, host = IoBindingSession(backend, "cpu"), backend.session()
        assert greedy(bound, sources, **common) == greedy(host, sources, **common)
        a = beam_search(bound, sources, beam_size=4, n_best=2, **common)
        b = beam_search(host, sources, beam_size=4, n_best=2, **common)
    assert [[h.tokens for h in x] for x in a] == [[h.tokens for h in x] for x in b]


def test_pool_threads_spin_within_a_run_and_stop_when_it_returns(tiny_artifact):
    """Threads spinning after a run took the cores from what came next (the encoder's, after a join, from the
    decoder's steps: docs/benchmarks.md, "In-flight vs static batching"); within a run they spin (turning
    that off made a short request alone 1.4x slower)."""
    from twostep.runtime.backends.ort import OrtBackend

    def config(session, key: str) -> str:
        try:
            return session.get_session_options().get_session_config_entry(key)
        except RuntimeError:  # not set: ONNX Runtime's default
            return "default"

    for spin, want in ((False, "1"), (True, "default")):
        backend_class = type("Backend", (OrtBackend,), {"spin_between_runs": spin})
        with backend_class(load_artifact(tiny_artifact[0]), threads=2) as backend:
            assert set(backend.sessions) == {"encoder", "decoder"}
            for graph, session in backend.sessions.items():
                assert config(session, "session.force_spinning_stop") == want, (graph, spin)
                assert config(session, "session.intra_op.allow_spinning") == "default", graph
