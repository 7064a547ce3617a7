"""The graphs an artifact may hold, and their inputs and outputs, declared once.

This one declaration drives `torch.onnx.export` (names, dynamic axes), validation after export, the
manifest, the runtime's input checks, and any other consumer (TensorRT profiles, the C++ reader). The
layout follows ONNX Runtime's encoder-decoder convention:

encoder  input_ids, attention_mask [batch, src_len] int64
         -> present_key_cross_{i}, present_value_cross_{i} [batch, heads, src_len, head_dim]
decoder  input_ids [batch, new_len], encoder_attention_mask [batch, src_len], past_lengths [batch],
         past_key_self_{i}, past_value_self_{i} [batch, heads, past_len, head_dim],
         past_key_cross_{i}, past_value_cross_{i} [batch, heads, src_len, head_dim]
         -> logits [batch, new_len, vocab], present_key_self_{i}, present_value_self_{i}
            [batch, heads, past_len + new_len, head_dim],
            log_norm [batch], top_logits [batch, C], top_ids [batch, C] int64,
            alignment [batch, new_len, src_len] (only a model with config.alignment_heads)

The last three are the search outputs (schema 3 artifacts of an older twostep lack them): what a search needs
of the last position's logits, so that the full logits need not leave the graph. top_logits and top_ids are the
row's C = min(SEARCH_WIDTH, vocab) largest logits, largest first (ties: the lower id first, as ONNX Runtime's
TopK orders them), and log_norm is log(sum(exp(logits - top_logits[:, 0]))): a candidate's log-probability is
(top_logits - top_logits[:, :1]) - log_norm[:, None].

Rows of one batch may be at different positions (schema 2): `past_lengths[r]` of the past_len cached
positions are row r's own, the last ones (the cache is left-padded; the graph masks the columns before them),
and its new tokens take positions past_lengths[r], past_lengths[r] + 1, ... A sentence joins a running
batch as a row with past_lengths 0, next to rows that are further on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twostep.artifact.config import ModelConfig

Dim = str | int  # a symbolic axis name, or a fixed size


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # "int64", "float32" or "float16"
    shape: tuple[Dim, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorSpec:
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
    def from_dict(cls, name: str, data: dict[str, Any]) -> GraphSpec:
        return cls(name, tuple(map(TensorSpec.from_dict, data["inputs"])),
                   tuple(map(TensorSpec.from_dict, data["outputs"])))

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    @property
    def step_output_names(self) -> list[str]:
        """What a decoding step fetches: every output but the alignment (which replace_unknowns asks for)."""
        return [name for name in self.output_names if name != ALIGNMENT]

    @property
    def searches(self) -> bool:
        """The decoder gives the search outputs (log_norm, top_logits, top_ids) beside the logits."""
        return "top_ids" in self.output_names

    def without_search(self) -> GraphSpec:
        """The same I/O as an older twostep declared it, without the search outputs."""
        return GraphSpec(self.name, self.inputs, tuple(t for t in self.outputs if t.name not in SEARCH_OUTPUTS))

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
    decoder = step_decoder_spec(config, dtype, "decoder", "past_len", "past_len + new_len")
    return {"encoder": encoder, "decoder": decoder}


def step_decoder_spec(config: ModelConfig, dtype: str, name: str, past: Dim, present: Dim) -> GraphSpec:
    """A step decoder's I/O, its self-attention cache `past` positions wide in and `present` out."""
    n, h, dk, dv = config.n_decoder_layers, config.n_heads, config.head_dim_k, config.head_dim_v
    return GraphSpec(
        name,
        inputs=(
            TensorSpec("input_ids", "int64", ("batch", "new_len")),
            TensorSpec("encoder_attention_mask", "int64", ("batch", "src_len")),
            TensorSpec("past_lengths", "int64", ("batch",)),
            *kv_specs("past_{kind}_self", n, h, dk, dv, past, dtype),
            *kv_specs("past_{kind}_cross", n, h, dk, dv, "src_len", dtype),
        ),
        outputs=(
            TensorSpec("logits", dtype, ("batch", "new_len", config.tgt_vocab_size)),
            *kv_specs("present_{kind}_self", n, h, dk, dv, present, dtype),
            *search_specs(config, dtype),
            *alignment_specs(config, dtype),
        ),
    )


def alignment_specs(config: ModelConfig, dtype: str = "float32") -> tuple[TensorSpec, ...]:
    """A model with alignment heads (config.alignment_heads): each new token's attention over the source, of the
    alignment layer's first alignment_heads heads averaged; decoding never fetches it, replace_unknowns does."""
    return (TensorSpec(ALIGNMENT, dtype, ("batch", "new_len", "src_len")),) if config.alignment_heads else ()


ALIGNMENT = "alignment"
SEARCH_WIDTH = 32  # candidates per row in the search outputs: beam search takes 2 x beam, plus the ids it blocks
SEARCH_OUTPUTS = ("log_norm", "top_logits", "top_ids")


def search_width(config: ModelConfig) -> int:
    return min(SEARCH_WIDTH, config.tgt_vocab_size)


def search_specs(config: ModelConfig, dtype: str = "float32") -> tuple[TensorSpec, ...]:
    """In the graph's float type, as its logits (fp16 graphs compute them in fp16)."""
    width = search_width(config)
    return (TensorSpec("log_norm", dtype, ("batch",)), TensorSpec("top_logits", dtype, ("batch", width)),
            TensorSpec("top_ids", "int64", ("batch", width)))


# The in-place decoder, an ONNX Runtime-only variant of the decoder (twostep.exporter.inplace): past and present
# self-attention K/V are one buffer of any capacity, written in place; past_lengths gives each row's length,
# its first positions (right-padded, where the plain decoder's cache is left-padded).
INPLACE = "decoder_inplace"
INPLACE_FILE = "decoder_inplace.onnx"


def inplace_unsupported(config: ModelConfig, precision: str) -> str | None:
    """Why this model cannot have the in-place decoder, or None."""
    if precision == "fp16":
        return "it is for ONNX Runtime on the CPU (fp32, int8 or int4); fp16 artifacts run on GPUs"
    if config.head_dim_k != config.head_dim_v:
        return f"its key and value head sizes differ ({config.head_dim_k} and {config.head_dim_v})"
    if config.head_dim_k % 8:
        return f"its head size {config.head_dim_k} is not a multiple of 8 (ONNX Runtime's CPU kernel needs one)"
    return None


def inplace_spec(config: ModelConfig, dtype: str = "float32") -> GraphSpec:
    """The cache in and out is one buffer of any capacity."""
    return step_decoder_spec(config, dtype, INPLACE, "capacity", "capacity")


# The in-place decoder in standard ONNX: opset 24's TensorScatter + Attention for the contrib op, the same I/O.
STANDARD_INPLACE = "decoder_inplace_standard"
STANDARD_INPLACE_FILE = "decoder_inplace_standard.onnx"
STANDARD_OPSET = 24
INPLACE_DECODERS = (INPLACE, STANDARD_INPLACE)  # the decoders whose cache is a buffer written in place


def standard_inplace_spec(config: ModelConfig, dtype: str = "float32") -> GraphSpec:
    return step_decoder_spec(config, dtype, STANDARD_INPLACE, "capacity", "capacity")


def encoder_spec(config: ModelConfig, dtype: str = "float32") -> GraphSpec:
    return graph_specs(config, dtype)["encoder"]


def decoder_spec(config: ModelConfig, dtype: str = "float32") -> GraphSpec:
    return graph_specs(config, dtype)["decoder"]


@dataclass(frozen=True)
class GraphInfo:
    """A graph an artifact may hold: its file, its I/O for a model (`spec(config, dtype)`), the exporter function
    that writes it (`builder`, "module:function", called as function(model, path, opset) on the fp32 model),
    and, for a variant, the only runtime that runs it, the non-standard ops it needs, why a model cannot have
    it (`unsupported(config, precision)`) and the contract graph whose weights it reads instead of storing them
    again (`shares`: external data inside that graph's file, twostep.exporter.shared). The contract's graphs
    (`runtime` None) run on any ONNX runtime and every artifact has them; a variant is written wherever the model
    allows it, and a backend that runs it finds it among the artifact's entries."""

    name: str
    file: str
    spec: Callable[[ModelConfig, str], GraphSpec]
    builder: str
    runtime: str | None = None
    ops: tuple[str, ...] = ()
    unsupported: Callable[[ModelConfig, str], str | None] = lambda config, precision: None
    shares: str | None = None
    default: bool = True  # written by `twostep export` unless left out (False: only when asked for)

    @property
    def variant(self) -> bool:
        return self.runtime is not None


# The list of graph builders: what `twostep export` writes, in this order, and what load_artifact accepts.
GRAPHS: dict[str, GraphInfo] = {info.name: info for info in (
    GraphInfo("encoder", "encoder.onnx", encoder_spec, "twostep.exporter.graphs:export_encoder"),
    GraphInfo("decoder", "decoder.onnx", decoder_spec, "twostep.exporter.graphs:export_decoder"),
    GraphInfo(INPLACE, INPLACE_FILE, inplace_spec, "twostep.exporter.inplace:export_inplace",
              runtime="onnxruntime", ops=("com.microsoft.GroupQueryAttention",), unsupported=inplace_unsupported,
              shares="decoder"),
    GraphInfo(STANDARD_INPLACE, STANDARD_INPLACE_FILE, standard_inplace_spec,
              "twostep.exporter.inplace:export_standard",
              runtime=f"opset {STANDARD_OPSET}", ops=("TensorScatter", "Attention"), shares="decoder", default=False),
)}
CONTRACT = tuple(name for name, info in GRAPHS.items() if not info.variant)  # every artifact's two graphs
