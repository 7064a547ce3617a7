"""Model sizes and seed families: presets that fill in a ModelConfig (twostep.artifact.config, the contract's
part of the model, which travels with every checkpoint and artifact)."""

from __future__ import annotations

from typing import Any

from twostep.artifact.config import ModelConfig
from twostep.errors import BadCheckpoint

PRESETS: dict[str, dict[str, Any]] = {
    # Small enough for every test to build in milliseconds.
    "tiny": dict(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, max_positions=64),
    # The shipped demo model.
    "demo": dict(d_model=128, n_heads=4, d_ff=512, n_encoder_layers=3, n_decoder_layers=3, max_positions=128),
    # The paper's base model.
    "base": dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6, max_positions=512),
}


def preset(name: str, src_vocab_size: int, tgt_vocab_size: int | None = None, **overrides: Any) -> ModelConfig:
    if name not in PRESETS:
        raise BadCheckpoint(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    values = {**PRESETS[name], **overrides}
    return ModelConfig(src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size or src_vocab_size, **values)


# What each seed family looks like in this config; the importers start from these.
FAMILIES: dict[str, dict[str, Any]] = {
    "annotated": dict(norm_placement="pre", norm_type="torch", norm_eps=1e-5),
    "annotated-a2b2": dict(norm_placement="pre", norm_type="annotated", norm_eps=1e-6),
    "jadore": dict(
        norm_placement="post", norm_eps=1e-6, attn_bias=False, generator_bias=False, embed_norm=True,
        encoder_final_norm=False, decoder_final_norm=False, scale_embedding=False,
        share_embeddings=True, tie_generator=True,
    ),
    "mha": dict(norm_placement="pre", norm_type="torch", norm_eps=1e-5),
    "nn-transformer": dict(norm_placement="post", norm_type="torch", norm_eps=1e-5),
}


def family_config(family: str, base: ModelConfig) -> ModelConfig:
    return base.replace(**FAMILIES[family])


__all__ = ["ModelConfig", "PRESETS", "FAMILIES", "preset", "family_config"]
