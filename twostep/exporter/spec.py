"""The two graphs' inputs and outputs, declared once.

This one declaration drives `torch.onnx.export` (names, dynamic axes), validation after export, the
manifest, the runtime's input checks, and any other consumer (TensorRT profiles, the C++ reader). The
layout follows ONNX Runtime's encoder-decoder convention:

encoder  input_ids, attention_mask [batch, src_len] int64
         -> present_key_cross_{i}, present_value_cross_{i} [batch, heads, src_len, head_dim]
decoder  input_ids [batch, new_len], encoder_attention_mask [batch, src_len], past_lengths [batch],
         past_key_self_{i}, past_value_self_{i} [batch, heads, past_len, head_dim],
         past_key_cross_{i}, past_value_cross_{i} [batch, heads, src_len, head_dim]
         -> logits [batch, new_len, vocab], present_key_self_{i}, present_value_self_{i}
            [batch, heads, past_len + new_len, head_dim]

Rows of one batch may be at different positions (schema 2): `past_lengths[r]` of the past_len cached
positions are row r's own, the last ones (the cache is left-padded; the graph masks the columns before them),
and its new tokens take positions past_lengths[r], past_lengths[r] + 1, ... A sentence joins a running
batch as a row with past_lengths 0, next to rows that are further on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twostep.model.config import ModelConfig

Dim = str | int  # a symbolic axis name, or a fixed size


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # "int64", "float32" or "float16"
    shape: tuple[Dim, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TensorSpec":
        return cls(data["name"], data["dtype"], tuple(data["shape"]))

    def concrete(self, **sizes: int) -> tuple[int, ...]:
        """The shape with its symbolic axes filled in, e.g. an empty cache: concrete(batch=3, past_len=0)."""
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.shape)


def present_name(past: str) -> str:
    """The output that feeds an input at the next step: past_key_self_0 <- present_key_self_0."""
    return "present_" + past[len("past_"):]


def past_name(present: str) -> str:
    return "past_" + present[len("present_"):]


@dataclass(frozen=True)
class GraphSpec:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": [t.to_dict() for t in self.inputs], "outputs": [t.to_dict() for t in self.outputs]}

    @classmethod
    def from_dict(cls, name: str, data: dict[str, Any]) -> "GraphSpec":
        return cls(name, tuple(map(TensorSpec.from_dict, data["inputs"])),
                   tuple(map(TensorSpec.from_dict, data["outputs"])))

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    @property
    def past_self(self) -> list[TensorSpec]:
        """The decoder's self-attention cache inputs, key_0, value_0, key_1, ..."""
        return [t for t in self.inputs if t.name.startswith("past_") and "_self_" in t.name]

    @property
    def past_cross(self) -> list[TensorSpec]:
        """The decoder's cross-attention K/V inputs (the encoder's present_*_cross outputs)."""
        return [t for t in self.inputs if t.name.startswith("past_") and "_cross_" in t.name]


def kv_specs(prefix: str, n_layers: int, heads: int, dk: int, dv: int, length: Dim, dtype: str) -> list[TensorSpec]:
    """key/value pairs of every layer, in the order key_0, value_0, key_1, value_1, ..."""
    out = []
    for i in range(n_layers):
        out.append(TensorSpec(f"{prefix.format(kind='key')}_{i}", dtype, ("batch", heads, length, dk)))
        out.append(TensorSpec(f"{prefix.format(kind='value')}_{i}", dtype, ("batch", heads, length, dv)))
    return out


def graph_specs(config: ModelConfig, dtype: str = "float32") -> dict[str, GraphSpec]:
    n, h, dk, dv = config.n_decoder_layers, config.n_heads, config.head_dim_k, config.head_dim_v
    cross_present = kv_specs("present_{kind}_cross", n, h, dk, dv, "src_len", dtype)
    encoder = GraphSpec(
        "encoder",
        inputs=(TensorSpec("input_ids", "int64", ("batch", "src_len")),
                TensorSpec("attention_mask", "int64", ("batch", "src_len"))),
        outputs=tuple(cross_present),
    )
    decoder = GraphSpec(
        "decoder",
        inputs=(
            TensorSpec("input_ids", "int64", ("batch", "new_len")),
            TensorSpec("encoder_attention_mask", "int64", ("batch", "src_len")),
            TensorSpec("past_lengths", "int64", ("batch",)),
            *kv_specs("past_{kind}_self", n, h, dk, dv, "past_len", dtype),
            *kv_specs("past_{kind}_cross", n, h, dk, dv, "src_len", dtype),
        ),
        outputs=(
            TensorSpec("logits", dtype, ("batch", "new_len", config.tgt_vocab_size)),
            *kv_specs("present_{kind}_self", n, h, dk, dv, "past_len + new_len", dtype),
        ),
    )
    return {"encoder": encoder, "decoder": decoder}


# The in-place decoder, an ONNX Runtime-only variant of the decoder (twostep.exporter.inplace): past and present
# self-attention K/V are one buffer of any capacity, written in place; past_lengths gives each row's length,
# its first positions (right-padded, where the plain decoder's cache is left-padded).
INPLACE = "decoder_inplace"
INPLACE_FILE = "decoder_inplace.onnx"
INPLACE_OPS = ["com.microsoft.GroupQueryAttention"]


def inplace_unsupported(config: ModelConfig) -> str | None:
    """Why this model cannot have the in-place decoder, or None."""
    if config.head_dim_k != config.head_dim_v:
        return f"its key and value head sizes differ ({config.head_dim_k} and {config.head_dim_v})"
    if config.head_dim_k % 8:
        return f"its head size {config.head_dim_k} is not a multiple of 8 (ONNX Runtime's CPU kernel needs one)"
    return None


def inplace_spec(config: ModelConfig, dtype: str = "float32") -> GraphSpec:
    n, h, dk, dv = config.n_decoder_layers, config.n_heads, config.head_dim_k, config.head_dim_v
    return GraphSpec(
        INPLACE,
        inputs=(
            TensorSpec("input_ids", "int64", ("batch", "new_len")),
            TensorSpec("encoder_attention_mask", "int64", ("batch", "src_len")),
            TensorSpec("past_lengths", "int64", ("batch",)),
            *kv_specs("past_{kind}_self", n, h, dk, dv, "capacity", dtype),
            *kv_specs("past_{kind}_cross", n, h, dk, dv, "src_len", dtype),
        ),
        outputs=(
            TensorSpec("logits", dtype, ("batch", "new_len", config.tgt_vocab_size)),
            *kv_specs("present_{kind}_self", n, h, dk, dv, "capacity", dtype),
        ),
    )
