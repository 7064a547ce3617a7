"""A stand-in for the `tensorrt` module, for the CPU-side tests of the trt backend and `build-engine`.

It keeps the parts of TensorRT's contract that twostep's code must honour and records every call:
- the builder starts with BuilderFlag.TF32 set (TensorRT's default) and records the flags and the
  optimization profile an engine is built with; `set_shape` refuses min > opt > max like TensorRT;
- `IExecutionContext.set_input_shape` returns False (it never raises) for a shape outside the profile;
- `set_tensor_address` is recorded, so tests can see null or shared addresses;
- an execution context serves one thread at a time, from its first `set_input_shape` to its
  `execute_async_v3` (which sleeps a little, as a real enqueue takes a while): a second thread in between is
  recorded as an "overlap" and refused with an error, where TensorRT would mix the two calls' shapes and
  addresses;
- `execute_async_v3` records the stream handle it is given; `Stream`, `stream` and `current_stream` stand in
  for torch's CUDA streams (tests give the backend a `Stream` and put `stream` in place of
  `torch.cuda.stream`), so a test sees which stream was current at each device copy;
- an "engine" runs its ONNX graph with ONNX Runtime on the CPU, reading its inputs from and writing its
  outputs to the addresses it was given (host memory: the backend runs with device "cpu"), so decoding
  through the trt backend's own binding code gives real tokens.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import threading
import time

import numpy as np
import onnxruntime as ort

__version__ = "10.99.0-fake"
calls: list[tuple] = []
ENQUEUE_SECONDS = 0.002


class Stream:
    """torch.cuda.Stream's part the trt backend uses: a handle to enqueue on, and a context to enter."""

    handles = itertools.count(0x5000)

    def __init__(self):
        self.cuda_stream = next(self.handles)


current = threading.local()  # like torch's: each thread has its own current stream


def current_stream() -> Stream | None:
    """The stream entered last in this thread (None: the default stream)."""
    return getattr(current, "stream", None)


@contextlib.contextmanager
def stream(s: Stream):
    """torch.cuda.stream: the device work queued in the block goes on `s`."""
    before = current_stream()
    current.stream = s
    try:
        yield
    finally:
        current.stream = before

float32, float16, int64, int32 = "float32", "float16", "int64", "int32"
globals()["bool"] = "bool"
ORT_TYPES = {"tensor(float)": float32, "tensor(float16)": float16, "tensor(int64)": int64, "tensor(int32)": int32}


class Logger:
    WARNING = 2

    def __init__(self, severity=None):
        pass


class BuilderFlag:
    FP16, TF32 = "FP16", "TF32"


class NetworkDefinitionCreationFlag:
    STRONGLY_TYPED = 5


class MemoryPoolType:
    WORKSPACE = "WORKSPACE"


class Network:
    def __init__(self, flags: int):
        self.flags, self.path = flags, None


class OnnxParser:
    num_errors = 0

    def __init__(self, network: Network, logger):
        self.network = network

    def parse_from_file(self, path: str) -> bool:
        self.network.path = path
        return True


class OptimizationProfile:
    def __init__(self):
        self.shapes: dict[str, list] = {}

    def set_shape(self, name, low, opt, high):
        if not all(a <= b <= c for a, b, c in zip(low, opt, high)):
            raise ValueError(f"{name}: min {low} opt {opt} max {high} are not ordered")
        self.shapes[name] = [list(low), list(opt), list(high)]


class BuilderConfig:
    def __init__(self):
        self.flags = {BuilderFlag.TF32}  # on by default, as in TensorRT
        self.profiles: list[OptimizationProfile] = []

    def set_flag(self, flag):
        self.flags.add(flag)

    def clear_flag(self, flag):
        self.flags.discard(flag)

    def set_memory_pool_limit(self, pool, size):
        pass

    def add_optimization_profile(self, profile):
        self.profiles.append(profile)


class Builder:
    def __init__(self, logger):
        pass

    def create_network(self, flags: int = 0) -> Network:
        return Network(flags)

    def create_builder_config(self) -> BuilderConfig:
        return BuilderConfig()

    def create_optimization_profile(self) -> OptimizationProfile:
        return OptimizationProfile()

    def build_serialized_network(self, network: Network, config: BuilderConfig) -> bytes:
        plan = {"path": network.path, "flags": sorted(config.flags), "profile": config.profiles[0].shapes}
        calls.append(("build", plan))
        return json.dumps(plan).encode()


class Runtime:
    def __init__(self, logger):
        pass

    def deserialize_cuda_engine(self, data: bytes) -> Engine:
        return Engine(json.loads(data))


class Engine:
    def __init__(self, plan: dict):
        self.plan = plan
        self.session = ort.InferenceSession(plan["path"], providers=["CPUExecutionProvider"])
        self.dtypes = {t.name: ORT_TYPES[t.type] for t in (*self.session.get_inputs(), *self.session.get_outputs())}

    def get_tensor_dtype(self, name: str) -> str:
        return self.dtypes[name]

    def create_execution_context(self) -> Context:
        return Context(self)


def host_array(address: int, shape, dtype: str) -> np.ndarray:
    dtype = np.dtype(dtype)
    size = int(np.prod(shape))
    if size == 0:
        return np.zeros(shape, dtype)
    raw = (ctypes.c_byte * (size * dtype.itemsize)).from_address(address)
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


class Context:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.shapes: dict[str, tuple] = {}
        self.addresses: dict[str, int] = {}
        self.results: dict | None = None
        self.user: int | None = None  # the thread between its first set_input_shape and its enqueue
        self.guard = threading.Lock()

    def enter(self) -> None:
        """Take the context for this thread, or record and refuse a second thread while another holds it."""
        me = threading.get_ident()
        with self.guard:
            if self.user not in (None, me):
                calls.append(("overlap", self.engine.plan["path"]))
                raise RuntimeError("two threads use one TensorRT execution context at once")
            self.user = me

    def leave(self) -> None:
        with self.guard:
            self.user = None

    def set_input_shape(self, name: str, shape) -> bool:
        self.enter()
        calls.append(("set_input_shape", name, tuple(shape)))
        low, _, high = self.engine.plan["profile"][name]
        if len(shape) != len(low) or not all(a <= s <= c for a, s, c in zip(low, shape, high)):
            self.leave()  # the call ends here
            return False  # TensorRT logs an error and returns False
        self.shapes[name], self.results = tuple(shape), None
        return True

    def set_tensor_address(self, name: str, address: int) -> bool:
        self.enter()
        calls.append(("set_tensor_address", name, address))
        self.addresses[name] = address
        return True

    def run(self) -> dict:
        if self.results is None:
            feeds = {t.name: host_array(self.addresses[t.name], self.shapes[t.name], self.engine.dtypes[t.name])
                     for t in self.engine.session.get_inputs()}
            names = [t.name for t in self.engine.session.get_outputs()]
            self.results = dict(zip(names, self.engine.session.run(names, feeds)))
        return self.results

    def get_tensor_shape(self, name: str) -> tuple:
        self.enter()
        return tuple(self.run()[name].shape)

    def execute_async_v3(self, stream_handle: int) -> bool:
        self.enter()
        calls.append(("execute", self.engine.plan["path"], dict(self.addresses), stream_handle))
        time.sleep(ENQUEUE_SECONDS)
        for name, value in self.run().items():
            if value.size:
                ctypes.memmove(self.addresses[name], np.ascontiguousarray(value).ctypes.data, value.nbytes)
        self.results = None
        self.leave()
        return True
