"""`trt`: native TensorRT engines built from the artifact's two graphs.

Optimization profiles come from the manifest's symbolic axes (min/opt/max for batch, src_len, past_len,
new_len; past_len min 0, so the first step is the same engine). Engines are stored in the artifact
directory under `engines/` with a cache key (graph sha256, TensorRT version, GPU name, precision,
profile) and reused; each engine has a record with its sha256 and is never deserialized unless it matches.
Execution uses TensorRT's tensor-address API (`set_input_shape`, `set_tensor_address`, `execute_async_v3`)
on one CUDA stream; device buffers are torch CUDA tensors shared with the decoding
loop, and the KV cache never leaves the GPU. Written for TensorRT 10 and 11.

Imported only when the trt backend is chosen.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from twostep.artifact import Artifact
from twostep.errors import BackendUnavailable, BadArtifact, BadInput
from twostep.exporter.spec import present_name
from twostep.files import write_file_atomic
from twostep.runtime.backends.base import Backend, Feeds

INSTALL = "pip install 'twostep[trt]' (TensorRT 10 or 11 wheels) on a machine with an NVIDIA GPU and CUDA"


def import_trt():
    try:
        import tensorrt
    except ImportError as exc:
        raise BackendUnavailable(f"TensorRT is not installed ({exc}); {INSTALL}") from None
    return tensorrt


@dataclass(frozen=True)
class Profile:
    """min/opt/max per symbolic axis; --max-batch counts rows, so beam search needs batch x beam."""

    max_batch: int = 64
    opt_batch: int = 8
    max_src_len: int = 256
    opt_src_len: int = 32
    max_new_tokens: int = 256
    max_new_len: int = 16

    def axis(self, name: str) -> tuple[int, int, int]:
        return {
            "batch": (1, self.opt_batch, self.max_batch),
            "src_len": (1, self.opt_src_len, self.max_src_len),
            "past_len": (0, self.max_new_tokens // 4, self.max_new_tokens - 1),
            "new_len": (1, 1, self.max_new_len),
        }[name]

    def shapes(self, dims) -> tuple[tuple[int, ...], ...]:
        """(min, opt, max) shapes of one input from its declared dims."""
        out = []
        for k in range(3):
            out.append(tuple(self.axis(d)[k] if isinstance(d, str) else d for d in dims))
        return tuple(out)


def cache_key(artifact: Artifact, graph: str, trt_version: str, gpu: str, precision: str, profile: Profile) -> str:
    parts = {"graph_sha256": artifact.graph_sha256(graph),
             "tensorrt": trt_version, "gpu": gpu, "precision": precision, "profile": asdict(profile)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


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


def build_engine(artifact: Artifact, graph: str, profile: Profile, fp16: bool, log=lambda m: None) -> Path:
    """Parse one graph, build its engine with the profile, store it under engines/; reuse a cached one."""
    trt = import_trt()
    import torch

    gpu = torch.cuda.get_device_name()
    precision = "fp16" if fp16 or artifact.precision == "fp16" else "fp32"
    key = cache_key(artifact, graph, trt.__version__, gpu, precision, profile)
    path = artifact.engine_dir() / f"{graph}-{key}.plan"
    if read_engine(path) is not None:
        return path
    if artifact.precision == "int8" or artifact.manifest.get("fusions"):
        raise BadArtifact(f"{artifact.path}: TensorRT builds fp32 or fp16 artifacts exported without --optimize; "
                          "re-export with --dtype fp32 or fp16")
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
    if fp16 and artifact.precision == "fp32":
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
    write_engine(path, bytes(serialized), {"graph": graph, "tensorrt": trt.__version__, "gpu": gpu,
                                           "precision": precision, "profile": asdict(profile)})
    return path


class TrtBackend(Backend):
    name = "trt"

    def __init__(self, artifact: Artifact, profile: Profile = Profile(), fp16: bool = False, threads=None,
                 log=lambda m: None):
        super().__init__(artifact.config, artifact.graphs)
        self.artifact, self.profile, self.fp16, self.log = artifact, profile, fp16, log

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

    def _load(self) -> None:
        trt = import_trt()
        import torch

        self.torch = torch
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engines, self.contexts = {}, {}
        for graph in self.graphs:
            plan = build_engine(self.artifact, graph, self.profile, self.fp16, self.log)
            engine = self.runtime.deserialize_cuda_engine(read_engine(plan))
            if engine is None:
                raise BadArtifact(f"{plan}: TensorRT cannot deserialize this engine; delete it to rebuild")
            self.engines[graph] = engine
            self.contexts[graph] = engine.create_execution_context()
        self.stream = torch.cuda.Stream()
        self.dummy = torch.empty(1, device="cuda")  # an address for zero-size tensors
        self.lock = threading.Lock()  # an execution context runs one call at a time: threads take turns

    def torch_dtype(self, graph: str, name: str):
        trt = import_trt()
        t = self.torch
        return {trt.float32: t.float32, trt.float16: t.float16, trt.int64: t.int64, trt.int32: t.int32,
                trt.bool: t.bool}[self.engines[graph].get_tensor_dtype(name)]

    def execute(self, graph: str, inputs: dict) -> dict:
        """Run one engine on device tensors (torch CUDA), returning device tensors."""
        with self.lock:
            return self._execute(graph, inputs)

    def _execute(self, graph: str, inputs: dict) -> dict:
        context, spec = self.contexts[graph], self.graphs[graph]
        for t in spec.inputs:
            value = inputs[t.name].contiguous()
            inputs[t.name] = value
            context.set_input_shape(t.name, tuple(value.shape))
            context.set_tensor_address(t.name, value.data_ptr() if value.numel() else self.dummy.data_ptr())
        outputs = {}
        for t in spec.outputs:
            shape = tuple(context.get_tensor_shape(t.name))
            out = self.torch.empty(shape, dtype=self.torch_dtype(graph, t.name), device="cuda")
            outputs[t.name] = out
            context.set_tensor_address(t.name, out.data_ptr() if out.numel() else self.dummy.data_ptr())
        if not context.execute_async_v3(self.stream.cuda_stream):
            raise RuntimeError(f"TensorRT execution of the {graph} engine failed")
        return outputs

    def _run(self, graph: str, feeds: Feeds) -> Feeds:
        t = self.torch
        with t.cuda.stream(self.stream):
            inputs = {k: t.from_numpy(np.ascontiguousarray(v)).to("cuda") for k, v in feeds.items()}
            outputs = self.execute(graph, inputs)
        self.stream.synchronize()
        return {k: v.float().cpu().numpy() for k, v in outputs.items()}

    def session(self) -> "TrtSession":
        self.load()
        return TrtSession(self)

    def _close(self) -> None:
        self.contexts.clear()
        self.engines.clear()


class TrtSession:
    """The decoding loop's view: KV cache, cross K/V and mask stay on the GPU; token ids go up, the last
    position's logits come down; beam reordering is an index_select on the device."""

    def __init__(self, backend: TrtBackend):
        self.backend, self.torch = backend, backend.torch
        self.decoder = backend.graphs["decoder"]
        self.state: dict = {}

    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> None:
        b = self.backend
        b.check_inputs("encoder", {"input_ids": input_ids, "attention_mask": attention_mask})
        if input_ids.shape[0] > b.profile.max_batch or input_ids.shape[1] > b.profile.max_src_len:
            raise BadInput(f"batch {input_ids.shape[0]} x source {input_ids.shape[1]} is outside the engine "
                           f"profile (max batch {b.profile.max_batch}, max src {b.profile.max_src_len}); "
                           "rebuild with twostep build-engine --max-batch/--max-src-len")
        t = self.torch
        with t.cuda.stream(b.stream):
            mask = t.from_numpy(attention_mask).to("cuda")
            enc = b.execute("encoder", {"input_ids": t.from_numpy(input_ids).to("cuda"), "attention_mask": mask})
            self.state = {"encoder_attention_mask": mask}
            self.state.update({s.name: enc[present_name(s.name)] for s in self.decoder.past_cross})
            for s in self.decoder.past_self:
                self.state[s.name] = t.empty(s.concrete(batch=input_ids.shape[0], past_len=0),
                                             dtype=b.torch_dtype("decoder", s.name), device="cuda")
        self.position = 0

    def step(self, input_ids: np.ndarray) -> np.ndarray:
        b, t = self.backend, self.torch
        if self.position + input_ids.shape[1] > b.profile.max_new_tokens:
            raise BadInput(f"decoding past the engine profile's {b.profile.max_new_tokens} target positions; "
                           "rebuild with twostep build-engine --max-new-tokens")
        with t.cuda.stream(b.stream):
            out = b.execute("decoder", {"input_ids": t.from_numpy(input_ids).to("cuda"), **self.state})
            for s in self.decoder.past_self:
                self.state[s.name] = out[present_name(s.name)]
            logits = out["logits"][:, -1].float().cpu()
        self.position += input_ids.shape[1]
        return logits.numpy()

    def reorder(self, origin: np.ndarray) -> None:
        index = self.torch.from_numpy(origin.astype(np.int64)).to("cuda")
        with self.torch.cuda.stream(self.backend.stream):
            self.state = {k: v.index_select(0, index) for k, v in self.state.items()}
