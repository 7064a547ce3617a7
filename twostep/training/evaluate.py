"""Exact match and BLEU of a model on a split of its task, greedy decoding."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sacrebleu.metrics import BLEU, CHRF

from twostep.errors import BadCheckpoint
from twostep.model.checkpoint import Checkpoint
from twostep.model.tasks import get_task
from twostep.runtime.backends.torch_backend import TorchSession
from twostep.runtime.tokenizer import Tokenizer
from twostep.runtime.translator import Limits, Translator


@dataclass
class Scores:
    task: str
    split: str
    sentences: int
    exact_match: float  # percent
    bleu: float
    chrf: float

    def to_dict(self) -> dict:
        return asdict(self)


def checkpoint_translator(ckpt: Checkpoint, batch_size: int = 64) -> Translator:
    if ckpt.tokenizer is None:
        raise BadCheckpoint(f"{ckpt.path}: no tokenizer; text commands need one")
    return Translator(TorchSession(ckpt.model), Limits.of(ckpt.config), Tokenizer.load(ckpt.path, ckpt.tokenizer),
                      batch_size)


def score(hypotheses: list[str], references: list[str], task: str, split: str) -> Scores:
    exact = sum(h == r for h, r in zip(hypotheses, references))
    return Scores(
        task=task, split=split, sentences=len(references),
        exact_match=100.0 * exact / max(len(references), 1),
        # effective_order: German compounds make many one-word sentences, which have no 4-grams at all.
        bleu=BLEU(effective_order=True).corpus_score(hypotheses, [references]).score,
        chrf=CHRF().corpus_score(hypotheses, [references]).score,
    )


def evaluate(translator: Translator, task_name: str, split: str = "test", limit: int | None = None) -> Scores:
    pairs = get_task(task_name).split(split)[:limit]
    hyps = translator.translate([src for src, _ in pairs])
    return score(hyps, [tgt for _, tgt in pairs], task_name, split)
