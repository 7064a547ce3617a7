"""ONNX Runtime backends: `ort-cpu`, and `ort-cuda` (CUDA execution provider with IO binding, so that the
KV cache and cross K/V stay on the device between steps; only token ids and beam origins cross to the host).
"""

from __future__ import annotations


from twostep.artifact import Artifact, check_ledger, record_ledger
from twostep.errors import BackendUnavailable, BadArtifact
from twostep.runtime.backends.base import Backend, Feeds


def import_ort():
    try:
        import onnxruntime
    except ImportError as exc:
        raise BackendUnavailable(f"onnxruntime is not installed ({exc}); pip install onnxruntime") from None
    return onnxruntime


class OrtBackend(Backend):
    name = "ort-cpu"
    providers: tuple[str, ...] = ("CPUExecutionProvider",)

    def __init__(self, artifact: Artifact, threads: int | None = None, optimization: str = "all"):
        super().__init__(artifact.config, artifact.graphs)
        self.artifact, self.threads, self.optimization = artifact, threads, optimization
        self.sessions: dict = {}

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            ort = import_ort()
        except BackendUnavailable as exc:
            return str(exc)
        missing = [p for p in cls.providers if p not in ort.get_available_providers()]
        if missing:
            return (f"this onnxruntime build lacks {', '.join(missing)} (it has "
                    f"{', '.join(ort.get_available_providers())})")
        return None

    def session_options(self):
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
        return options

    def _load(self) -> None:
        ort = import_ort()
        for graph in self.graphs:
            path = self.artifact.graph_file(graph)
            try:
                self.sessions[graph] = ort.InferenceSession(str(path), self.session_options(),
                                                            providers=self.provider_list())
            except Exception as exc:  # onnxruntime raises its own exception types for unreadable models
                raise BadArtifact(f"{path}: ONNX Runtime cannot load it: {str(exc).splitlines()[0][:300]}") from None

    def provider_list(self) -> list:
        return list(self.providers)

    def _run(self, graph: str, feeds: Feeds) -> Feeds:
        session = self.sessions[graph]
        names = self.graphs[graph].output_names
        return dict(zip(names, session.run(names, feeds)))

    def _close(self) -> None:
        self.sessions.clear()


class OrtCudaBackend(OrtBackend):
    name = "ort-cuda"
    providers = ("CUDAExecutionProvider", "CPUExecutionProvider")

    def session(self):
        from twostep.runtime.backends.ort_cuda import IoBindingSession

        self.load()
        return IoBindingSession(self, "cuda")


class OrtTrtBackend(OrtCudaBackend):
    """ONNX Runtime's TensorRT execution provider, with its engine cache in the artifact directory."""

    name = "ort-trt"
    providers = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")

    def _load(self) -> None:
        cache = self.artifact.engine_dir("ort-trt")
        check_ledger(cache)  # ONNX Runtime deserializes what it finds there: only what we recorded
        super()._load()
        record_ledger(cache)

    def _close(self) -> None:
        super()._close()
        record_ledger(self.artifact.engine_dir("ort-trt"))  # engines built for shapes met while running

    def provider_list(self) -> list:
        from twostep.runtime.backends.trt import Profile

        profile = Profile()

        def shapes(k: int) -> str:
            return ",".join(f"{t.name}:" + "x".join(map(str, profile.shapes(t.shape)[k]))
                            for spec in self.graphs.values() for t in spec.inputs)

        options = {
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(self.artifact.engine_dir("ort-trt")),
            "trt_fp16_enable": self.artifact.precision == "fp16",
            "trt_profile_min_shapes": shapes(0), "trt_profile_opt_shapes": shapes(1),
            "trt_profile_max_shapes": shapes(2),
        }
        return [("TensorrtExecutionProvider", options), "CUDAExecutionProvider", "CPUExecutionProvider"]
