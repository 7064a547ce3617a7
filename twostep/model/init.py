"""Checkpoints with random weights, so speed can be measured at real sizes without training."""

from __future__ import annotations

from pathlib import Path

import torch

from twostep.model.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from twostep.model.config import preset
from twostep.model.transformer import Transformer


def init_checkpoint(out_dir: Path, preset_name: str, vocab: int, tgt_vocab: int | None = None,
                    seed: int = 0, force: bool = False) -> Checkpoint:
    """Xavier-initialised weights, untied embeddings and generator, no tokenizer. `force` replaces an earlier
    checkpoint at `out_dir` (never anything else)."""
    torch.manual_seed(seed)
    model = Transformer(preset(preset_name, vocab, tgt_vocab or vocab))
    save_checkpoint(model, out_dir, info={"init": {"preset": preset_name, "seed": seed}}, force=force)
    return load_checkpoint(out_dir)
