"""int4: ONNX Runtime's MatMulNBits, weight-only 4-bit quantization for the CPU.

Every weight MatMul becomes a com.microsoft MatMulNBits: each column of the (K, N) weight is cut along K into
blocks of `block_size` values, each block stored as 4-bit integers with an fp32 scale (and, asymmetric, a 4-bit
zero point); the activations stay fp32, and `accuracy_level` 4 has the CPU kernel quantize them to int8 per
block and multiply in int8 (1: in fp32, on the weights unpacked). A weight a MatMul reads through a Transpose (a
generator tied to the embedding table) was folded into a weight of its own when the graph was traced
(twostep.exporter.graphs.fold_weight_transposes), so that the largest product of a step is quantized too.
Attention's activation-by-activation MatMuls, the embedding's Gather, the norms and the softmax stay fp32.

ONNX Runtime's quantizer (onnxruntime.quantization.matmul_nbits_quantizer, 1.32) pads K up to a whole block
and takes any N, so every 2-D weight of a twostep graph can be quantized; the block size must be a power of
2 of 16 or more (MLAS refuses others). What it leaves as it was, without an error, is a MatMul weight it cannot
take: a constant of rank above 2 whose leading dimensions are not all 1, or one computed in the graph (read
through an op other than the Transpose folded here). A graph left with such a weight is refused, naming them:
an int4 artifact with fp32 matrices in it would read most of its weights at fp32's cost.
"""

from __future__ import annotations

import logging
from pathlib import Path

from twostep.errors import BadInput

# Chosen by measurement (benchmarks/int4.py; docs/benchmarks.md, "int4"), at MADLAD-400's layer shape (d_model
# 1024, d_ff 8192, 4+4 layers; greedy batch 1, one thread): accuracy level 4 decodes 1.8 times as fast as 1 (fp32
# compute; 0, unset, is the same kernel) at the same logits. Blocks of 32 take 16.8 ms a token (64: 15.7, 128:
# 13.4; int8 18.6) and are the closest to fp32 (logits 0.16 of their RMS off fp32's; 64: 0.18, 128: 0.20; int8
# 0.04) and agree best on the MADLAD-shaped test model: quality first, the speed of larger blocks measured and
# given up. Asymmetric (a 4-bit zero point a block: 2.5% more bytes) is 2-5% closer than symmetric, at no measured
# cost in time.
QUANTIZATION = {"op_type": "MatMulNBits", "bits": 4, "block_size": 32, "symmetric": False, "accuracy_level": 4,
                "algorithm": "round to nearest"}
QUANTIZER_LOGGER = "onnxruntime.quantization.matmul_nbits_quantizer"  # it logs each node at INFO


def quantize_int4(path: Path, block_size: int | None = None, symmetric: bool | None = None,
                  accuracy_level: int | None = None) -> dict:
    """Quantize the graph at `path` to MatMulNBits in place, weight by weight; returns the settings, for the
    manifest. They default to QUANTIZATION's (others: benchmarks/int4.py's sweep).

    Each 2-D weight of a MatMul is quantized by ONNX Runtime's MatMulNBitsQuantizer itself as a one-node model
    (twostep.exporter.quantize.quantize_weights, as int8 is), a few columns at a time: its blocks run along a
    column, so the pieces joined are the whole's, and memory holds one weight at a time, not the whole graph
    the quantizer would load. A weight it would leave fp32 is refused before anything is quantized."""
    import onnx

    from twostep.exporter.quantize import one_product, quantize_weights

    q = dict(QUANTIZATION)
    q.update({k: v for k, v in (("block_size", block_size), ("symmetric", symmetric),
                                ("accuracy_level", accuracy_level)) if v is not None})
    structure = onnx.load(str(path), load_external_data=False)
    takes = {t.name for t in structure.graph.initializer
             if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2}
    left = [name for name in fp32_weights(structure) if name not in takes]
    del structure
    if left:
        raise BadInput(f"--dtype int4 cannot quantize {len(left)} weight matri{'x' if len(left) == 1 else 'ces'} of "
                       f"{path.name} ({', '.join(left[:3])}{', ...' if len(left) > 3 else ''}): ONNX Runtime's "
                       "MatMulNBits takes 2-D constant weights only; export with --dtype int8 or fp32")

    quantizer = nbits_quantizer()

    def product(node, weight, directory):
        one = quantizer(one_product(node, weight), bits=q["bits"], block_size=q["block_size"],
                        is_symmetric=q["symmetric"], accuracy_level=q["accuracy_level"] or None,
                        op_types_to_quantize=("MatMul",))
        one.process()
        graph = one.model.model.graph
        return list(graph.node), list(graph.initializer)

    logger = logging.getLogger(QUANTIZER_LOGGER)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        quantize_weights(path, product, column_axis=0)
    finally:
        logger.setLevel(level)
    return q


def nbits_quantizer():
    """ONNX Runtime's MatMulNBitsQuantizer. Its module calls logging.basicConfig at INFO on import, which would
    print every library's INFO records for the rest of the process: the root logger is put back as it was."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)
    return MatMulNBitsQuantizer


def fp32_weights(model) -> list[str]:
    """The MatMuls whose weight is still a float matrix of the graph's constants: an initializer, a Constant
    node's value, or what ops compute from those alone (a Transpose of another permutation, a Cast, ...)."""
    import onnx

    graph = model.graph
    matrices = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) >= 2}
    constant = {t.name for t in graph.initializer}
    for node in graph.node:  # in topological order: what is computed from constants alone is constant too
        if node.op_type == "Constant" or all(name in constant for name in node.input if name):
            constant.update(node.output)
            if node.op_type != "Constant" and any(name in matrices for name in node.input):
                matrices.update(node.output)
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if node.op_type == "Constant" and value is not None and len(value.dims) >= 2:
                matrices.update(node.output)
    return [node.input[1] for node in graph.node if node.op_type == "MatMul" and node.input[1] in matrices]
