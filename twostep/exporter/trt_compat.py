"""Would TensorRT's ONNX parser accept these graphs? Checked on the CPU, without TensorRT.

The table is TensorRT's published operator support list (onnx-tensorrt `docs/operators.md`, TensorRT 10.x:
opsets 9 to 24), restricted to the ops and data types that matter for encoder-decoder graphs. Every node
is checked: its op is supported, its input data types are ones TensorRT takes for that op, it uses the
default ONNX domain (no com.microsoft contrib ops), and the restrictions that bite dynamic-shape graphs
hold (axes inputs that must be constants, LayerNormalization's extra outputs unused).
"""

from __future__ import annotations

from pathlib import Path

import onnx

OPSET_RANGE = (9, 24)

_F = "FP32 FP16 BF16"
_FI = "FP32 FP16 BF16 INT32 INT64"
_ALL = "FP32 FP16 BF16 INT32 INT64 BOOL"
SUPPORTED: dict[str, set[str]] = {op: set(types.split()) for op, types in {
    "Abs": _FI, "Add": _FI, "And": "BOOL", "ArgMax": _FI, "ArgMin": _FI, "Cast": _ALL + " UINT8",
    "CastLike": _ALL + " UINT8", "Ceil": _F, "Clip": _F, "Concat": _ALL, "Constant": _ALL,
    "ConstantOfShape": _ALL, "Cos": _F, "CumSum": _F, "Div": _FI, "Dropout": _F, "Einsum": _F, "Elu": _F,
    "Equal": _FI, "Erf": _F, "Exp": _F, "Expand": _ALL, "Flatten": _ALL, "Floor": _F, "Gather": _ALL,
    "GatherElements": _ALL, "GatherND": _ALL, "Gelu": _FI, "Gemm": _F, "Greater": _FI, "GreaterOrEqual": _FI,
    "Identity": _ALL, "If": _ALL, "IsInf": _F, "IsNaN": _FI, "LayerNormalization": _F, "LeakyRelu": _F,
    "Less": _FI, "LessOrEqual": _FI, "Log": _F, "LogSoftmax": _F, "MatMul": _F, "Max": _FI, "Min": _FI,
    "Mod": _FI, "Mul": _FI, "Neg": _FI, "Not": "BOOL", "Or": "BOOL", "Pad": _FI, "Pow": _FI,
    "Range": _FI, "Reciprocal": _F, "ReduceMax": _FI, "ReduceMean": _FI, "ReduceMin": _FI, "ReduceSum": _FI,
    "Relu": _FI, "Reshape": _ALL, "RMSNormalization": _F, "Shape": _ALL, "Sigmoid": _F, "Sign": _FI,
    "Sin": _F, "Size": _ALL, "Slice": _ALL, "Softmax": _F, "Split": _ALL, "Sqrt": _F, "Squeeze": _ALL,
    "Sub": _FI, "Sum": _FI, "Tanh": _F, "Tile": _ALL, "TopK": _FI, "Transpose": _ALL, "Trilu": _ALL,
    "Unsqueeze": _ALL, "Where": _ALL, "Xor": "BOOL",
    # opset 24's cache ops (TensorRT 10.15): the cache's types, and TensorScatter's int64 write_indices and
    # Attention's boolean mask, which their schemas require
    "TensorScatter": "FP32 FP16 BF16 INT32 INT64", "Attention": _F + " BOOL",
}.items()}

# Inputs that TensorRT needs as build-time constants: (op, input index).
CONSTANT_INPUTS = {("Squeeze", 1), ("Unsqueeze", 1), ("ReduceMean", 1), ("ReduceSum", 1), ("ReduceMax", 1),
                   ("ReduceMin", 1), ("TopK", 1), ("CumSum", 1)}

TYPE_NAMES = {onnx.TensorProto.FLOAT: "FP32", onnx.TensorProto.FLOAT16: "FP16", onnx.TensorProto.BFLOAT16: "BF16",
              onnx.TensorProto.INT32: "INT32", onnx.TensorProto.INT64: "INT64", onnx.TensorProto.BOOL: "BOOL",
              onnx.TensorProto.UINT8: "UINT8", onnx.TensorProto.INT8: "INT8", onnx.TensorProto.DOUBLE: "DOUBLE"}


def cache_op_problems(node: onnx.NodeProto, consumed: set[str]) -> list[str]:
    """The parser's restrictions on opset 24's cache ops: TensorScatter along axis -2 only; Attention without
    past_key, past_value and nonpad_kv_seqlen, and with its first output only."""
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "TensorScatter" and attributes.get("axis", -2) != -2:
        return [f"TensorRT takes TensorScatter along axis -2 only, not {attributes['axis']}"]
    if node.op_type == "Attention":
        problems = [f"TensorRT takes no Attention input {name}" for i, name in
                    enumerate(("past_key", "past_value", "nonpad_kv_seqlen"), start=4)
                    if i < len(node.input) and node.input[i]]
        if any(o in consumed for o in node.output[1:]):
            problems.append("TensorRT supports only Attention's first output")
        return problems
    return []


def check_trt_compatible(path: Path) -> list[str]:
    """Every reason TensorRT's ONNX parser would refuse the graph; empty when it would take it."""
    model = onnx.load(str(path), load_external_data=False)  # types and shapes only: no weights needed
    del model.graph.value_info[:]  # types of every intermediate value, inferred afresh
    model = onnx.shape_inference.infer_shapes(model)
    g = model.graph
    problems = []
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and not OPSET_RANGE[0] <= opset.version <= OPSET_RANGE[1]:
            problems.append(f"opset {opset.version} outside TensorRT's {OPSET_RANGE[0]}..{OPSET_RANGE[1]}")
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.output, *g.value_info]}
    types.update({t.name: t.data_type for t in g.initializer})
    constants = {t.name for t in g.initializer} | {o for n in g.node if n.op_type == "Constant" for o in n.output}
    consumed = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    for node in g.node:
        where = f"{path.name}: {node.op_type} node {node.name!r}"
        if node.domain not in ("", "ai.onnx"):
            problems.append(f"{where}: custom domain {node.domain!r} (export without --optimize for TensorRT)")
            continue
        if node.op_type not in SUPPORTED:
            problems.append(f"{where}: op not supported by TensorRT's ONNX parser")
            continue
        for name in node.input:
            if name and name in types and TYPE_NAMES.get(types[name], "?") not in SUPPORTED[node.op_type]:
                problems.append(f"{where}: input {name!r} is {TYPE_NAMES.get(types[name], types[name])}, "
                                f"TensorRT takes {sorted(SUPPORTED[node.op_type])}")
        for index, name in enumerate(node.input):
            if (node.op_type, index) in CONSTANT_INPUTS and name and name not in constants:
                problems.append(f"{where}: input {index} ({name!r}) must be a build-time constant for TensorRT")
        if node.op_type == "LayerNormalization" and any(o in consumed for o in node.output[1:]):
            problems.append(f"{where}: TensorRT supports only LayerNormalization's first output")
        problems += [f"{where}: {p}" for p in cache_op_problems(node, consumed)]
    for value in [*g.input, *g.output]:
        elem = TYPE_NAMES.get(value.type.tensor_type.elem_type, "?")
        if elem not in {"FP32", "FP16", "BF16", "INT32", "INT64", "BOOL", "UINT8"}:
            problems.append(f"{path.name}: graph I/O {value.name!r} has type {elem}, which TensorRT does not take")
    return problems
