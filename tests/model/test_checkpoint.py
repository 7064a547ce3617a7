"""Checkpoint directories: round trip, all problems in one error, no pickle."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from twostep.errors import BadCheckpoint
from twostep.model.checkpoint import load_checkpoint, save_checkpoint
from twostep.model.config import preset
from twostep.model.transformer import Transformer


def test_round_trip_keeps_every_weight(tiny_model, tiny_ckpt):
    loaded = load_checkpoint(tiny_ckpt).model
    assert loaded.config == tiny_model.config
    for (name, a), (_, b) in zip(tiny_model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_tied_weights_are_stored_once_and_tied_on_load(tmp_path):
    model = Transformer(preset("tiny", 30, share_embeddings=True, tie_generator=True))
    save_checkpoint(model, tmp_path / "tied")
    stored = load_file(str(tmp_path / "tied" / "model.safetensors"))
    assert "src_embed.weight" in stored and "tgt_embed.weight" not in stored and "generator.weight" not in stored
    loaded = load_checkpoint(tmp_path / "tied").model
    assert loaded.generator.weight is loaded.src_embed.weight


def test_missing_and_misshapen_tensors_in_one_error(tiny_ckpt):
    weights = load_file(str(tiny_ckpt / "model.safetensors"))
    del weights["encoder.layers.0.ffn.w_1.bias"]
    weights["decoder.layers.1.cross_attn.k_proj.weight"] = torch.zeros(5, 32)
    weights["stray"] = torch.zeros(1)
    save_file(weights, str(tiny_ckpt / "model.safetensors"))
    with pytest.raises(BadCheckpoint) as info:
        load_checkpoint(tiny_ckpt)
    message = str(info.value)
    assert "3 problem(s)" in message
    assert "missing tensor encoder.layers.0.ffn.w_1.bias (64,)" in message
    assert "tensor decoder.layers.1.cross_attn.k_proj.weight has shape (5, 32), expected (32, 32)" in message
    assert "unexpected tensor stray" in message


@pytest.mark.parametrize("damage,expected", [
    (lambda d: (d / "config.json").unlink(), "missing config.json"),
    (lambda d: (d / "config.json").write_text("{not json"), "not valid JSON"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 10), "cannot read safetensors"),
    (lambda d: (d / "model.safetensors").unlink(), "missing model.safetensors"),
])
def test_damaged_checkpoints_give_clear_errors(tiny_ckpt, damage, expected):
    damage(tiny_ckpt)
    with pytest.raises(BadCheckpoint, match=expected):
        load_checkpoint(tiny_ckpt)


def test_bad_config_values_are_listed(tiny_ckpt):
    meta = json.loads((tiny_ckpt / "config.json").read_text())
    meta["model"].update(norm_placement="middle", eos_id=999)
    (tiny_ckpt / "config.json").write_text(json.dumps(meta))
    with pytest.raises(BadCheckpoint) as info:
        load_checkpoint(tiny_ckpt)
    assert "norm_placement" in str(info.value) and "eos_id 999" in str(info.value)
