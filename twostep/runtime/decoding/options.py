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


# Beam search's stopping rules (DecodeOptions.beam_stop): twostep's, transformers' generate() with each of its
# early_stopping values (False, True, "never"), CTranslate2's.
BEAM_STOPS = ("n_best", "transformers", "transformers_early", "transformers_never", "ctranslate2")


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
    # the constraint terms it does not hold (indices into its sentence's Constraints.terms): a constrained
    # sentence that reached its limit first (search.ConstrainedBeam)
    unmet: tuple[int, ...] = ()


@dataclass(frozen=True)
class Bound:
    """The range an option takes: `low` to `high`, both included (`low_open`: above `low`), an integer or a finite
    number. DecodeOptions refuses a value outside it; the HTTP API's schema states it (minimum, maximum)."""

    low: float
    high: float
    integer: bool = False
    low_open: bool = False

    def admits(self, value) -> bool:
        if not (is_int(value) if self.integer else is_number(value)):
            return False
        return (self.low < value if self.low_open else self.low <= value) and value <= self.high

    def words(self) -> str:
        if self.integer:
            return f"an integer in [{self.low}, {self.high}]"
        return f"a finite number in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"


MAX_NEW_TOKENS = 1 << 20  # a sentence's tokens: beam search divides by length ** length_penalty
# The range of each option, one table for the CLI, the Python API and both HTTP APIs (the C++ library's kBounds,
# cpp/src/decoding.h, holds the same numbers). Where an end is not the option's own (top_p's 1), it is where the
# arithmetic stops being safe:
# - length_penalty: a beam score is log-probability / length ** length_penalty in float64, as transformers and
#   CTranslate2 compute it (parity keeps the formula). With a length of at most MAX_NEW_TOKENS = 2 ** 20 and
#   |length_penalty| <= 10, length ** length_penalty lies in [2 ** -200, 2 ** 200]: the score is finite, nonzero
#   where the log-probability is, and orders hypotheses as the formula says. At 700 it overflows a double.
# - temperature: logits / temperature in float64; below 0.01 sampling is argmax in all but name (the gap between
#   two fp32 logits of 0.07 is already exp(7) apart) and near 0 the division overflows; above 100 the distribution
#   is uniform to the last digit of a probability.
# - beam_size and n_best: rows of one batch (a server's max_beam is lower still).
# - top_k: any count; beyond the vocabulary it keeps every token. seed: what numpy's and C++'s 64-bit generators
#   take. max_new_tokens and min_new_tokens: a sentence's tokens (a model's max_positions caps them further);
#   no_repeat_ngram_size likewise (an n-gram longer than a sentence bans nothing).
BOUNDS: dict[str, Bound] = {
    "beam_size": Bound(1, 256, integer=True),
    "n_best": Bound(1, 256, integer=True),  # and at most beam_size
    "length_penalty": Bound(-10.0, 10.0),
    "temperature": Bound(0.01, 100.0),
    "top_k": Bound(0, 2**31 - 1, integer=True),
    "top_p": Bound(0.0, 1.0, low_open=True),
    "seed": Bound(0, 2**64 - 1, integer=True),
    "max_new_tokens": Bound(1, MAX_NEW_TOKENS, integer=True),
    "min_new_tokens": Bound(0, MAX_NEW_TOKENS, integer=True),
    "no_repeat_ngram_size": Bound(0, MAX_NEW_TOKENS, integer=True),
}


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode; values outside their BOUNDS and impossible combinations are refused here, with one
    BadInput listing them all."""

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
    # finish; slower, and what a model's transformers reference decodes. "transformers_early" (early_stopping
    # True): the same, done once it has beam_size finished hypotheses. "transformers_never" (early_stopping
    # "never"): the same, but with length_penalty > 0 its best live one is scored at the sentence's limit, where it
    # would score best. What a model imported from transformers decodes by default. "ctranslate2": as CTranslate2's
    # BeamSearch (patience 1): only a candidate among a step's beam_size best may finish, with its raw score, and a
    # sentence is done once it has beam_size finished hypotheses (length_penalty 0: once its best candidate has
    # ended and it has n_best), or at its limit, where the beam_size best candidates all finish; ids a step never
    # picks are out of the softmax. What a CTranslate2 model (an Argos Translate package) decodes.
    beam_stop: str = "n_best"
    # transformers' no_repeat_ngram_size: a token that would complete an n-gram of this size that the sentence
    # (its decoder start token included) already holds is never picked; it stays in beam search's softmax, as
    # transformers' logits processor has it (0: no such rule)
    no_repeat_ngram_size: int = 0

    def __post_init__(self) -> None:
        problems = []
        for name, bound in BOUNDS.items():
            value = getattr(self, name)
            if not (value is None and name in ("seed", "max_new_tokens")) and not bound.admits(value):
                shown = "beam size" if name == "beam_size" else name
                problems.append(f"{shown} must be {bound.words()}, got {value!r}")
        if BOUNDS["beam_size"].admits(self.beam_size) and BOUNDS["n_best"].admits(self.n_best) \
                and self.n_best > self.beam_size:
            problems.append(f"n_best must be at most the beam size {self.beam_size}, got {self.n_best!r}")
        if self.sampling and is_int(self.beam_size) and self.beam_size > 1:
            problems.append("sampling and beam search exclude each other: choose one")
        if self.beam_stop not in BEAM_STOPS:
            problems.append(f"beam_stop must be one of {', '.join(BEAM_STOPS)}, got {self.beam_stop!r}")
        if problems:
            raise BadInput("bad decoding options: " + "; ".join(problems))


def with_defaults(defaults: Mapping[str, Any] | None = None, where: str = "the model's decoding defaults",
                  **given: Any) -> DecodeOptions:
    """The one place where a model's decoding defaults (an artifact manifest's `decoding` section, a checkpoint
    info's) meet a caller's explicit options: DecodeOptions of the defaults, each overridden by a `given` value
    that is not None (None: not given; so a given max_new_tokens or seed of None cannot undo a default). Defaults
    that DecodeOptions refuses are the model's fault: a BadArtifact naming `where`; given values it refuses, with
    the defaults or not, the caller's: BadInput.

    A caller's choice of search wins over the defaults' (`explicit`): sampling asked for on a model whose default
    is beam 4 samples (beam 1, one hypothesis), a beam asked for on a model whose default samples searches, and a
    beam smaller than the default n_best keeps that many hypotheses. Only a caller who asks for both sampling and a
    beam above 1 is refused."""
    defaults = dict(defaults or {})
    try:
        DecodeOptions(**defaults)
    except (BadInput, TypeError) as exc:
        raise BadArtifact(f"{where}: {exc}") from None
    given = {k: v for k, v in given.items() if v is not None}
    return DecodeOptions(**{**defaults, **explicit(defaults, given), **given})


def explicit(defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The defaults that a caller's choice of search overrides (with_defaults)."""
    out: dict[str, Any] = {}
    if given.get("sampling") is True and "beam_size" not in given:
        out.update(beam_size=1, n_best=1)
    if "beam_size" in given:
        if "sampling" not in given and is_int(given["beam_size"]) and given["beam_size"] > 1:
            out["sampling"] = False
        if "n_best" not in given and is_int(given["beam_size"]):
            out["n_best"] = max(1, min(defaults.get("n_best", 1), given["beam_size"]))
    return out


def is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool) and math.isfinite(value)
