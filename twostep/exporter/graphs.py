"""Tracing the model's graph wrappers (twostep.model.graphs) into ONNX: the encoder and the plain decoder,
the contract's two graphs (twostep.artifact.spec). Every builder is called as builder(model, path, opset).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import onnx_ir as ir
import torch
from torch.export import Dim

from twostep.artifact.spec import GraphSpec, graph_specs, search_width
from twostep.exporter import shared
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
    shapes): tracing here first halves the time, and validation proves the graph on sizes 0 and 1.

    The weights are never copied whole. The translation is left unoptimized and its Transposes of weights (a
    Linear's x @ W.T) become lazy initializers (fold_weight_transposes) before the optimizer runs: folded by the
    optimizer, each would be a new array held in memory until the save, a whole copy of the graph's weights.
    The save (save_graph_ir) computes them one by one as it writes them."""
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # e.g. "torchvision is not installed"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and axis-renaming chatter
        program = torch.export.export(module, inputs, dynamic_shapes=shapes, strict=False)
        onnx_program = torch.onnx.export(
            program, inputs, dynamo=True, dynamic_shapes=shapes, input_names=spec.input_names,
            output_names=spec.output_names, opset_version=opset, optimize=False, verbose=False, **options,
        )
        fold_weight_transposes(onnx_program.model)
        onnx_program.optimize()
        save_graph_ir(onnx_program.model, path, external=shared.parameter_bytes(module) > shared.EXTERNAL_DATA_BYTES)


def fold_weight_transposes(model: ir.Model) -> int:
    """Every Transpose of an initializer becomes an initializer of the transposed weight, computed only when it
    is written (an onnx-ir LazyTensor); the weight itself stays where something else reads it (a tied
    embedding's Gather). Returns how many."""
    graph = model.graph
    folded = 0
    for node in list(graph):
        source = node.inputs[0] if node.op_type == "Transpose" and node.domain == "" and node.inputs else None
        if source is None or not source.is_initializer() or source.const_value is None:
            continue
        perm = node.attributes.get_ints("perm", None)
        weight = source.const_value
        if perm is None:
            perm = list(range(len(weight.shape)))[::-1]
        shape = ir.Shape([weight.shape[axis] for axis in perm])
        def transposed(weight=weight, perm=tuple(perm)) -> np.ndarray:
            return np.ascontiguousarray(weight.numpy().transpose(perm))

        lazy = ir.LazyTensor(transposed, dtype=weight.dtype, shape=shape, name=node.outputs[0].name)
        value = ir.Value(name=node.outputs[0].name, shape=shape, type=ir.TensorType(weight.dtype), const_value=lazy)
        graph.register_initializer(value)
        node.outputs[0].replace_all_uses_with(value)
        graph.remove(node, safe=True)
        if not source.uses() and not source.is_graph_output():
            graph.initializers.pop(source.name)
        folded += 1
    return folded


def save_graph_ir(model: ir.Model, path: Path, external: bool) -> None:
    """Write `model` to `path`: inline, or (`external`: a model past shared.EXTERNAL_DATA_BYTES of parameters)
    with its weights as external data in `<name>.data` beside it, written tensor by tensor (lazy ones computed
    as they are written, at most IN_FLIGHT bytes at once) at page-aligned offsets, which ONNX Runtime maps."""
    if not external:
        ir.save(model, str(path))
        return
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)
    ir.save(model, str(path), external_data=data.name, size_threshold_bytes=shared.SMALLEST, max_workers=1,
            max_in_flight_bytes=shared.IN_FLIGHT, alignment=shared.PAGE, align_threshold=0)


def export_encoder(model: Transformer, path: Path, opset: int) -> None:
    export_graph(model, "encoder", graph_specs(model.config)["encoder"], path, opset)


def export_decoder(model: Transformer, path: Path, opset: int) -> None:
    export_graph(model, "decoder", graph_specs(model.config)["decoder"], path, opset)
