"""int8: ONNX Runtime dynamic quantization of the weight MatMuls (activations quantized per call).

On AVX2 machines without VNNI, ONNX Runtime's u8s8 kernels can saturate their 16-bit intermediate sums;
`reduce_range` (7-bit weights) avoids that. Attention's activation-by-activation MatMuls stay fp32
(`MatMulConstBOnly`), as do the LayerNorms and the softmax. A weight a MatMul reads through a Transpose (a
generator tied to the embedding table) is transposed once, before quantizing, so that it is quantized too.
"""

from __future__ import annotations

import logging
from pathlib import Path

from twostep.artifact.trust import external_data_locations
from twostep.exporter.shared import save_graph

QUANTIZATION = {"op_types": ["MatMul"], "weight_type": "QInt8", "per_channel": True, "reduce_range": True,
                "matmul_const_b_only": True}


def quantize_int8(path: Path) -> dict:
    """Quantize the graph at `path`, replacing it; returns the settings, for the manifest."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    q = QUANTIZATION
    fp32 = path.with_suffix(".fp32.onnx")
    path.rename(fp32)
    transpose_constant_weights(fp32)
    external = bool(external_data_locations(fp32))  # a large graph (twostep.exporter.shared): so is its output
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs advice on the root logger
    try:
        quantize_dynamic(
            str(fp32), str(path), op_types_to_quantize=q["op_types"],
            weight_type=getattr(QuantType, q["weight_type"]), per_channel=q["per_channel"],
            reduce_range=q["reduce_range"], extra_options={"MatMulConstBOnly": q["matmul_const_b_only"]},
            use_external_data_format=external,
        )
    finally:
        root.setLevel(level)
        for name in external_data_locations(fp32):
            (fp32.parent / name).unlink(missing_ok=True)
        fp32.unlink()
    return dict(q)


def transpose_constant_weights(path: Path) -> int:
    """MatMul(x, Transpose(W)) with W an initializer becomes MatMul(x, W_t), W_t a new initializer (W itself
    stays for its other readers, the embedding's Gather): the quantizer only quantizes constant weights, and a
    tied generator (the d x vocab product, the largest of a step) would stay fp32. A graph with external data is
    saved again in any case, its data in a file of its own name. Returns how many."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    done = 0
    for node in list(graph.node):
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
        if node.op_type != "Transpose" or node.input[0] not in weights or perm != [1, 0]:
            continue
        users = readers.get(node.output[0], [])
        if not users or any(u.op_type != "MatMul" or u.input[1] != node.output[0] for u in users):
            continue
        array = numpy_helper.to_array(weights[node.input[0]])
        graph.initializer.append(numpy_helper.from_array(array.T.copy(), node.output[0]))
        graph.node.remove(node)  # its output is now the initializer of the same name
        done += 1
    if done or external_data_locations(path):
        save_graph(model, path)
    return done


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
