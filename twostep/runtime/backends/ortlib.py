"""Importing ONNX Runtime: the one place that does, for the ONNX Runtime backends and their sessions."""

from __future__ import annotations

from twostep.errors import BackendUnavailable


def installed_ort_wheels() -> list[str]:
    """The ONNX Runtime distributions installed: onnxruntime and onnxruntime-gpu share one module directory."""
    from importlib import metadata

    names = []
    for name in ("onnxruntime", "onnxruntime-gpu"):
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        names.append(name)
    return names


def import_ort():
    try:
        import onnxruntime
    except ImportError as exc:
        raise BackendUnavailable(f"onnxruntime is not installed ({exc}); pip install onnxruntime") from None
    return onnxruntime
