"""int8: ONNX Runtime dynamic quantization of the weight MatMuls (activations quantized per call).

On AVX2 machines without VNNI, ONNX Runtime's u8s8 kernels can saturate their 16-bit intermediate sums;
`reduce_range` (7-bit weights) avoids that. Attention's activation-by-activation MatMuls stay fp32
(`MatMulConstBOnly`), as do the LayerNorms and the softmax. A weight a MatMul reads through a Transpose (a
generator tied to the embedding table) was folded into a weight of its own when the graph was traced
(twostep.exporter.graphs.fold_weight_transposes), so that it is quantized too.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx

from twostep.artifact.trust import external_data_locations
from twostep.exporter.shared import PAGE, SMALLEST, external_span, point_to, save_graph

QUANTIZE_CHUNK = 16 << 20  # bytes of a weight's columns quantized at once (quantize_columns)
QUANTIZATION = {"op_types": ["MatMul"], "weight_type": "QInt8", "per_channel": True, "reduce_range": True,
                "matmul_const_b_only": True}


def quantize_int8(path: Path) -> dict:
    """Quantize the graph at `path` in place, weight by weight (quantize_weights); returns the settings, for the
    manifest.

    ONNX Runtime's quantize_dynamic loads the whole graph and holds about three times its weights: at a 3B
    model's size, more than the machine. Here each MatMul whose B is a weight is quantized by quantize_dynamic
    itself, with the same settings, as a one-node model (X @ W, named as in the graph): its nodes
    (DynamicQuantizeLinear of X, once for all the products that read X, as quantize_dynamic shares it;
    MatMulInteger; the scales' Muls) replace the MatMul. The numerics are quantize_dynamic's by construction."""
    quantize_weights(path, quantize_product, column_axis=-1)
    return dict(QUANTIZATION)


def quantize_weights(path: Path, quantize_product, column_axis: int) -> None:
    """Replace each MatMul of the graph at `path` whose B is a 2-D float weight by the nodes
    `quantize_product(node, weight, directory)` gives, in place; the tensors it gives are written to the graph's
    new data file as they come. The graph's structure is loaded without its data: memory holds one weight and its
    quantization at a time (quantize_columns: a few columns of it). `column_axis`: the axis along which the
    tensors `quantize_product` gives hold the weight's columns (output channels)."""
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    data = path.with_name(path.name + ".q.data")
    external = any(external_span(t) for t in weights.values())  # a large graph (shared.py): so is its output
    nodes, added, quantized, done = [], [], set(), set()
    with open(data, "wb") as out:
        for node in graph.node:
            weight = weights.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
            if weight is None or weight.data_type != onnx.TensorProto.FLOAT or len(weight.dims) != 2:
                nodes.append(node)
                continue
            replacing, tensors = quantize_columns(node, read_array(path.parent, weight), path.parent,
                                                  quantize_product, column_axis)
            nodes += [n for n in replacing if not (n.op_type == "DynamicQuantizeLinear" and n.input[0] in quantized)]
            quantized.add(node.input[0])
            if weight.name not in done:  # a weight two products read is quantized once, as quantize_dynamic does
                added += [append_external(t, out, data.name) if external else t for t in tensors]
                done.add(weight.name)
        written = out.tell()
    read = {name for node in nodes for name in node.input} | {v.name for v in graph.output}
    kept = [t for t in graph.initializer if t.name in read] + added
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if any(n.domain == "com.microsoft" for n in nodes) and all(o.domain != "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    stale = {span[0] for t in weights.values() if (span := external_span(t))} - \
        {span[0] for t in kept if (span := external_span(t))}
    onnx.save(model, str(path))
    for name in stale:
        (path.parent / name).unlink(missing_ok=True)
    if not written:  # a small graph's tensors stay inline
        data.unlink()


def append_external(tensor: onnx.TensorProto, out, location: str) -> onnx.TensorProto:
    """Move a tensor's bytes (SMALLEST or more) to the end of the open data file `out`, page-aligned."""
    if len(tensor.raw_data) < SMALLEST:
        return tensor
    out.write(bytes(-out.tell() % PAGE))
    offset = out.tell()
    point_to(tensor, location, offset, out.write(tensor.raw_data))
    return tensor


def read_array(directory: Path, tensor) -> np.ndarray:
    """An initializer's values, read from its external data where it has some (a read, not a mapping)."""
    from onnx import numpy_helper

    span = external_span(tensor)
    if span is None:
        return numpy_helper.to_array(tensor)
    location, offset, length = span
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    with open(directory / location, "rb") as f:
        f.seek(offset)
        array = np.fromfile(f, dtype=dtype, count=length // dtype.itemsize)
    return array.reshape(tuple(tensor.dims))


def quantize_columns(node, weight: np.ndarray, directory: Path, quantize_product,
                     column_axis: int) -> tuple[list, list]:
    """quantize_product, on QUANTIZE_CHUNK bytes of the weight's columns at a time: int8's quantization is per
    column (per output channel), int4's per block of a column, so the pieces' tensors joined along
    `column_axis` are the whole's; the quantizer's own copies (several of what it is given) stay a few chunks'
    worth, not a 256k-row table's. A node that states its weight's column count (MatMulNBits' N) is given the
    whole's."""
    from onnx import numpy_helper

    rows, columns = weight.shape
    step = max(1, QUANTIZE_CHUNK // max(1, rows * weight.itemsize))
    if step >= columns:
        return quantize_product(node, weight, directory)
    nodes, pieces = [], []
    for start in range(0, columns, step):
        nodes, tensors = quantize_product(node, np.ascontiguousarray(weight[:, start : start + step]), directory)
        pieces.append({t.name: numpy_helper.to_array(t) for t in tensors})
    joined = [numpy_helper.from_array(np.concatenate([piece[name] for piece in pieces], axis=column_axis), name)
              for name in pieces[0]]
    for n in nodes:
        for attribute in n.attribute:
            if attribute.name == "N":
                attribute.i = columns
    return nodes, joined


def one_product(node, weight: np.ndarray) -> onnx.ModelProto:
    """The model of the one product `node` (X @ W, W = `weight`), named as in the graph."""
    from onnx import helper, numpy_helper

    x, w = node.input
    product = helper.make_graph(
        [helper.make_node("MatMul", [x, w], list(node.output), node.name)], "product",
        [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, ["rows", weight.shape[0]])],
        [helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, w)])
    return helper.make_model(product, opset_imports=[helper.make_opsetid("", 18)])


def quantize_product(node, weight: np.ndarray, directory: Path) -> tuple[list, list]:
    """quantize_dynamic's nodes and initializers for the one product `node` (X @ W, W = `weight`)."""
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    q = QUANTIZATION
    one = one_product(node, weight)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs advice on the root logger
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        try:
            quantize_dynamic(one, Path(tmp) / "q.onnx", op_types_to_quantize=q["op_types"],
                             weight_type=getattr(QuantType, q["weight_type"]), per_channel=q["per_channel"],
                             reduce_range=q["reduce_range"],
                             extra_options={"MatMulConstBOnly": q["matmul_const_b_only"]})
        finally:
            root.setLevel(level)
        quantized = onnx.load(str(Path(tmp) / "q.onnx"))
    return list(quantized.graph.node), list(quantized.graph.initializer)


def fuse_transformer_ops(path: Path, n_heads: int, d_model: int) -> dict:
    """ONNX Runtime's offline transformer fusions (SkipLayerNormalization, attention where it matches),
    written back in place. The fused graph uses com.microsoft ops: ONNX Runtime only, not TensorRT."""
    from onnxruntime.transformers import optimizer

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        model = optimizer.optimize_model(str(path), model_type="bert", num_heads=n_heads, hidden_size=d_model,
                                         opt_level=0, use_gpu=False)
        model.save_model_to_file(str(path), use_external_data_format=bool(external_data_locations(path)))
        fused = {op: n for op, n in model.get_fused_operator_statistics().items() if n}
    finally:
        root.setLevel(level)
    return fused


# Numerically fragile in fp16: normalisation statistics and the softmax. These stay fp32 (with casts around
# them); the mask value is clamped into fp16's range (-65504) by the converter, and the softmax that consumes
# it runs in fp32.
FP16_KEEP_FP32 = ("LayerNormalization", "Softmax", "ReduceMean", "ReduceSum", "Pow", "Sqrt", "Reciprocal")


def convert_fp16(path: Path) -> dict:
    """fp16 weights and activations, I/O included (float16 KV cache), fragile ops kept in fp32."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = onnx.load(str(path))
    present = sorted({n.op_type for n in model.graph.node} & set(FP16_KEEP_FP32))
    kept = sum(n.op_type in present for n in model.graph.node)
    model = OnnxModel(convert_float_to_float16(model, keep_io_types=False, op_block_list=present))
    model.topological_sort()  # the converter appends its Cast nodes out of order
    del model.model.graph.value_info[:]  # it also leaves stale fp32 types on intermediate values
    save_graph(model.model, path)  # then inferred from the file: a model past 2 GB cannot be in memory
    onnx.shape_inference.infer_shapes_path(str(path), str(path), strict_mode=True)
    return {"kept_fp32_op_types": present, "kept_fp32_nodes": kept, "mask_value": -65504.0}
