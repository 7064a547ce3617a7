"""Shared fixtures: one tiny random model, and the shipped demo checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from twostep.model.checkpoint import save_checkpoint
from twostep.model.config import preset
from twostep.model.transformer import Transformer

DEMO_MODEL = Path(__file__).resolve().parents[1] / "twostep" / "demo" / "model"


@pytest.fixture(scope="session")
def tiny_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(preset("tiny", 50, 60, dropout=0.0)).eval()


@pytest.fixture()
def tiny_ckpt(tmp_path, tiny_model) -> Path:
    return save_checkpoint(tiny_model, tmp_path / "tiny")


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    if not (DEMO_MODEL / "model.safetensors").is_file():
        pytest.fail(f"the shipped demo model is missing at {DEMO_MODEL}")
    return DEMO_MODEL


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory) -> tuple[Path, Path]:
    """(artifact dir, checkpoint dir) of a tiny random model, exported once per session."""
    from twostep.exporter.export import export

    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    ckpt = save_checkpoint(Transformer(preset("tiny", 50, 60, dropout=0.0)), root / "ckpt")
    export(ckpt, root / "art")
    return root / "art", ckpt


@pytest.fixture(scope="session")
def demo_artifact(tmp_path_factory, demo_model_dir) -> Path:
    from twostep.exporter.export import export

    return export(demo_model_dir, tmp_path_factory.mktemp("demo") / "art").path


@pytest.fixture(scope="session")
def demo_int8(tmp_path_factory, demo_model_dir) -> Path:
    from twostep.exporter.export import export

    return export(demo_model_dir, tmp_path_factory.mktemp("demo-int8") / "art", dtype="int8").path
