"""How a server batches: `BatchLimits`, the one definition of the limits. `twostep serve`'s options take their
defaults and help from its fields; Ray Serve's app arguments are read by `BatchLimits.from_strings`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, get_args, get_type_hints

from twostep.errors import BadInput
from twostep.runtime.decoding.options import BOUNDS

if TYPE_CHECKING:
    from twostep.artifact.config import ModelConfig

BATCHING = {"inflight": True, "static": False}  # `--batching` (serve) and `batching=` (Ray): BatchLimits.inflight


def limit_field(default, doc: str):
    """A BatchLimits field: its default, and what it does in a sentence (`twostep serve --help` shows both)."""
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class BatchLimits:
    """How the executor batches: a batch holds at most max_batch_tokens (source tokens x beam) and
    max_batch_rows (sentences x beam); it starts once its first sentence has waited max_wait_ms (or is
    full, or the callers the worker last answered are all back); at most max_queue sentences wait.
    `inflight`: waiting sentences join the running batch at the next step (False: they wait for it to end;
    docs/benchmarks.md measures both). In flight, `express_tokens` > 0 opens the express lane: sentences of at
    most that many source tokens decode in a batch of their own (at most `express_rows` rows), stepped first,
    with `express_share` of the time while both batches run.

    Admission: a request is refused before it is queued (BatchingTranslator.submit_ids) if its beam is above
    max_beam or max_batch_rows (a beam's rows decode in one batch), if it asks for more than max_new_tokens
    new tokens a sentence (None: the model's max_positions; the default, 2 x source + 16, is capped at it), or
    if its work, sentences x beam x new tokens, is above max_request_work (TooLarge). `worst_case_bytes`: the
    most memory decoding then takes.

    The one definition of these limits: `twostep serve`'s options take their defaults and help from the
    fields, Ray Serve's app arguments are read by `from_strings`."""

    max_batch_tokens: int = limit_field(4096, "A batch holds at most this many source tokens x beam.")
    max_batch_rows: int = limit_field(64, "A batch holds at most this many rows (sentences x beam).")
    max_wait_ms: float = limit_field(5.0, "How long a batch waits to fill after its first sentence.")
    max_queue: int = limit_field(1024, "Sentences that may wait; beyond it requests get 503 (Overloaded).")
    inflight: bool = limit_field(True, "inflight: sentences that arrive while a batch runs join it at its next "
                                 "step; static: they wait until it ends (see the README).")  # as batching=, BATCHING
    express_tokens: int = limit_field(0, "In flight: sentences of at most this many source tokens decode in an "
                                      "express lane stepped before the main batch (0: none; see the README).")
    express_rows: int = limit_field(8, "The express lane holds at most this many rows; beyond them short "
                                    "sentences join the main batch.")
    express_share: float = limit_field(0.9, "The share of decoding time the express lane takes while both it and "
                                       "the main batch run.")
    max_beam: int = limit_field(16, "A request's beam size is at most this, and at most max_batch_rows; beyond "
                                "it 400.")
    max_new_tokens: int | None = limit_field(None, "A request's max_new_tokens is at most this (beyond it 400); "
                                             "its default, 2 x source + 16, is capped at it. Default: the model's "
                                             "max_positions.")
    max_request_work: int = limit_field(65536, "A request's work, sentences x beam x new tokens (each sentence's "
                                        "max_new_tokens), is at most this; beyond it 413.")

    def __post_init__(self) -> None:
        problems = [f"{name} must be positive, got {getattr(self, name)!r}" for name in
                    ("max_batch_tokens", "max_batch_rows", "max_queue", "express_rows", "max_beam", "max_request_work")
                    if getattr(self, name) < 1]
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            problems.append(f"max_new_tokens must be positive (or None: the model's max_positions), got "
                            f"{self.max_new_tokens!r}")
        if self.max_wait_ms < 0:
            problems.append(f"max_wait_ms must be 0 or more, got {self.max_wait_ms!r}")
        if self.express_tokens < 0:
            problems.append(f"express_tokens must be 0 (no express lane) or more, got {self.express_tokens!r}")
        if not 0 < self.express_share < 1:
            problems.append(f"express_share must be above 0 and below 1, got {self.express_share!r}")
        if problems:
            raise BadInput("bad batching limits: " + "; ".join(problems))

    @property
    def express(self) -> bool:
        """Whether there is an express lane: in flight only."""
        return self.inflight and self.express_tokens > 0

    @property
    def beam_limit(self) -> int:
        """The widest beam a request may ask for: max_beam, at most max_batch_rows (the executor's admission
        refuses wider) and the decoding options' own bound (BOUNDS)."""
        return min(self.max_beam, self.max_batch_rows, int(BOUNDS["beam_size"].high))

    @property
    def batching(self) -> str:
        """`inflight` as the command line and Ray's arguments spell it: inflight or static."""
        return next(name for name, inflight in BATCHING.items() if inflight == self.inflight)

    def new_tokens(self, max_positions: int) -> int:
        """The most new tokens a sentence decodes on a model of max_positions: max_new_tokens, at most
        max_positions (None: max_positions)."""
        return min(self.max_new_tokens or max_positions, max_positions)

    def worst_case_bytes(self, config: ModelConfig, dtype_bytes: int = 4) -> int:
        """The most memory decoding takes at once under these limits, on a model of `config` with K/V of
        `dtype_bytes` (fp32: 4): max_batch_rows rows (and express_rows in the express lane), whichever requests
        they hold, each at P positions (new_tokens, at least the in-place decoder's first buffer) and S source
        tokens (max_positions, or express_tokens: a batch's rows are padded to its longest source). Per row:

        - K/V: the self-attention K and V of every decoder layer at P positions and the cross-attention's at
          S, four times over: two copies are alive at once (a step's past and present; the batch's cross K/V
          and the joining sentences' from the encoder) in ONNX Runtime's arena, which grows by regions that
          double; the in-place decoder's buffers (at most twice the positions they hold: they double) and
          their grown copy, likewise;
        - the encoder, for the sentence that took the row: one layer's attention scores and probabilities
          (2 x n_heads x S x S) and feed-forward activation (S x d_ff), twice over (the arena);
        - the logits row: float32, and beam search's float64 copy.

        tests/serving/test_admission.py holds a server's RSS under the worst request within it (demo model);
        the README states it for the base preset."""
        from twostep.runtime.backends.inplace import FIRST_CAPACITY

        positions = min(max(self.new_tokens(config.max_positions), FIRST_CAPACITY), config.max_positions)
        kv = config.n_decoder_layers * config.n_heads * (config.head_dim_k + config.head_dim_v)  # values a position

        def row(source: int) -> int:
            cache = 4 * kv * (positions + source) * dtype_bytes
            encoder = 2 * (2 * config.n_heads * source * source + source * config.d_ff) * dtype_bytes
            return cache + encoder + (4 + 8) * config.tgt_vocab_size

        lanes = [(self.max_batch_rows, config.max_positions)]
        if self.express:
            lanes.append((self.express_rows, min(self.express_tokens, config.max_positions)))
        return sum(rows * row(source) for rows, source in lanes)

    @classmethod
    def doc(cls, name: str) -> str:
        """What field `name` does, in a sentence: the help of `twostep serve`'s option for it."""
        return next(f.metadata["doc"] for f in fields(cls) if f.name == name)

    @classmethod
    def from_strings(cls, values: Mapping[str, str]) -> BatchLimits:
        """The limits given as key=value strings (Ray Serve's `serve run ... max_wait_ms=2`): any field by its
        name (LIMIT_KEYS), its value converted to the field's type (`none` for an optional one's None, as
        max_new_tokens=none); `inflight` as batching=inflight|static, as on the command line. Anything wrong is
        one BadInput."""
        unknown = sorted(set(values) - set(LIMIT_KEYS))
        if unknown:
            raise BadInput(f"unknown batching limits {unknown}: the limits are {', '.join(LIMIT_KEYS)}")
        types, given = get_type_hints(cls), {}
        for key, text in values.items():
            if key == "batching":
                if text not in BATCHING:
                    raise BadInput(f"batching takes {' or '.join(BATCHING)}, got {text!r}")
                given["inflight"] = BATCHING[text]
                continue
            kind, optional = types[key], type(None) in get_args(types[key])  # int | None
            if optional:
                kind = next(t for t in get_args(kind) if t is not type(None))
                if text.lower() == "none":
                    given[key] = None
                    continue
            try:
                given[key] = kind(text)
            except ValueError:
                raise BadInput(f"{key} takes a number ({kind.__name__}{' or none' if optional else ''}), "
                               f"got {text!r}") from None
        return cls(**given)


LIMIT_KEYS = ("batching", *(f.name for f in fields(BatchLimits) if f.name != "inflight"))  # BatchLimits.from_strings
