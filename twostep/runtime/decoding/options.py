"""What a decode is asked for and what it gives back: the options (checked once, here), the special token ids
of the model it runs, and the hypotheses."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from twostep.errors import BadArtifact, BadInput

if TYPE_CHECKING:
    from twostep.artifact.config import ModelConfig


BEAM_STOPS = ("n_best", "transformers", "ctranslate2")


@dataclass(frozen=True)
class Specials:
    """The special token ids of a model's vocabularies, and how its decoder starts.

    `bos_id` is the decoder's start token (the config's decoder_start_id where it has one: Marian starts from
    pad, M2M100 from eos). `never`: ids decoding never picks (Marian's pad). A sentence's forced tokens after
    the start (a target-language token) are its own: `Entry.prefix`."""

    pad_id: int
    bos_id: int
    eos_id: int
    unk_id: int
    never: tuple[int, ...] = ()

    @classmethod
    def of(cls, config: ModelConfig) -> Specials:
        return cls(pad_id=config.pad_id, bos_id=config.start_id, eos_id=config.eos_id, unk_id=config.unk_id,
                   never=tuple(config.never_generate))

    def blocked(self, suppress_eos: bool) -> list[int]:
        """The ids a step never picks."""
        return [*self.never, self.eos_id] if suppress_eos else list(self.never)


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]
    score: float  # sum of log-probs divided by length ** length_penalty
    # (index into tokens, source piece) for each <unk> that replace_unknowns replaces in its text
    replacements: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode; impossible combinations are refused here, with one BadInput listing them all."""

    beam_size: int = 1
    length_penalty: float = 1.0
    n_best: int = 1
    sampling: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_new_tokens: int | None = None  # None: 2 * source length + 16; always capped by max_positions
    # eos is out of the distribution (not a candidate, not in the softmax: CTranslate2's min_decoding_length)
    # until a sentence has generated this many tokens
    min_new_tokens: int = 0
    suppress_eos: bool = False
    # each <unk> of a hypothesis' text replaced by the source piece it attends to most, in the decoder's alignment
    # heads (CTranslate2's replace_unknowns; a model imported with alignment heads: CTranslate2's, Argos')
    replace_unknowns: bool = False
    # Beam search's stopping rule. "n_best": a sentence is done once it has n_best finished hypotheses and its
    # best live one cannot beat the worst of them. "transformers": as transformers' generate() (early_stopping
    # False): it keeps beam_size finished hypotheses, and only a candidate among a step's beam_size best may
    # finish; slower, and what a model's transformers reference decodes. "ctranslate2": as CTranslate2's
    # BeamSearch (patience 1): only a candidate among a step's beam_size best may finish, with its raw score, and a
    # sentence is done once it has beam_size finished hypotheses (length_penalty 0: once its best candidate has
    # ended and it has n_best), or at its limit, where the beam_size best candidates all finish; ids a step never
    # picks are out of the softmax. What a CTranslate2 model (an Argos Translate package) decodes.
    beam_stop: str = "n_best"

    def __post_init__(self) -> None:
        problems = []
        if not is_int(self.beam_size) or self.beam_size < 1:
            problems.append(f"beam size must be an integer >= 1, got {self.beam_size!r}")
        elif not is_int(self.n_best) or not 1 <= self.n_best <= self.beam_size:
            problems.append(f"n_best must be between 1 and the beam size {self.beam_size}, got {self.n_best!r}")
        if self.sampling and is_int(self.beam_size) and self.beam_size > 1:
            problems.append("sampling and beam search exclude each other: choose one")
        for name in ("length_penalty", "temperature", "top_p"):
            if not is_number(getattr(self, name)):
                problems.append(f"{name} must be a finite number, got {getattr(self, name)!r}")
        if is_number(self.temperature) and self.temperature <= 0:
            problems.append(f"temperature must be positive, got {self.temperature}")
        if is_number(self.top_p) and not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if not is_int(self.top_k) or self.top_k < 0:
            problems.append(f"top_k must be an integer >= 0 (0: off), got {self.top_k!r}")
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            problems.append(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.beam_stop not in BEAM_STOPS:
            problems.append(f"beam_stop must be one of {', '.join(BEAM_STOPS)}, got {self.beam_stop!r}")
        if self.max_new_tokens is not None and (not is_int(self.max_new_tokens) or self.max_new_tokens < 1):
            problems.append(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not is_int(self.min_new_tokens) or self.min_new_tokens < 0:
            problems.append(f"min_new_tokens must be an integer >= 0, got {self.min_new_tokens!r}")
        if problems:
            raise BadInput("bad decoding options: " + "; ".join(problems))


def with_defaults(defaults: Mapping[str, Any] | None = None, where: str = "the model's decoding defaults",
                  **given: Any) -> DecodeOptions:
    """The one place where a model's decoding defaults (an artifact manifest's `decoding` section, a checkpoint
    info's) meet a caller's explicit options: DecodeOptions of the defaults, each overridden by a `given` value
    that is not None (None: not given; so a given max_new_tokens or seed of None cannot undo a default). Defaults
    that DecodeOptions refuses are the model's fault: a BadArtifact naming `where`; given values it refuses, with
    the defaults or not, the caller's: BadInput."""
    defaults = dict(defaults or {})
    try:
        DecodeOptions(**defaults)
    except (BadInput, TypeError) as exc:
        raise BadArtifact(f"{where}: {exc}") from None
    return DecodeOptions(**{**defaults, **{k: v for k, v in given.items() if v is not None}})


def is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool) and math.isfinite(value)
