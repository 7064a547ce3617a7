"""An ONNX Runtime-only decoder whose self-attention cache is a buffer written in place.

The plain decoder (`decoder.onnx`) takes the cache of `past_len` positions and returns a new one of
`past_len + new_len`: its `Concat` copies the whole cache every step, and a host session then holds (and
beam search reorders) a fresh copy each step. This variant runs each layer's self-attention as ONNX
Runtime's `com.microsoft.GroupQueryAttention` (with as many K/V heads as query heads, i.e. plain multi-head
attention), which takes a cache buffer of any capacity and, when its past and present are bound to the same
buffer, writes the new positions into it and attends over each row's own length (`past_lengths`):

decoder_inplace  input_ids [batch, new_len], encoder_attention_mask [batch, src_len], past_lengths [batch],
                 past_key_self_{i}, past_value_self_{i} [batch, heads, capacity, head_dim],
                 past_key_cross_{i}, past_value_cross_{i} [batch, heads, src_len, head_dim]
                 -> logits [batch, new_len, vocab], present_key_self_{i}, present_value_self_{i}
                    [batch, heads, capacity, head_dim] (the same buffers), and the search outputs
                    (log_norm, top_logits, top_ids: twostep.artifact.spec)

It is recorded in the manifest under `variants`, next to the two plain graphs, which stay what TensorRT,
the C++ library and other runtimes read. ONNX Runtime's CPU kernel needs head_dim a multiple of 8, equal
key and value head sizes, and one new token per step once the cache holds a past (or a batch of one).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.export import Dim

from twostep.artifact.spec import inplace_spec, search_width
from twostep.exporter.graphs import TRACE_SIZES, example_inputs, trace
from twostep.model.graphs import flatten, pairs, search_outputs
from twostep.model.transformer import KV, Transformer


@torch.library.custom_op("twostep::group_query_attention", mutates_args=())
def group_query_attention(qkv: Tensor, past_key: Tensor, past_value: Tensor, seqlens_k: Tensor,
                          total_sequence_length: Tensor, num_heads: int, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """Stands for ONNX Runtime's kernel, with query, key and value packed in one tensor (B, T, 3 * H * Dh),
    while tracing; it has no eager implementation of its own (the exported graph is checked against the
    model's eager decode_step instead)."""
    raise NotImplementedError("twostep::group_query_attention only exists to be exported to ONNX")


@group_query_attention.register_fake
def _(qkv, past_key, past_value, seqlens_k, total_sequence_length, num_heads, scale):
    b, t, _ = qkv.shape
    return qkv.new_empty(b, t, num_heads * past_key.shape[3]), torch.empty_like(past_key), torch.empty_like(past_value)


def onnx_group_query_attention(qkv, past_key, past_value, seqlens_k, total_sequence_length, num_heads: int,
                               scale: float):
    return _ort_op()(qkv, None, None, past_key, past_value, seqlens_k, total_sequence_length,
                     num_heads=num_heads, kv_num_heads=num_heads, scale=scale)


def _ort_op():
    """The contrib op for onnxscript, which knows no com.microsoft schemas: declared here, inputs and
    attributes as ONNX Runtime's contrib_defs give them (the optional rotary/bias inputs left out)."""
    import onnxscript
    from onnx.defs import OpSchema

    param, attr = OpSchema.FormalParameter, OpSchema.Attribute
    schema = OpSchema(
        "GroupQueryAttention", "com.microsoft", 1,
        inputs=[param("query", "T"), param("key", "T"), param("value", "T"), param("past_key", "T"),
                param("past_value", "T"), param("seqlens_k", "M"), param("total_sequence_length", "M")],
        outputs=[param("output", "T"), param("present_key", "T"), param("present_value", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)"], ""), ("M", ["tensor(int32)"], "")],
        attributes=[attr("num_heads", OpSchema.AttrType.INT, ""), attr("kv_num_heads", OpSchema.AttrType.INT, ""),
                    attr("scale", OpSchema.AttrType.FLOAT, "")],
    )
    return onnxscript.values.Op(onnxscript.values.Opset("com.microsoft", 1), "GroupQueryAttention", schema)


class InplaceDecoderGraph(nn.Module):
    """The model's decode_step, with each layer's cached self-attention handed to the contrib op. Its three
    projections are one (their weights stacked): one matrix product a layer instead of three, which at batch
    1 (where each product's fixed cost counts) is a tenth of a step, and the op takes the packed result."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        for i, layer in enumerate(model.decoder.layers):
            attn = layer.self_attn
            weight = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach()
            self.register_buffer(f"qkv_weight_{i}", weight)
            if attn.q_proj.bias is not None:
                bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).detach()
                self.register_buffer(f"qkv_bias_{i}", bias)

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, past_lengths: Tensor,
                past_self: list[Tensor], past_cross: list[Tensor]) -> tuple:
        new_len = input_ids.shape[1]
        seqlens_k = (past_lengths + (new_len - 1)).to(torch.int32)  # each row's total length - 1
        total = (past_lengths.max() + new_len).to(torch.int32)
        layers = iter(range(len(self.model.decoder.layers)))  # decode_step attends layer by layer, in order

        def attend(attn: nn.Module, h: Tensor, past: KV) -> tuple[Tensor, KV]:
            i = next(layers)
            qkv = F.linear(h, getattr(self, f"qkv_weight_{i}"), getattr(self, f"qkv_bias_{i}", None))
            out, key, value = torch.ops.twostep.group_query_attention(
                qkv, past[0], past[1], seqlens_k, total, attn.n_heads, 1.0 / math.sqrt(attn.d_k))
            return attn.out_proj(out), (key, value)

        logits, present = self.model.decode_step(input_ids, encoder_attention_mask, pairs(past_self),
                                                 pairs(past_cross), past_lengths, attend)
        return logits, flatten(present), *search_outputs(logits, search_width(self.model.config))


def export_inplace(model: Transformer, path: Path, opset: int) -> None:
    """Trace with a cache buffer of capacity `past_len + new_len` of the plain trace sizes."""
    spec = inplace_spec(model.config)
    ids, mask, _, past, cross = example_inputs(model, "decoder")
    b, p = ids.shape[0], TRACE_SIZES["past_len"]
    capacity = p + TRACE_SIZES["new_len"] + 1
    buffers = [torch.cat([t, t.new_zeros(b, t.shape[1], capacity - p, t.shape[3])], dim=2) for t in past]
    lengths = torch.full((b,), p, dtype=torch.long)
    bound = model.config.max_positions
    dims = {name: Dim(name, min=1, max=None if name in ("batch", "capacity") else bound)
            for name in ("batch", "new_len", "src_len", "capacity")}

    def axes(tensor_shape):
        return {i: dims[d] for i, d in enumerate(tensor_shape) if isinstance(d, str)}

    shapes = [axes(t.shape) for t in spec.inputs]
    n_self = len(spec.past_self)
    dynamic = (shapes[0], shapes[1], shapes[2], shapes[3 : 3 + n_self], shapes[3 + n_self :])
    trace(InplaceDecoderGraph(model).eval(), (ids, mask, lengths, buffers, cross), dynamic, spec, path, opset,
          custom_translation_table={torch.ops.twostep.group_query_attention.default: onnx_group_query_attention})
