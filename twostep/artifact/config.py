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
FIELD_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "int | None": (int, type(None)),
               "tuple[int, ...]": (tuple,)}
NORM_TYPES = ("torch", "annotated", "rms")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
# The sinusoid a position table holds (twostep.model.transformer.position_table): the paper's interleaved sin/cos;
# Marian's sin half then cos half; fairseq's (M2M100, NLLB) halves with a (D/2 - 1) denominator; "learned": no
# sinusoid, but a table per stack that the model's weights hold (mBART), loaded, never computed; "none": no absolute
# positions (T5, whose attention has the relative bias instead: relative_buckets).
POSITIONS = ("paper", "marian", "fairseq", "learned", "none")


@dataclass(frozen=True)
class ModelConfig:
    """Everything the seed families differ in.

    `norm_type="torch"` is `nn.LayerNorm`; `"annotated"` is the original Annotated Transformer's
    `a_2 * (x - mean) / (std + eps) + b_2` with the unbiased std; `"rms"` is T5's `weight * x / sqrt(mean(x^2) +
    eps)` (no mean subtracted, no bias).

    `relative_buckets` > 0 adds T5's relative attention bias to every self-attention's scores: the key's position
    minus the query's, put in one of that many buckets (exact below a quarter of them, logarithmic up to
    `relative_max_distance`, both signs in the encoder, the past only in the decoder), one learned value per bucket
    and head, one table per stack shared by its layers.
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
    scale_attention: bool = True  # divide the query-key products by sqrt(d_k) (T5: no)
    ffn_bias: bool = True  # the feed-forward's projections have biases (T5: no)
    gated_ffn: bool = False  # the feed-forward is w_2(act(w_1 x) * w_3 x) (T5 v1.1, mT5: gated-gelu)
    relative_buckets: int = 0  # > 0: T5's relative attention bias, with this many buckets
    relative_max_distance: int = 128  # the distance from which the relative bias no longer changes
    embed_norm: bool = False  # a LayerNorm right after embedding + positions (jadore)
    encoder_final_norm: bool = True
    decoder_final_norm: bool = True
    share_embeddings: bool = False  # one embedding table for source and target
    tie_generator: bool = False  # generator weight is the target embedding
    logit_scale: float = 1.0
    activation: str = "relu"  # the feed-forward's: relu, gelu (erf), gelu_tanh, silu (swish)
    positions: str = "paper"  # which sinusoid fills the position table (POSITIONS); "learned": one per stack
    position_offset: int = 0  # position p reads the sinusoid's row p + offset (fairseq: pad_id + 1)
    decoder_start_id: int | None = None  # the decoder's first input; None: bos_id (Marian: pad; M2M100: eos)
    never_generate: tuple[int, ...] = ()  # target ids decoding never picks (Marian's pad)
    zero_start_embedding: bool = False  # the decoder's first position embeds no token (CTranslate2's Marian)
    # > 0: the decoder also gives "alignment", the cross-attention of decoder layer `alignment_layer` (negative:
    # from the last) averaged over its first `alignment_heads` heads, which replace_unknowns reads (CTranslate2's)
    alignment_heads: int = 0
    alignment_layer: int = -1
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
        if self.activation not in ACTIVATIONS:
            out.append(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.positions not in POSITIONS:
            out.append(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if self.position_offset < 0:
            out.append("position_offset must be >= 0")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            out.append("share_embeddings needs equal source and target vocab sizes")
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_positions",
                     "n_encoder_layers", "n_decoder_layers", "d_k", "d_v", "norm_eps"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                out.append(f"{name} must be positive")
        for name in ("pad_id", "unk_id", "bos_id", "eos_id", "decoder_start_id"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) < self.tgt_vocab_size:
                out.append(f"{name} {getattr(self, name)} is outside the target vocab")
        if any(not 0 <= i < self.tgt_vocab_size for i in self.never_generate):
            out.append(f"never_generate {list(self.never_generate)[:5]} has ids outside the target vocab")
        if not 0 <= self.alignment_heads <= self.n_heads:
            out.append(f"alignment_heads must be between 0 and n_heads {self.n_heads}, got {self.alignment_heads}")
        if not -self.n_decoder_layers <= self.alignment_layer < self.n_decoder_layers:
            out.append(f"alignment_layer {self.alignment_layer} is not a decoder layer")
        buckets, distance = self.relative_buckets, self.relative_max_distance
        if buckets and (buckets < 4 or distance <= buckets // 2):
            out.append("relative_buckets must be 0 or at least 4, and relative_max_distance more than half of them; "
                       f"got {buckets} and {distance}")
        if self.eos_id in self.never_generate:
            out.append("never_generate holds the eos id: decoding could never end")
        return out

    def type_problems(self) -> list[str]:
        """Configs arrive as JSON from files: every field must have its declared type."""
        out = []
        for f in dataclasses.fields(self):
            value, expected = getattr(self, f.name), FIELD_TYPES[f.type]
            if isinstance(value, bool) != (bool in expected) or not isinstance(value, expected):
                out.append(f"{f.name} must be {f.type}, got {type(value).__name__} {value!r:.40}")
            elif isinstance(value, tuple) and not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                out.append(f"{f.name} must be a list of ints, got {list(value)!r:.40}")
            elif isinstance(value, float) and not math.isfinite(value):
                out.append(f"{f.name} must be finite, got {value}")
        return out

    @property
    def start_id(self) -> int:
        """The decoder's first input token."""
        return self.bos_id if self.decoder_start_id is None else self.decoder_start_id

    @property
    def head_dim_k(self) -> int:
        return self.d_k if self.d_k is not None else self.d_model // self.n_heads

    @property
    def head_dim_v(self) -> int:
        return self.d_v if self.d_v is not None else self.d_model // self.n_heads

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BadCheckpoint(f"unknown model config keys: {', '.join(unknown)}")
        data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        try:
            return cls(**data)
        except TypeError as exc:  # a missing required field
            raise BadCheckpoint(f"invalid model config: {exc}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


__all__ = ["ModelConfig"]
