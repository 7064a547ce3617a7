"""Parity of every registered backend with eager PyTorch on the shape grid (trace shapes excluded)."""

from __future__ import annotations

import pytest

from twostep.artifact import load_artifact
from twostep.errors import BackendUnavailable
from twostep.exporter.validate import compare_graphs
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
