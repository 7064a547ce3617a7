"""The model configuration: one frozen dataclass that travels with every checkpoint and artifact (the
manifest's `model`). The presets and seed families that fill it in are the model layer's (twostep.model.config)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from twostep.errors import BadCheckpoint

NORM_PLACEMENTS = ("pre", "post")
FIELD_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "int | None": (int, type(None))}
NORM_TYPES = ("torch", "annotated")


@dataclass(frozen=True)
class ModelConfig:
    """Everything the seed families differ in.

    `norm_type="torch"` is `nn.LayerNorm`; `"annotated"` is the original Annotated Transformer's
    `a_2 * (x - mean) / (std + eps) + b_2` with the unbiased std.
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    max_positions: int = 512
    dropout: float = 0.1
    norm_placement: str = "pre"
    norm_type: str = "torch"
    norm_eps: float = 1e-5
    attn_bias: bool = True
    generator_bias: bool = True
    d_k: int | None = None  # per-head query/key size; None means d_model // n_heads
    d_v: int | None = None  # per-head value size; None means d_model // n_heads
    scale_embedding: bool = True  # multiply token embeddings by sqrt(d_model)
    embed_norm: bool = False  # a LayerNorm right after embedding + positions (jadore)
    encoder_final_norm: bool = True
    decoder_final_norm: bool = True
    share_embeddings: bool = False  # one embedding table for source and target
    tie_generator: bool = False  # generator weight is the target embedding
    logit_scale: float = 1.0
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise BadCheckpoint("invalid model config: " + "; ".join(problems))

    def problems(self) -> list[str]:
        out = self.type_problems()
        if out:
            return out
        if self.norm_placement not in NORM_PLACEMENTS:
            out.append(f"norm_placement must be one of {NORM_PLACEMENTS}, got {self.norm_placement!r}")
        if self.norm_type not in NORM_TYPES:
            out.append(f"norm_type must be one of {NORM_TYPES}, got {self.norm_type!r}")
        if self.d_k is None and self.d_model % self.n_heads:
            out.append(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}; give d_k and d_v")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            out.append("share_embeddings needs equal source and target vocab sizes")
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_positions",
                     "n_encoder_layers", "n_decoder_layers", "d_k", "d_v", "norm_eps"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                out.append(f"{name} must be positive")
        for name in ("pad_id", "unk_id", "bos_id", "eos_id"):
            if not 0 <= getattr(self, name) < self.tgt_vocab_size:
                out.append(f"{name} {getattr(self, name)} is outside the target vocab")
        return out

    def type_problems(self) -> list[str]:
        """Configs arrive as JSON from files: every field must have its declared type."""
        out = []
        for f in dataclasses.fields(self):
            value, expected = getattr(self, f.name), FIELD_TYPES[f.type]
            if isinstance(value, bool) != (bool in expected) or not isinstance(value, expected):
                out.append(f"{f.name} must be {f.type}, got {type(value).__name__} {value!r:.40}")
            elif isinstance(value, float) and not math.isfinite(value):
                out.append(f"{f.name} must be finite, got {value}")
        return out

    @property
    def head_dim_k(self) -> int:
        return self.d_k if self.d_k is not None else self.d_model // self.n_heads

    @property
    def head_dim_v(self) -> int:
        return self.d_v if self.d_v is not None else self.d_model // self.n_heads

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BadCheckpoint(f"unknown model config keys: {', '.join(unknown)}")
        try:
            return cls(**data)
        except TypeError as exc:  # a missing required field
            raise BadCheckpoint(f"invalid model config: {exc}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


__all__ = ["ModelConfig"]
