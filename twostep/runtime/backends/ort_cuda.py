"""The ort-cuda step session: IO binding for every input and output, the KV cache and cross K/V kept on the
device as OrtValues across steps. Token ids go up, logits of the last position come down; beam reordering
runs on the device through a one-node Gather graph.

Imported only when the ort-cuda backend is chosen.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from twostep.exporter.spec import present_name
from twostep.runtime.backends.base import NUMPY_DTYPES, check_positions
from twostep.runtime.backends.ort import OrtBackend, import_ort

ONNX_DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int64": TensorProto.INT64}


def gather_model(dtype: str, opset: int) -> bytes:
    """out = data[indices] along axis 0, for any rank: beam search's cache reorder, on the device. In the
    exported graphs' opset, stamped with the lowest IR version that opset needs (not the installed onnx's
    newest, which an older ONNX Runtime refuses): never newer than the graphs themselves."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["data", "indices"], ["out"], axis=0)], "reorder",
        [helper.make_tensor_value_info("data", ONNX_DTYPES[dtype], None),
         helper.make_tensor_value_info("indices", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("out", ONNX_DTYPES[dtype], None)],
    )
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))
    return model.SerializeToString()


class IoBindingSession:
    """`device_type` is "cuda" for ort-cuda and ort-trt; "cpu" runs the same binding logic on the CPU (tests
    do). `profile`: the TensorRT engine profile (ort-trt), checked before each run."""

    def __init__(self, backend: OrtBackend, device_type: str = "cuda", device_id: int = 0, profile=None):
        self.ort = import_ort()
        self.backend, self.device_type, self.device_id, self.profile = backend, device_type, device_id, profile
        self.decoder = backend.graphs["decoder"]
        self.dtype = self.decoder.outputs[0].dtype
        opset = backend.artifact.manifest["opset"]
        self.gathers = {
            dtype: self.ort.InferenceSession(gather_model(dtype, opset), providers=backend.gather_providers())
            for dtype in {self.dtype, "int64"}
        }
        self.state: dict = {}
        self.rows = self.position = 0

    def to_device(self, array: np.ndarray):
        return self.ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.device_type, self.device_id)

    def run(self, graph: str, inputs: dict) -> dict:
        session = self.backend.sessions[graph]
        binding = session.io_binding()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        names = self.backend.graphs[graph].output_names
        for name in names:
            binding.bind_output(name, self.device_type, self.device_id)
        session.run_with_iobinding(binding)
        return dict(zip(names, binding.get_outputs()))

    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> None:
        self.backend.check_inputs("encoder", {"input_ids": input_ids, "attention_mask": attention_mask})
        if self.profile is not None:
            self.profile.check({"batch": input_ids.shape[0], "src_len": input_ids.shape[1]})
        mask = self.to_device(attention_mask)
        enc = self.run("encoder", {"input_ids": self.to_device(input_ids), "attention_mask": mask})
        self.state = {"encoder_attention_mask": mask}
        self.state.update({t.name: enc[present_name(t.name)] for t in self.decoder.past_cross})
        for t in self.decoder.past_self:
            self.state[t.name] = self.ort.OrtValue.ortvalue_from_shape_and_type(
                list(t.concrete(batch=input_ids.shape[0], past_len=0)), NUMPY_DTYPES[t.dtype], self.device_type,
                self.device_id)
        self.rows, self.position = input_ids.shape[0], 0

    def step(self, input_ids: np.ndarray) -> np.ndarray:
        check_positions(self.backend.config, self.position + input_ids.shape[1])
        if self.profile is not None:
            self.profile.check({"batch": self.rows, "past_len": self.position, "new_len": input_ids.shape[1]})
        out = self.run("decoder", {"input_ids": self.to_device(input_ids), **self.state})
        for t in self.decoder.past_self:
            self.state[t.name] = out[present_name(t.name)]
        self.position += input_ids.shape[1]
        return np.asarray(out["logits"].numpy()[:, -1], dtype=np.float32)

    def reorder(self, origin: np.ndarray, cache_only: bool = False) -> None:
        indices = self.to_device(origin.astype(np.int64))
        names = [t.name for t in self.decoder.past_self] if cache_only else list(self.state)
        for name in names:
            value = self.state[name]
            dtype = "int64" if name == "encoder_attention_mask" else self.dtype
            session = self.gathers[dtype]
            binding = session.io_binding()
            binding.bind_ortvalue_input("data", value)
            binding.bind_ortvalue_input("indices", indices)
            binding.bind_output("out", self.device_type, self.device_id)
            session.run_with_iobinding(binding)
            self.state[name] = binding.get_outputs()[0]
        self.rows = len(origin)


__all__ = ["IoBindingSession", "gather_model"]
