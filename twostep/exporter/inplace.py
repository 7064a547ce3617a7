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

`decoder_inplace_standard` is the same graph, I/O and binding in standard ONNX (opset 24) instead of the
contrib op: each layer writes its new K/V into the buffers with `TensorScatter` (at each row's length, the
`write_indices`) and attends over them with `Attention`, whose boolean mask (rows, 1, new_len, capacity),
computed once a step from the lengths, lets query t of row r see positions up to past_lengths[r] + t. Any
runtime with opset 24 runs it, in place where past and present are bound to one buffer; the mask rather than
Attention's `nonpad_kv_seqlen` because TensorRT's parser refuses the latter. It takes several new tokens on a
past too. On ONNX Runtime's CPU provider it is the slower of the two (Attention-24 works over the whole
capacity, GroupQueryAttention over each row's length: docs/benchmarks.md), so ort-cpu decodes with it only
when asked (kv_cache "standard").
"""

from __future__ import annotations

from pathlib import Path

import onnx
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.export import Dim

from twostep.artifact.spec import STANDARD_OPSET, inplace_spec, search_width, standard_inplace_spec
from twostep.exporter.graphs import TRACE_SIZES, example_inputs, trace
from twostep.model.graphs import decoder_outputs
from twostep.model.transformer import KV, Transformer


@torch.library.custom_op("twostep::group_query_attention", mutates_args=())
def group_query_attention(qkv: Tensor, past_key: Tensor, past_value: Tensor, seqlens_k: Tensor,
                          total_sequence_length: Tensor, bias: Tensor | None, num_heads: int,
                          scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """Stands for ONNX Runtime's kernel, with query, key and value packed in one tensor (B, T, 3 * H * Dh) and
    the relative bias over the cache's columns (B, H, T, capacity) or None, while tracing; it has no eager
    implementation of its own (the exported graph is checked against the model's eager decode_step instead)."""
    raise NotImplementedError("twostep::group_query_attention only exists to be exported to ONNX")


@group_query_attention.register_fake
def _(qkv, past_key, past_value, seqlens_k, total_sequence_length, bias, num_heads, scale):
    b, t, _ = qkv.shape
    return qkv.new_empty(b, t, num_heads * past_key.shape[3]), torch.empty_like(past_key), torch.empty_like(past_value)


def onnx_group_query_attention(qkv, past_key, past_value, seqlens_k, total_sequence_length, bias, num_heads: int,
                               scale: float):
    rest = ()
    if bias is not None:  # the kernel takes the bias of total_sequence_length columns, a size the trace cannot know
        from onnxscript import opset18 as op

        ends = op.Reshape(op.Cast(total_sequence_length, to=onnx.TensorProto.INT64), op.Constant(value_ints=[1]))
        rest = (None, None, None, op.Slice(bias, op.Constant(value_ints=[0]), ends, op.Constant(value_ints=[3])))
    return _ort_op()(qkv, None, None, past_key, past_value, seqlens_k, total_sequence_length, *rest,
                     num_heads=num_heads, kv_num_heads=num_heads, scale=scale)


@torch.library.custom_op("twostep::cache_attention", mutates_args=())
def cache_attention(q: Tensor, k: Tensor, v: Tensor, past_key: Tensor, past_value: Tensor, write_indices: Tensor,
                    mask: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """Stands for TensorScatter + Attention (opset 24) while tracing: q, k, v (B, H, T, Dh) of the new tokens,
    the buffers (B, H, capacity, Dh), each row's write position and the mask (B, 1, T, capacity): boolean, or
    (a model with the relative bias) the bias with the masked positions at the dtype's minimum (B, H, T, capacity),
    which Attention adds to the scores."""
    raise NotImplementedError("twostep::cache_attention only exists to be exported to ONNX")


@cache_attention.register_fake
def _(q, k, v, past_key, past_value, write_indices, mask, scale):
    return torch.empty_like(q), torch.empty_like(past_key), torch.empty_like(past_value)


def onnx_cache_attention(q, k, v, past_key, past_value, write_indices, mask, scale: float):
    import onnxscript
    from onnx.defs import get_schema

    def op(name):
        return onnxscript.values.Op(onnxscript.values.Opset("", 24), name, get_schema(name, 24))

    key = op("TensorScatter")(past_key, k, write_indices, axis=-2)
    value = op("TensorScatter")(past_value, v, write_indices, axis=-2)
    attended = op("Attention")(q, key, value, mask, scale=scale)  # the outputs its schema declares: Y first
    return (attended[0] if isinstance(attended, tuple) else attended), key, value


def _ort_op():
    """The contrib op for onnxscript, which knows no com.microsoft schemas: declared here, inputs and
    attributes as ONNX Runtime's contrib_defs give them, up to attention_bias (the inputs after it left out)."""
    import onnxscript
    from onnx.defs import OpSchema

    param, attr = OpSchema.FormalParameter, OpSchema.Attribute
    schema = OpSchema(
        "GroupQueryAttention", "com.microsoft", 1,
        inputs=[param("query", "T"), param("key", "T"), param("value", "T"), param("past_key", "T"),
                param("past_value", "T"), param("seqlens_k", "M"), param("total_sequence_length", "M"),
                *(param(name, "T", param_option=OpSchema.FormalParameterOption.Optional)
                  for name in ("cos_cache", "sin_cache")),
                param("position_ids", "P", param_option=OpSchema.FormalParameterOption.Optional),
                param("attention_bias", "T", param_option=OpSchema.FormalParameterOption.Optional)],
        outputs=[param("output", "T"), param("present_key", "T"), param("present_value", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)"], ""), ("M", ["tensor(int32)"], ""),
                          ("P", ["tensor(int64)"], "")],
        attributes=[attr("num_heads", OpSchema.AttrType.INT, ""), attr("kv_num_heads", OpSchema.AttrType.INT, ""),
                    attr("scale", OpSchema.AttrType.FLOAT, "")],
    )
    return onnxscript.values.Op(onnxscript.values.Opset("com.microsoft", 1), "GroupQueryAttention", schema)


class InplaceDecoderGraph(nn.Module):
    """The model's decode_step, with each layer's cached self-attention handed to the contrib op (or, `standard`,
    to TensorScatter + Attention). Its three projections are one (their weights stacked): one matrix product a
    layer instead of three, which at batch 1 (where each product's fixed cost counts) is a tenth of a step."""

    def __init__(self, model: Transformer, standard: bool = False):
        super().__init__()
        self.model, self.standard = model, standard
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
        device, relative = input_ids.device, self.model.decoder.relative_bias
        query_pos = past_lengths[:, None] + torch.arange(new_len, device=device)  # (B, T): the cache's columns
        bias = None
        if self.standard:  # query t of row r sees positions up to past_lengths[r] + t: (B, 1, T, capacity)
            key_pos = torch.arange(past_self[0].shape[2], device=device)
            mask = (key_pos <= query_pos[:, :, None])[:, None]
            if relative is not None:  # the bias, and the dtype's minimum where masked: (B, H, T, capacity)
                bias = relative(query_pos, key_pos[None])
                mask = bias.masked_fill(~mask, torch.finfo(bias.dtype).min)
        elif relative is not None:  # (B, H, T, capacity), cut to the step's total length in the graph
            bias = relative(query_pos, torch.arange(past_self[0].shape[2], device=device)[None])

        def attend(attn: nn.Module, h: Tensor, past: KV) -> tuple[Tensor, KV]:
            i = next(layers)
            qkv = F.linear(h, getattr(self, f"qkv_weight_{i}"), getattr(self, f"qkv_bias_{i}", None))
            scale = attn.scale
            if not self.standard:
                out, key, value = torch.ops.twostep.group_query_attention(
                    qkv, past[0], past[1], seqlens_k, total, bias, attn.n_heads, scale)
                return attn.out_proj(out), (key, value)
            b, t, _ = qkv.shape
            sizes = [attn.n_heads * attn.d_k, attn.n_heads * attn.d_k, attn.n_heads * attn.d_v]
            q, k, v = (x.view(b, t, attn.n_heads, -1).transpose(1, 2) for x in qkv.split(sizes, dim=-1))
            out, key, value = torch.ops.twostep.cache_attention(q, k, v, past[0], past[1], past_lengths, mask, scale)
            return attn.out_proj(out.transpose(1, 2).reshape(b, t, -1)), (key, value)

        return decoder_outputs(self.model, search_width(self.model.config), input_ids, encoder_attention_mask,
                               past_lengths, past_self, past_cross, attend)


def export_inplace(model: Transformer, path: Path, opset: int, standard: bool = False) -> None:
    """Trace with a cache buffer of capacity `past_len + new_len` of the plain trace sizes."""
    spec = (standard_inplace_spec if standard else inplace_spec)(model.config)
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
    translations = {torch.ops.twostep.group_query_attention.default: onnx_group_query_attention,
                    torch.ops.twostep.cache_attention.default: onnx_cache_attention}
    trace(InplaceDecoderGraph(model, standard).eval(), (ids, mask, lengths, buffers, cross), dynamic, spec, path,
          max(opset, STANDARD_OPSET) if standard else opset, custom_translation_table=translations)


def export_standard(model: Transformer, path: Path, opset: int) -> None:
    """The in-place decoder in opset 24's TensorScatter + Attention (at opset 24 whatever the artifact's)."""
    export_inplace(model, path, opset, standard=True)
