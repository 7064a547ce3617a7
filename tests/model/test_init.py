"""Checkpoints with random weights (twostep/model/init.py)."""

from __future__ import annotations

from twostep.model.init import init_checkpoint


def test_init_base_preset_writes_a_loadable_checkpoint(tmp_path):
    ckpt = init_checkpoint(tmp_path / "base", "base", 32000)
    assert ckpt.tokenizer is None
    assert ckpt.config.d_model == 512 and ckpt.config.n_encoder_layers == 6 == ckpt.config.n_decoder_layers
    assert 92e6 < ckpt.model.num_parameters() < 95e6  # untied embeddings and generator: about 93 M
    assert not ckpt.config.tie_generator and not ckpt.config.share_embeddings
