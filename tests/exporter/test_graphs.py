"""The traced graphs (twostep/exporter/graphs.py): symbolic dimensions, one decoder graph for every step."""

from __future__ import annotations

import onnx


def test_graph_dims_are_symbolic(demo_artifact):
    model = onnx.load(str(demo_artifact / "decoder.onnx"))
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*model.graph.input, *model.graph.output]}
    assert dims["input_ids"] == ["batch", "new_len"]
    assert dims["past_value_self_2"] == ["batch", 4, "past_len", 32]
    assert dims["present_key_self_0"] == ["batch", 4, "past_len + new_len", 32]
    assert not any(node.op_type == "If" for node in model.graph.node)  # one graph for every step
