"""ONNX Runtime backends: `ort-cpu` (with the in-place decoder when the artifact has one), and `ort-cuda`
(CUDA execution provider with IO binding, so that the KV cache and cross K/V stay on the device between
steps; only token ids and beam origins cross to the host).

Each picks its decoder from the artifact's graph entries: the first of `decoders` that the artifact holds.
"""

from __future__ import annotations

from twostep.artifact import Artifact, check_ledger, record_ledger
from twostep.artifact.spec import INPLACE, INPLACE_DECODERS, STANDARD_INPLACE, GraphSpec
from twostep.errors import BackendUnavailable, BadArtifact, BadInput
from twostep.runtime.backends.base import Backend, Feeds
from twostep.runtime.backends.inplace import InplaceSession
from twostep.runtime.backends.iobinding import IoBindingSession
from twostep.runtime.backends.ortlib import import_ort, installed_ort_wheels
from twostep.runtime.backends.session import HostSession

# kv_cache -> the decoder it pins
KV_CACHES = {"auto": None, "inplace": INPLACE, "standard": STANDARD_INPLACE, "concat": "decoder"}


class OrtBackend(Backend):
    """`kv_cache`: "inplace" decodes with the artifact's in-place decoder (twostep.exporter.inplace), "standard"
    with its opset-24 form (written only when asked for, slower on this provider), "concat" with the plain
    decoder, "auto" (the default) with the in-place one where the artifact has it."""

    name = "ort-cpu"
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    # those it runs, preferred first (the contrib in-place kernel is CPU; the standard one is slower here)
    decoders: tuple[str, ...] = (INPLACE, "decoder", STANDARD_INPLACE)
    spin_between_runs = False  # pool threads stop spinning when a run returns (session_options)

    def __init__(self, artifact: Artifact, threads: int | None = None, optimization: str = "all",
                 kv_cache: str = "auto", prepack: bool = True):
        super().__init__(artifact.config, artifact.graphs)
        self.artifact, self.threads, self.optimization = artifact, threads, optimization
        self.prepack = prepack
        self.precision = artifact.precision
        self.sessions: dict = {}
        if kv_cache not in KV_CACHES:
            raise BadInput(f"kv_cache {kv_cache!r}: choose one of {', '.join(KV_CACHES)}")
        pinned = KV_CACHES[kv_cache]
        if pinned is not None and pinned not in self.decoders:
            raise BadInput(f"{self.name} runs the plain decoder only; kv_cache {kv_cache!r} is for ort-cpu")
        if pinned is not None and artifact.entry(pinned) is None:
            how = "--variant decoder_inplace_standard" if pinned == STANDARD_INPLACE else "--inplace-cache"
            raise BadInput(f"{artifact.path} has no {pinned} graph: export it with `twostep export {how}`, "
                           "or use kv_cache 'auto' or 'concat'")
        self.decoder = pinned or next(d for d in self.decoders if artifact.entry(d) is not None)

    @property
    def inplace(self) -> bool:
        """Whether it decodes with an in-place decoder."""
        return self.decoder in INPLACE_DECODERS

    def spec(self, graph: str) -> GraphSpec:
        entry = self.artifact.entry(graph)
        if entry is None:
            raise BadArtifact(f"{self.artifact.path} has no {graph} graph")
        return entry.spec

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            ort = import_ort()
        except BackendUnavailable as exc:
            return str(exc)
        missing = [p for p in cls.providers if p not in ort.get_available_providers()]
        if missing:
            reason = (f"this onnxruntime build lacks {', '.join(missing)} "
                      f"(it has {', '.join(ort.get_available_providers())})")
            if len(installed_ort_wheels()) == 2:
                reason += ("; onnxruntime and onnxruntime-gpu are both installed and share one module directory, so "
                           "whichever was installed (or uninstalled) last decides what works: "
                           "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu")
            return reason
        return None

    def session_options(self, graph: str | None = None):
        ort = import_ort()
        options = ort.SessionOptions()
        levels = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                  "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                  "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                  "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}
        options.graph_optimization_level = levels[self.optimization]
        if self.threads:
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
        options.log_severity_level = 3
        if not self.spin_between_runs:
            # ONNX Runtime's pool threads spin between a run's operators (without it each waits for them to
            # wake: a short request alone took 35 ms instead of 25, demo) and, by default, after the run for
            # the next one. After a run they stop here: the encoder's threads spinning after a join took the
            # cores from the decoder's steps (in-flight decoding ran 1.5-1.9x slower on 2 cores), and the
            # decoder's, between steps, from the bookkeeping and HTTP threads (docs/benchmarks.md, "In-flight
            # vs static batching").
            options.add_session_config_entry("session.force_spinning_stop", "1")
        if not self.prepack:
            # The weights stay where they are mapped (external data) instead of each MatMul's being copied into
            # its packed layout: export's validation opens the decoders side by side, at a 3B model's size.
            options.add_session_config_entry("session.disable_prepacking", "1")
        return options

    def _load(self) -> None:
        # With a variant decoder, the plain one is loaded only if something runs it (verify's graph parity):
        # decoding never does, and it would hold a second copy of the decoder's weights.
        for graph in ("encoder", self.decoder):
            self.open_session(graph)

    def open_session(self, graph: str) -> None:
        ort = import_ort()
        path = self.artifact.graph_file(graph)
        try:
            self.sessions[graph] = ort.InferenceSession(str(path), self.session_options(graph),
                                                        providers=self.provider_list(graph))
        except Exception as exc:  # onnxruntime raises its own exception types for unreadable models
            raise BadArtifact(f"{path}: ONNX Runtime cannot load it: {str(exc).splitlines()[0][:300]}") from None

    def provider_list(self, graph: str | None = None) -> list:
        return list(self.providers)

    def gather_providers(self) -> list:
        """Providers for the row-moving array sessions (iobinding.IoBindingSession)."""
        return list(self.providers)

    def _run(self, graph: str, feeds: Feeds, outputs: list[str] | None = None) -> Feeds:
        if graph not in self.sessions:
            self.open_session(graph)
        session = self.sessions[graph]
        names = outputs or self.spec(graph).output_names
        return dict(zip(names, session.run(names, feeds)))

    def _close(self) -> None:
        self.sessions.clear()

    def session(self) -> HostSession:
        self.load()
        return InplaceSession(self) if self.inplace else HostSession(self)

    def inflight_advice(self) -> str | None:
        """In flight with the plain decoder, the batch's self-attention cache is as wide as its oldest sentence's
        history (every row attends over it and the graph copies it each step), and its throughput measured
        about static batching's at best (docs/benchmarks.md); the in-place decoder attends over each row's own
        history."""
        if self.inplace or INPLACE not in self.decoders:
            return None
        remedy = ("decode with it (kv_cache 'auto' or 'inplace')" if self.artifact.entry(INPLACE) is not None else
                  "export the model with `twostep export --inplace-cache` for ONNX Runtime's in-place decoder")
        return (f"in-flight batching on {self.name} with the plain decoder: its KV cache is as wide as the oldest "
                "sentence's history, and its throughput measured about static batching's at best "
                f"(docs/benchmarks.md); {remedy}")


class OrtCudaBackend(OrtBackend):
    """ONNX Runtime's CUDA provider, with TF32 off for fp32 artifacts (the provider's `use_tf32` defaults to
    on, which moves fp32 MatMuls ~1e-3 off eager PyTorch); `tf32=True` opts in, recorded as precision "tf32"."""

    name = "ort-cuda"
    providers = ("CUDAExecutionProvider", "CPUExecutionProvider")
    decoders = ("decoder",)

    def __init__(self, artifact: Artifact, threads: int | None = None, optimization: str = "all", tf32: bool = False):
        super().__init__(artifact, threads, optimization)
        self.tf32 = tf32
        if tf32 and artifact.precision == "fp32":
            self.precision = "tf32"

    def cuda_provider(self) -> tuple[str, dict]:
        return ("CUDAExecutionProvider", {"use_tf32": "1" if self.tf32 else "0"})

    def provider_list(self, graph: str | None = None) -> list:
        return [self.cuda_provider(), "CPUExecutionProvider"]

    def gather_providers(self) -> list:
        return [self.cuda_provider()]

    def session(self) -> IoBindingSession:
        self.load()
        return IoBindingSession(self, "cuda")


class OrtTrtBackend(OrtCudaBackend):
    """ONNX Runtime's TensorRT execution provider, with its engine cache in the artifact directory and the
    profile `twostep build-engine` and the trt backend use. Its options have no TF32 switch (TensorRT's
    default, on, stays), so an fp32 artifact runs as precision "tf32" here."""

    name = "ort-trt"
    providers = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")

    def __init__(self, artifact: Artifact, threads: int | None = None, optimization: str = "all", tf32: bool = False,
                 profile=None):
        from twostep.runtime.backends.profile import Profile

        super().__init__(artifact, threads, optimization, tf32)
        self.profile = profile or Profile.derive(artifact.config)
        if artifact.precision == "fp32":
            self.precision = "tf32"

    @property
    def target_positions(self) -> int:
        return self.profile.max_new_tokens

    def _load(self) -> None:
        cache = self.artifact.engine_dir("ort-trt")  # created here: the provider does not create parents
        check_ledger(cache)  # ONNX Runtime deserializes what it finds there: only what we recorded
        try:
            super()._load()
            for graph, session in self.sessions.items():
                running = session.get_providers()
                if running[0] != "TensorrtExecutionProvider":  # ONNX Runtime falls back to CUDA silently
                    self.sessions.clear()
                    raise BackendUnavailable(
                        f"ONNX Runtime did not start its TensorRT provider for {graph}.onnx (it runs on "
                        f"{', '.join(running)}): the TensorRT libraries (libnvinfer) are missing or do not match "
                        "this onnxruntime-gpu, or the engine build failed (see ONNX Runtime's log above); "
                        "fix that, or use --backend ort-cuda")
        finally:  # engines the provider built before a failure are ours: recorded, so the next load trusts them
            record_ledger(cache)

    def _close(self) -> None:
        super()._close()
        record_ledger(self.artifact.engine_dir("ort-trt"))  # engines built for shapes met while running

    def provider_list(self, graph: str | None = None) -> list:
        """Per graph: each graph's profile names its own inputs once (a name repeated in one option string
        is read as a second profile)."""
        if graph is None:
            raise ValueError("the TensorRT provider's options are per graph")
        return [("TensorrtExecutionProvider", self.trt_options(graph)), self.cuda_provider(), "CPUExecutionProvider"]

    def trt_options(self, graph: str) -> dict:
        inputs = self.graphs[graph].inputs

        def shapes(k: int) -> str:
            return ",".join(f"{t.name}:" + "x".join(map(str, self.profile.shapes(t.shape)[k])) for t in inputs)

        return {
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(self.artifact.engine_dir("ort-trt")),
            "trt_fp16_enable": self.artifact.precision == "fp16",
            "trt_profile_min_shapes": shapes(0), "trt_profile_opt_shapes": shapes(1),
            "trt_profile_max_shapes": shapes(2),
        }

    def session(self) -> IoBindingSession:
        self.load()
        return IoBindingSession(self, "cuda", profile=self.profile)
