"""`trt`: native TensorRT engines built from the artifact's two graphs.

The optimization profile is `Profile.derive` of the model (min/opt/max for batch, src_len, past_len, new_len;
past_len min 0, so the first step is the same engine), the one `twostep build-engine` uses. Engines are stored
in the artifact directory under `engines/` with a cache key (graph sha256, TensorRT version, GPU name,
precision, profile) and reused; each engine has a record with its sha256 and is never deserialized unless it
matches. fp32 engines are built with TF32 off (TensorRT turns it on by default, and it moves fp32 MatMuls
~1e-3 off eager PyTorch); `tf32=True` opts in and is recorded as precision "tf32".
Execution uses TensorRT's tensor-address API (`set_input_shape`, `set_tensor_address`, `execute_async_v3`)
on one CUDA stream; device buffers are torch CUDA tensors shared with the decoding
loop, and the KV cache never leaves the GPU. Every device copy, row move and allocation of the backend and
its sessions runs on that stream too (`on_stream`), in order with the engines. Written for TensorRT 10 and 11.

Imported only when the trt backend is chosen.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from dataclasses import asdict
from pathlib import Path

import numpy as np

from twostep.artifact import Artifact
from twostep.artifact.spec import present_name
from twostep.errors import BackendUnavailable, BadArtifact, BadInput
from twostep.files import write_file_atomic
from twostep.runtime.backends.base import Backend, Feeds
from twostep.runtime.backends.profile import Profile
from twostep.runtime.backends.rows import TorchOps
from twostep.runtime.backends.session import MASK, RowSession, search_results

INSTALL = "pip install 'twostep[trt]' (TensorRT 10 or 11 wheels) on a machine with an NVIDIA GPU and CUDA"


def import_trt():
    try:
        import tensorrt
    except ImportError as exc:
        raise BackendUnavailable(f"TensorRT is not installed ({exc}); {INSTALL}") from None
    return tensorrt


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()


def engine_precision(artifact: Artifact, fp16: bool = False, tf32: bool = False) -> str:
    """What an engine computes in: "fp16" (an fp16 artifact, or --fp16), "tf32" (opted in), else "fp32"."""
    if artifact.precision in ("int8", "int4") or artifact.manifest.fusions:
        raise BadArtifact(f"{artifact.path}: TensorRT builds fp32 or fp16 artifacts exported without --optimize; "
                          "re-export with --dtype fp32 or fp16")
    if fp16 or artifact.precision == "fp16":
        return "fp16"
    return "tf32" if tf32 else "fp32"


def cache_key(artifact: Artifact, graph: str, trt_version: str, gpu: str, precision: str, profile: Profile) -> str:
    parts = {"graph_sha256": artifact.graph_sha256(graph),
             "tensorrt": trt_version, "gpu": gpu, "precision": precision, "profile": asdict(profile)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def engine_path(artifact: Artifact, graph: str, profile: Profile, precision: str) -> Path:
    """Where the engine for these settings is cached: the one path build-engine and the backend share."""
    trt = import_trt()
    key = cache_key(artifact, graph, trt.__version__, gpu_name(), precision, profile)
    return artifact.engine_dir() / f"{graph}-{key}.plan"


def read_engine(plan: Path) -> bytes | None:
    """A built engine's bytes, checked against the sha256 in its record (`NAME.json`, written with it);
    None when it has not been built. An engine without a matching record is never deserialized."""
    if not plan.exists():
        return None
    record = plan.with_suffix(".json")
    try:
        expected = json.loads(record.read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        raise BadArtifact(f"{plan}: no record {record.name} with its sha256 (twostep did not build it, or a build "
                          "was interrupted); delete it to rebuild") from None
    data = plan.read_bytes()
    if hashlib.sha256(data).hexdigest() != expected:
        raise BadArtifact(f"{plan}: sha256 does not match {record.name}; the engine was changed or damaged, "
                          "delete it to rebuild")
    return data


def write_engine(plan: Path, data: bytes, info: dict) -> None:
    """The record first, then the engine: a crash in between leaves no engine, so the next run rebuilds."""
    write_file_atomic(plan.with_suffix(".json"),
                      (json.dumps({**info, "sha256": hashlib.sha256(data).hexdigest()}, indent=2) + "\n").encode())
    write_file_atomic(plan, data)


def build_engine(artifact: Artifact, graph: str, profile: Profile, precision: str, log=lambda m: None) -> Path:
    """Parse one graph, build its engine with the profile, store it under engines/; reuse a cached one.
    `precision` comes from `engine_precision`."""
    trt = import_trt()
    path = engine_path(artifact, graph, profile, precision)
    if read_engine(path) is not None:
        return path
    log(f"building TensorRT engine for {graph} ({precision}); this takes a minute, then it is cached")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if artifact.precision == "fp16" and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)  # the graph's own fp16/fp32 split
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    onnx_file = artifact.graph_file(graph)
    if not parser.parse_from_file(str(onnx_file)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BadArtifact(f"{onnx_file}: TensorRT's ONNX parser refused it: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 4 << 30)
    if precision == "tf32":
        config.set_flag(trt.BuilderFlag.TF32)
    else:  # on by default; fp32 parity (and the fp32 islands of an fp16 graph) need it off
        config.clear_flag(trt.BuilderFlag.TF32)
    if precision == "fp16" and artifact.precision == "fp32":
        if not hasattr(trt.BuilderFlag, "FP16"):
            raise BadArtifact("this TensorRT has no weakly-typed FP16 flag; export with --dtype fp16 instead")
        config.set_flag(trt.BuilderFlag.FP16)
    opt = builder.create_optimization_profile()
    for spec in artifact.graphs[graph].inputs:
        opt.set_shape(spec.name, *profile.shapes(spec.shape))
    config.add_optimization_profile(opt)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BadArtifact(f"{onnx_file}: TensorRT could not build an engine (see its log above)")
    write_engine(path, bytes(serialized), {"graph": graph, "tensorrt": trt.__version__, "gpu": gpu_name(),
                                           "precision": precision, "profile": asdict(profile)})
    return path


class TrtBackend(Backend):
    name = "trt"
    device = "cuda"  # where its buffers live; only tests, with a stand-in tensorrt module, use "cpu"

    def __init__(self, artifact: Artifact, profile: Profile | None = None, fp16: bool = False, tf32: bool = False,
                 threads=None, log=lambda m: None):
        super().__init__(artifact.config, artifact.graphs)
        self.artifact, self.log = artifact, log
        self.profile = profile or Profile.derive(artifact.config)
        self.precision = engine_precision(artifact, fp16, tf32)

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            import tensorrt  # noqa: F401
        except ImportError as exc:
            return f"TensorRT is not installed ({exc})"
        try:
            import torch
        except ImportError:
            return "the trt backend keeps its buffers in torch CUDA tensors; install torch with CUDA"
        if not torch.cuda.is_available():
            return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
        return None

    @property
    def target_positions(self) -> int:
        return self.profile.max_new_tokens

    def engine_paths(self) -> dict[str, Path]:
        return {graph: engine_path(self.artifact, graph, self.profile, self.precision) for graph in self.graphs}

    def _load(self) -> None:
        trt = import_trt()
        import torch

        self.torch = torch
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engines, self.contexts = {}, {}
        for graph in self.graphs:
            plan = build_engine(self.artifact, graph, self.profile, self.precision, self.log)
            engine = self.runtime.deserialize_cuda_engine(read_engine(plan))
            if engine is None:
                raise BadArtifact(f"{plan}: TensorRT cannot deserialize this engine; delete it to rebuild")
            self.engines[graph] = engine
            self.contexts[graph] = engine.create_execution_context()
        self.stream = self.new_stream()
        # TensorRT wants a non-null address for every tensor, distinct per tensor, even an empty one (the
        # first step's past_len 0 cache): each empty input or output gets its own one-element buffer.
        with self.on_stream():
            self.placeholders = {(graph, t.name): self.empty((1,), torch.float32)
                                 for graph, spec in self.graphs.items() for t in (*spec.inputs, *spec.outputs)}
        self.lock = threading.Lock()  # an execution context runs one call at a time: threads take turns

    def new_stream(self):
        """The CUDA stream of the engines and of every device copy; None on "cpu" (tests give a stand-in)."""
        return self.torch.cuda.Stream() if self.device == "cuda" else None

    def on_stream(self):
        """torch's device work in the block (copies, row moves, allocations) goes on the backend's stream, in
        order with the engines' enqueues; a buffer allocated there is reused only after the stream's earlier
        work. Every call of the backend and its sessions that touches the device runs in one."""
        return self.torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    # The device copies and allocations, each on the current stream (call them in `on_stream`).
    def upload(self, array: np.ndarray):
        """A host array on the device: always a copy, since a session writes into its rows."""
        return self.torch.from_numpy(np.array(array, order="C")).to(self.device)

    def download(self, value) -> np.ndarray:
        """A device tensor on the host, floats as float32, integers (the search outputs' ids) as they are; it
        waits for the stream's work on it."""
        return (value.float() if value.is_floating_point() else value).cpu().numpy()

    def empty(self, shape, dtype):
        return self.torch.empty(shape, dtype=dtype, device=self.device)

    def torch_dtype(self, graph: str, name: str):
        trt = import_trt()
        t = self.torch
        return {trt.float32: t.float32, trt.float16: t.float16, trt.int64: t.int64, trt.int32: t.int32,
                trt.bool: t.bool}[self.engines[graph].get_tensor_dtype(name)]

    def address(self, graph: str, name: str, value) -> int:
        return value.data_ptr() if value.numel() else self.placeholders[graph, name].data_ptr()

    def execute(self, graph: str, inputs: dict) -> dict:
        """Run one engine on device tensors (torch CUDA), returning device tensors."""
        with self.lock, self.on_stream():
            return self._execute(graph, inputs)

    def _execute(self, graph: str, inputs: dict) -> dict:
        context, spec = self.contexts[graph], self.graphs[graph]
        for t in spec.inputs:
            value = inputs[t.name].contiguous()
            inputs[t.name] = value
            if not context.set_input_shape(t.name, tuple(value.shape)):  # TensorRT returns False, never raises
                self.refused_shape(graph, t, tuple(value.shape))
            context.set_tensor_address(t.name, self.address(graph, t.name, value))
        outputs = {}
        for t in spec.outputs:
            shape = tuple(context.get_tensor_shape(t.name))
            out = self.empty(shape, self.torch_dtype(graph, t.name))
            outputs[t.name] = out
            context.set_tensor_address(t.name, self.address(graph, t.name, out))
        handle = self.stream.cuda_stream if self.stream is not None else 0
        if not context.execute_async_v3(handle):
            raise RuntimeError(f"TensorRT execution of the {graph} engine failed")
        return outputs

    def refused_shape(self, graph: str, spec, shape: tuple[int, ...]) -> None:
        """Raise BadInput for a shape TensorRT refused: the profile's own check names the axis and bounds."""
        where = f"{graph}.{spec.name}: "
        try:
            self.profile.check({dim: size for dim, size in zip(spec.shape, shape) if isinstance(dim, str)})
        except BadInput as exc:
            raise BadInput(where + str(exc)) from None
        raise BadInput(f"{where}TensorRT refused shape {list(shape)} (profile {asdict(self.profile)})")

    def _run(self, graph: str, feeds: Feeds, outputs: list[str] | None = None) -> Feeds:
        with self.on_stream():
            outputs = self.execute(graph, {k: self.upload(v) for k, v in feeds.items()})
            return {k: self.download(v) for k, v in outputs.items()}

    def session(self) -> TrtSession:
        self.load()
        return TrtSession(self)

    def _close(self) -> None:
        self.contexts.clear()
        self.engines.clear()


class TrtSession(RowSession):
    """The decoding loop's view: KV cache, cross K/V and mask stay on the GPU (torch tensors, with the row
    bookkeeping of the RowSession base); token ids and lengths go up, the last position's logits come down; rows
    move on the device (beam reorder, sentences joining a running batch, rows leaving), on the backend's stream."""

    def __init__(self, backend: TrtBackend):
        self.backend, self.torch = backend, backend.torch
        super().__init__(backend.config, backend.graphs["decoder"], TorchOps(self.torch),
                         max_width=backend.profile.max_new_tokens - 1)

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: int) -> dict:
        b = self.backend
        b.check_inputs("encoder", {"input_ids": input_ids, "attention_mask": attention_mask})
        b.profile.check({"batch": rows, "src_len": input_ids.shape[1]})
        mask = b.upload(attention_mask)
        enc = b.execute("encoder", {"input_ids": b.upload(input_ids), "attention_mask": mask})
        return {MASK: mask, **{s.name: enc[present_name(s.name)] for s in self.decoder.past_cross}}

    def empty_cache(self, batch: int) -> dict:
        b = self.backend
        return {s.name: b.empty(s.concrete(batch=batch, past_len=0), b.torch_dtype("decoder", s.name))
                for s in self.decoder.past_self}

    def run_decoder(self, input_ids: np.ndarray, need_logits: bool = True) -> tuple[dict, dict]:
        b, rows = self.backend, self.rows
        b.profile.check({"batch": rows.rows, "past_len": rows.past_len, "new_len": input_ids.shape[1]})
        out = b.execute("decoder", {"input_ids": b.upload(input_ids), "past_lengths": b.upload(rows.lengths),
                                    **rows.tensors})
        presents = {s.name: out[present_name(s.name)] for s in self.decoder.past_self}
        return search_results(out, need_logits, self.decoder, b.download,
                              lambda logits: b.download(logits[:, -1])), presents

    # Every call that touches the device runs on the backend's stream: uploads, row moves (a leaving row can
    # cut the cache), the engines, downloads.
    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> None:
        with self.backend.on_stream():
            super().start(input_ids, attention_mask)

    def admit(self, input_ids: np.ndarray, attention_mask: np.ndarray, sources: np.ndarray, rows: np.ndarray) -> None:
        with self.backend.on_stream():
            super().admit(input_ids, attention_mask, sources, rows)

    def release(self, rows: np.ndarray) -> None:
        with self.backend.on_stream():
            super().release(rows)

    def search_step(self, input_ids: np.ndarray, need_logits: bool = True) -> dict:
        with self.backend.on_stream():
            return super().search_step(input_ids, need_logits)

    def reorder(self, origin: np.ndarray, cache_only: bool = False) -> None:
        with self.backend.on_stream():
            super().reorder(origin, cache_only)
