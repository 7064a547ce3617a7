"""Tracing the model's graph wrappers (twostep.model.graphs) into ONNX: the encoder and the plain decoder,
the contract's two graphs (twostep.artifact.spec). Every builder is called as builder(model, path, opset).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch
from torch.export import Dim

from twostep.artifact.spec import GraphSpec, graph_specs, search_width
from twostep.model.graphs import DecoderGraph, EncoderGraph, flatten, pairs
from twostep.model.transformer import Transformer

# Example sizes for tracing: at least 2 on every dynamic axis (a size of 1 would be specialised away), and
# different from each other so that no two axes are mistaken for one; validation then runs on other shapes.
TRACE_SIZES = {"batch": 2, "src_len": 5, "new_len": 3, "past_len": 4}


def example_inputs(model: Transformer, graph: str) -> tuple:
    b, s, t, p = (TRACE_SIZES[k] for k in ("batch", "src_len", "new_len", "past_len"))
    vocab = min(model.config.src_vocab_size, model.config.tgt_vocab_size)
    ids = torch.randint(4, max(vocab, 5), (b, s))
    mask = torch.ones(b, s, dtype=torch.long)
    mask[1, -1] = 0
    if graph == "encoder":
        return ids, mask
    with torch.no_grad():
        cross = flatten(model.encode(ids, mask))
        prefix = torch.randint(4, max(vocab, 5), (b, p))
        _, past = model.decode_step(prefix, mask, model.empty_cache(b), pairs(cross))
    lengths = torch.arange(p, p - b, -1).clamp(min=0)  # rows at different positions: p, p - 1, ...
    return torch.randint(4, max(vocab, 5), (b, t)), mask, lengths, flatten(past), cross


def dynamic_shapes(spec: GraphSpec, graph: str, max_positions: int) -> tuple:
    """torch.export dims from the spec's symbolic axis names (composite output axes are derived). Lengths are
    bounded by the position table, which the encoder reads src_len rows of: torch.export refuses an unbounded
    src_len."""
    dims = {name: Dim(name, min=0 if name == "past_len" else 1, max=None if name == "batch" else max_positions)
            for name in TRACE_SIZES}

    def axes(tensor_shape):
        return {i: dims[d] for i, d in enumerate(tensor_shape) if isinstance(d, str)}

    shapes = [axes(t.shape) for t in spec.inputs]
    if graph == "encoder":
        return tuple(shapes)
    n_self = len(spec.past_self)
    return shapes[0], shapes[1], shapes[2], shapes[3 : 3 + n_self], shapes[3 + n_self :]


def export_graph(model: Transformer, graph: str, spec: GraphSpec, path: Path, opset: int) -> None:
    wrapper = (EncoderGraph(model) if graph == "encoder" else DecoderGraph(model, search_width(model.config))).eval()
    trace(wrapper, example_inputs(model, graph), dynamic_shapes(spec, graph, model.config.max_positions), spec,
          path, opset)


def trace(module: torch.nn.Module, inputs: tuple, shapes: tuple, spec: GraphSpec, path: Path, opset: int,
          **options) -> None:
    """One capture with torch.export (non-strict), then torch.onnx.export's translation of the program.
    torch.onnx.export's own capture runs in a size-oblivious mode in which a dim of size 1 cannot be proved
    apart from the rest, so it traced our decoder twice (the first capture refused, the second with refined
    shapes): tracing here first halves the time, and validation proves the graph on sizes 0 and 1."""
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # e.g. "torchvision is not installed"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and axis-renaming chatter
        program = torch.export.export(module, inputs, dynamic_shapes=shapes, strict=False)
        torch.onnx.export(
            program, inputs, str(path), dynamo=True, external_data=False, dynamic_shapes=shapes,
            input_names=spec.input_names, output_names=spec.output_names, opset_version=opset, optimize=True,
            verbose=False, **options,
        )


def export_encoder(model: Transformer, path: Path, opset: int) -> None:
    export_graph(model, "encoder", graph_specs(model.config)["encoder"], path, opset)


def export_decoder(model: Transformer, path: Path, opset: int) -> None:
    export_graph(model, "decoder", graph_specs(model.config)["decoder"], path, opset)
