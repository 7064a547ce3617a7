"""The ort-cuda (and ort-trt) step session: IO binding for every input and output, the decoder's inputs (KV
cache, cross K/V, mask) kept on the device as OrtValues across steps. Token ids and lengths go up, logits of the
last position come down; rows move on the device (beam reorder, sentences joining a running batch) through small
graphs (`array_model`: Gather + Slice, Pad, ScatterND), with the row bookkeeping of the RowSession base.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from twostep.artifact.spec import present_name
from twostep.runtime.backends.base import NUMPY_DTYPES
from twostep.runtime.backends.ortlib import import_ort
from twostep.runtime.backends.session import MASK, RowSession, search_results

ONNX_DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int64": TensorProto.INT64}
ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64"}


def array_model(kind: str, dtype: str, opset: int) -> bytes:
    """One array operation as a graph, for any rank, `out` from `data`:
    take  Slice(Gather(data, indices, axis=0), starts, ends, axes)   rows of data, one axis cut
    pad   Pad(data, pads)                                             zeros around
    put   ScatterND(data, indices, updates)                           rows replaced
    In the exported graphs' opset, stamped with the lowest IR version that opset needs (not the installed
    onnx's newest, which an older ONNX Runtime refuses): never newer than the graphs themselves."""
    T, I64 = ONNX_DTYPES[dtype], TensorProto.INT64
    value, ints = helper.make_tensor_value_info, lambda name: helper.make_tensor_value_info(name, I64, None)
    if kind == "take":
        nodes = [helper.make_node("Gather", ["data", "indices"], ["rows"], axis=0),
                 helper.make_node("Slice", ["rows", "starts", "ends", "axes"], ["out"])]
        inputs = [value("data", T, None), ints("indices"), ints("starts"), ints("ends"), ints("axes")]
    elif kind == "pad":
        nodes = [helper.make_node("Pad", ["data", "pads"], ["out"])]
        inputs = [value("data", T, None), ints("pads")]
    elif kind == "put":
        nodes = [helper.make_node("ScatterND", ["data", "indices", "updates"], ["out"])]
        inputs = [value("data", T, None), ints("indices"), value("updates", T, None)]
    else:
        raise ValueError(f"unknown array operation {kind!r}")
    graph = helper.make_graph(nodes, kind, inputs, [value("out", T, None)])
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))
    return model.SerializeToString()


class OrtOps:
    """Arrays as OrtValues on a device; each operation runs an `array_model` there (the ArrayOps of
    twostep.runtime.backends.rows)."""

    KINDS = ("take", "pad", "put")

    def __init__(self, ort, providers: list, device_type: str, device_id: int, opset: int, dtypes):
        self.device_type, self.device_id = device_type, device_id
        self.sessions = {(kind, dtype): ort.InferenceSession(array_model(kind, dtype, opset), providers=providers)
                         for kind in self.KINDS for dtype in dtypes}

    def shape(self, x) -> tuple[int, ...]:
        return tuple(x.shape())

    def run(self, kind: str, x, **inputs):
        session = self.sessions[kind, ORT_DTYPES[x.data_type()]]
        binding = session.io_binding()
        binding.bind_ortvalue_input("data", x)
        for name, value in inputs.items():
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        binding.bind_output("out", self.device_type, self.device_id)
        session.run_with_iobinding(binding)
        return binding.get_outputs()[0]

    def take(self, x, rows, axis: int, start: int, stop: int):
        if rows is None:
            rows = np.arange(self.shape(x)[0])
        return self.run("take", x, indices=np.ascontiguousarray(rows, dtype=np.int64),
                        starts=np.array([start]), ends=np.array([stop]), axes=np.array([axis]))

    def pad(self, x, axis: int, before: int, after: int):
        pads = np.zeros(2 * len(self.shape(x)), np.int64)
        pads[axis], pads[len(pads) // 2 + axis] = before, after
        return self.run("pad", x, pads=pads)

    def put(self, x, rows, y):
        return self.run("put", x, indices=np.ascontiguousarray(rows, dtype=np.int64)[:, None], updates=y)


class IoBindingSession(RowSession):
    """`device_type` is "cuda" for ort-cuda and ort-trt; "cpu" runs the same binding logic on the CPU (tests
    do). `profile`: the TensorRT engine profile (ort-trt), checked before each run."""

    def __init__(self, backend, device_type: str = "cuda", device_id: int = 0, profile=None):
        self.ort = import_ort()
        self.backend, self.device_type, self.device_id, self.profile = backend, device_type, device_id, profile
        decoder = backend.graphs["decoder"]
        self.dtype = decoder.outputs[0].dtype
        self.ops = OrtOps(self.ort, backend.gather_providers(), device_type, device_id,
                          backend.artifact.manifest.opset, {self.dtype, "int64"})
        super().__init__(backend.config, decoder, self.ops,
                         max_width=None if profile is None else profile.max_new_tokens - 1)

    def to_device(self, array: np.ndarray):
        return self.ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.device_type, self.device_id)

    def run(self, graph: str, inputs: dict) -> dict:
        session = self.backend.sessions[graph]
        binding = session.io_binding()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        names = self.backend.graphs[graph].step_output_names
        for name in names:
            binding.bind_output(name, self.device_type, self.device_id)
        session.run_with_iobinding(binding)
        return dict(zip(names, binding.get_outputs()))

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: int) -> dict:
        self.backend.check_inputs("encoder", {"input_ids": input_ids, "attention_mask": attention_mask})
        if self.profile is not None:
            self.profile.check({"batch": rows, "src_len": input_ids.shape[1]})
        mask = self.to_device(attention_mask)
        enc = self.run("encoder", {"input_ids": self.to_device(input_ids), "attention_mask": mask})
        return {MASK: mask, **{t.name: enc[present_name(t.name)] for t in self.decoder.past_cross}}

    def empty_cache(self, batch: int) -> dict:
        return {t.name: self.ort.OrtValue.ortvalue_from_shape_and_type(
                    list(t.concrete(batch=batch, past_len=0)), NUMPY_DTYPES[t.dtype], self.device_type, self.device_id)
                for t in self.decoder.past_self}

    def run_decoder(self, input_ids: np.ndarray, need_logits: bool = True) -> tuple[dict, dict]:
        rows = self.rows
        if self.profile is not None:
            self.profile.check({"batch": rows.rows, "past_len": rows.past_len, "new_len": input_ids.shape[1]})
        out = self.run("decoder", {"input_ids": self.to_device(input_ids), "past_lengths": self.to_device(rows.lengths),
                                   **rows.tensors})
        presents = {t.name: out[present_name(t.name)] for t in self.decoder.past_self}
        # only what the search reads comes down: the search outputs, and the logits of the last position if asked
        return search_results(out, need_logits, self.decoder, lambda value: value.numpy(),
                              lambda logits: logits.numpy()[:, -1]), presents


__all__ = ["IoBindingSession", "OrtOps", "array_model"]
