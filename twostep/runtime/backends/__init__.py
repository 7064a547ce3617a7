"""The backend registry: explicit, with lazy imports, so a CPU-only install never imports GPU libraries."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from twostep.errors import BackendUnavailable


@dataclass(frozen=True)
class BackendInfo:
    name: str
    target: str  # "module:Class"
    needs_artifact: bool  # False: runs from a checkpoint (the eager reference)
    install: str
    needs_gpu: bool = False

    def load_class(self):
        module, cls = self.target.split(":")
        return getattr(importlib.import_module(module), cls)


BACKENDS = {
    info.name: info
    for info in (
        BackendInfo("torch", "twostep.runtime.backends.torch_backend:TorchBackend", False,
                    "installed with twostep"),
        BackendInfo("ort-cpu", "twostep.runtime.backends.ort:OrtBackend", True, "pip install onnxruntime"),
        BackendInfo("ort-cuda", "twostep.runtime.backends.ort:OrtCudaBackend", True,
                    "pip install 'twostep[gpu]' (onnxruntime-gpu, CUDA 13) on a machine with an NVIDIA GPU",
                    needs_gpu=True),
        BackendInfo("ort-trt", "twostep.runtime.backends.ort:OrtTrtBackend", True,
                    "pip install 'twostep[gpu,trt]' (onnxruntime-gpu with TensorRT libraries) on an NVIDIA GPU",
                    needs_gpu=True),
        BackendInfo("trt", "twostep.runtime.backends.trt:TrtBackend", True,
                    "pip install 'twostep[trt]' (TensorRT 10 or 11) and torch with CUDA, on an NVIDIA GPU",
                    needs_gpu=True),
    )
}


def unavailable_reason(name: str, **options) -> str | None:
    """None when the backend can run here, else why not."""
    cls = backend_info(name).load_class()
    return cls.unavailable(**options)


def backend_info(name: str) -> BackendInfo:
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; available: {', '.join(available())}; "
                                 f"registered: {', '.join(BACKENDS)}")
    return BACKENDS[name]


def available() -> list[str]:
    return [name for name in BACKENDS if unavailable_reason(name) is None]


def workload_options(name: str, config, rows: int, src_len: int | None = None,
                     new_tokens: int | None = None) -> dict:
    """Options that size an engine backend (trt, ort-trt) for a workload of `rows` decode rows (batch x
    beam): the default engine profile when the workload fits it, so cached engines are reused, else a
    larger one. Other backends take any shape and get nothing."""
    if name not in ("trt", "ort-trt"):
        return {}
    from twostep.runtime.backends.profile import Profile

    return {"profile": Profile.sized_for(config, rows, src_len, new_tokens)}


def create(name: str, artifact=None, checkpoint_dir: Path | None = None, **options):
    """A loaded backend. ONNX backends run the artifact (twostep.artifact.Artifact); `torch` the checkpoint."""
    info = backend_info(name)
    reason = unavailable_reason(name, **({"device": options["device"]} if "device" in options else {}))
    if reason:
        runnable = ", ".join(available())
        raise BackendUnavailable(f"backend {name!r} is not available here: {reason}. Install: {info.install}. "
                                 f"Available now: {runnable}")
    cls = info.load_class()
    if info.needs_artifact:
        if artifact is None:
            raise BackendUnavailable(f"backend {name!r} runs an exported artifact directory; give one "
                                     "(twostep export CKPT --out DIR)")
        return cls(artifact, **options).load()
    if checkpoint_dir is None:
        raise BackendUnavailable(f"backend {name!r} runs eager PyTorch and needs the checkpoint: pass --checkpoint")
    from twostep.model.checkpoint import load_checkpoint

    return cls(load_checkpoint(checkpoint_dir).model, **options).load()
