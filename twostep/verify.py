"""`twostep verify`: a backend running an artifact against eager PyTorch on its checkpoint.

First graph parity on the shape grid, then whole decoded sequences — greedy and beam search — on the task's
test split (or, for a checkpoint without a task, on random token-id sentences): the share of sequences that
are identical to the last token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from twostep.artifact import load_artifact
from twostep.errors import BadArtifact
from twostep.exporter.validate import REQUIRED_AGREEMENT, ParityReport, compare_backend
from twostep.model.checkpoint import load_checkpoint
from twostep.model.tasks import get_task
from twostep.runtime import backends
from twostep.runtime.backends.torch_backend import TorchBackend
from twostep.runtime.decoding import DecodeOptions
from twostep.runtime.tokenizer import Tokenizer
from twostep.runtime.translator import Limits, Translator


@dataclass
class SequenceReport:
    mode: str
    sentences: int
    identical: int
    first_mismatch: dict | None = None

    @property
    def share(self) -> float:
        return self.identical / max(self.sentences, 1)

    def to_dict(self) -> dict:
        return {"mode": self.mode, "sentences": self.sentences, "identical": self.identical,
                "share": self.share, "first_mismatch": self.first_mismatch}


@dataclass
class VerifyReport:
    backend: str
    precision: str
    graphs: ParityReport
    sequences: list[SequenceReport] = field(default_factory=list)
    required_share: float = 1.0

    @property
    def ok(self) -> bool:
        return self.graphs.ok and all(s.share >= self.required_share for s in self.sequences)

    def to_dict(self) -> dict:
        return {"backend": self.backend, "precision": self.precision, "ok": self.ok,
                "required_share": self.required_share,
                "graphs": self.graphs.to_dict(), "sequences": [s.to_dict() for s in self.sequences]}


def test_sources(artifact, limit: int | None, seed: int = 0) -> list[list[int]]:
    """Token ids of the task's test split, or random sentences when the model has no task or tokenizer."""
    task, spec = artifact.manifest.task, artifact.tokenizer
    if task and spec is not None:
        tokenizer = Tokenizer.load(artifact.path, spec)
        return [tokenizer.encode_source(src) for src, _ in get_task(task).split("test")[:limit]]
    c = artifact.config
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, min(24, c.max_positions), limit or 64)
    return [rng.integers(4, c.src_vocab_size, n).tolist() + [c.eos_id] for n in lengths]


def verify(art_dir: Path, ckpt_dir: Path, backend: str = "ort-cpu", beam_size: int = 4,
           limit: int | None = None, batch_size: int = 32, device: str = "cpu",
           log=lambda message: None) -> VerifyReport:
    """`device`: where the eager reference runs (cuda: the GPU reference for GPU backends)."""
    artifact = load_artifact(art_dir)
    ckpt = load_checkpoint(ckpt_dir)
    if ckpt.config != artifact.config:
        raise BadArtifact(f"{art_dir} was not exported from {ckpt_dir}: the model configs differ")
    options = {"device": device} if backend == "torch" else {}
    options.update(backends.workload_options(backend, artifact.config, rows=batch_size * beam_size))
    candidate = backends.create(backend, artifact=artifact, checkpoint_dir=ckpt_dir, **options)
    with candidate, TorchBackend(ckpt.model, device=device) as reference:
        log(f"graph parity on the shape grid ({backend} vs eager torch)")
        precision = candidate.precision  # fp32, tf32 (opted in, or ort-trt), fp16 or int8
        report = VerifyReport(backend, precision, compare_backend(candidate, reference, precision),
                              required_share=REQUIRED_AGREEMENT[precision])
        sources = test_sources(artifact, limit)
        for mode, options in (("greedy", DecodeOptions()), (f"beam{beam_size}", DecodeOptions(beam_size=beam_size))):
            log(f"{mode} decoding of {len(sources)} sentences")
            limits = Limits.of(artifact.config, candidate.target_positions)  # both decode as far as it can
            want, got = (Translator(session, limits, batch_size=batch_size, options=options).translate_ids(sources)
                         for session in (reference.session(), candidate.session()))
            same = [w == g for w, g in zip(want, got)]
            mismatch = next(({"sentence": i, "expected": w, "got": g}
                             for i, (w, g, ok) in enumerate(zip(want, got, same)) if not ok), None)
            report.sequences.append(SequenceReport(mode, len(sources), sum(same), mismatch))
    return report
