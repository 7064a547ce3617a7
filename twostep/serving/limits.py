"""How a server batches: `BatchLimits`, the one definition of the limits. `twostep serve`'s options take their
defaults and help from its fields; Ray Serve's app arguments are read by `BatchLimits.from_strings`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import get_type_hints

from twostep.errors import BadInput

BATCHING = {"inflight": True, "static": False}  # `--batching` (serve) and `batching=` (Ray): BatchLimits.inflight


def limit_field(default, doc: str):
    """A BatchLimits field: its default, and what it does in a sentence (`twostep serve --help` shows both)."""
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class BatchLimits:
    """How the executor batches: a batch holds at most max_batch_tokens (source tokens x beam) and
    max_batch_rows (sentences x beam); it starts once its first sentence has waited max_wait_ms (or is
    full); at most max_queue sentences wait. `inflight`: waiting sentences join the running batch at the next
    step (False: they wait for it to end; docs/benchmarks.md measures both). In flight, `express_tokens` > 0
    opens the express lane: sentences of at most that many source tokens decode in a batch of their own (at
    most `express_rows` rows), stepped first, with `express_share` of the time while both batches run.

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

    def __post_init__(self) -> None:
        problems = [f"{name} must be positive, got {getattr(self, name)!r}" for name in
                    ("max_batch_tokens", "max_batch_rows", "max_queue", "express_rows") if getattr(self, name) < 1]
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
    def batching(self) -> str:
        """`inflight` as the command line and Ray's arguments spell it: inflight or static."""
        return next(name for name, inflight in BATCHING.items() if inflight == self.inflight)

    @classmethod
    def doc(cls, name: str) -> str:
        """What field `name` does, in a sentence: the help of `twostep serve`'s option for it."""
        return next(f.metadata["doc"] for f in fields(cls) if f.name == name)

    @classmethod
    def from_strings(cls, values: Mapping[str, str]) -> BatchLimits:
        """The limits given as key=value strings (Ray Serve's `serve run ... max_wait_ms=2`): any field by its
        name (LIMIT_KEYS), its value converted to the field's type; `inflight` as batching=inflight|static, as
        on the command line. Anything wrong is one BadInput."""
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
            try:
                given[key] = types[key](text)
            except ValueError:
                raise BadInput(f"{key} takes a number ({types[key].__name__}), got {text!r}") from None
        return cls(**given)


LIMIT_KEYS = ("batching", *(f.name for f in fields(BatchLimits) if f.name != "inflight"))  # BatchLimits.from_strings
