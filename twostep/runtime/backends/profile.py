"""The shapes a TensorRT engine is built for: one `Profile`, derived once from the model, shared by
`twostep build-engine`, the `trt` backend and ONNX Runtime's TensorRT provider (`ort-trt`), so that the
engines one of them builds are the engines the others find in the cache.

TensorRT takes min/opt/max per input, each axis on its own; the graphs add one rule across axes: a decoder
step reads position embeddings `past_len .. past_len + new_len - 1`, so every corner must keep
`past_len + new_len <= max_positions`. A profile allows one-token steps up to `max_new_tokens` target
positions and steps of up to `max_new_len` tokens; `max_new_tokens` is capped at
`max_positions - max_new_len + 1` so that the max corner stays inside the position table.

Imports neither TensorRT nor ONNX Runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

from twostep.artifact.config import ModelConfig
from twostep.errors import BadInput

DEFAULT_ROWS = 64  # decode rows (batch x beam) an engine holds unless a workload needs more
DEFAULT_SRC_LEN = 256
DEFAULT_NEW_TOKENS = 256
DEFAULT_STEP_TOKENS = 4  # tokens fed in one decoder step: the graph-parity grid feeds up to 4


@dataclass(frozen=True)
class Profile:
    """min/opt/max of the symbolic axes. Make one with `Profile.derive`: its fields are already capped."""

    max_batch: int
    opt_batch: int
    max_src_len: int
    opt_src_len: int
    max_new_tokens: int  # target positions a decode can reach: past_len <= max_new_tokens - 1
    opt_past_len: int
    max_new_len: int

    @classmethod
    def derive(cls, config: ModelConfig, rows: int = DEFAULT_ROWS, src_len: int = DEFAULT_SRC_LEN,
               new_tokens: int = DEFAULT_NEW_TOKENS, step_tokens: int = DEFAULT_STEP_TOKENS) -> Profile:
        """The profile for a model and a workload: `rows` decode rows (batch x beam), sources of up to
        `src_len` tokens, `new_tokens` target positions; each capped by what the model can take."""
        if min(rows, src_len, new_tokens, step_tokens) < 1:
            raise BadInput(f"profile sizes must be positive: rows {rows}, src_len {src_len}, "
                           f"new_tokens {new_tokens}, step_tokens {step_tokens}")
        positions = config.max_positions
        step = min(step_tokens, positions)
        targets = min(new_tokens, positions - step + 1)
        max_src = min(src_len, positions)
        return cls(max_batch=rows, opt_batch=min(8, rows), max_src_len=max_src, opt_src_len=min(32, max_src),
                   max_new_tokens=targets, opt_past_len=min(targets // 4, targets - 1), max_new_len=step)

    @classmethod
    def sized_for(cls, config: ModelConfig, rows: int, src_len: int | None = None,
                  new_tokens: int | None = None) -> Profile:
        """The default profile when a workload fits in it (so cached engines are reused), else one that
        holds the workload's rows, source length and target positions."""
        return cls.derive(config, rows=max(DEFAULT_ROWS, rows), src_len=max(DEFAULT_SRC_LEN, src_len or 0),
                          new_tokens=max(DEFAULT_NEW_TOKENS, new_tokens or 0))

    def axis(self, name: str) -> tuple[int, int, int]:
        return {
            "batch": (1, self.opt_batch, self.max_batch),
            "src_len": (1, self.opt_src_len, self.max_src_len),
            "past_len": (0, self.opt_past_len, self.max_new_tokens - 1),
            "new_len": (1, 1, self.max_new_len),
        }[name]

    def shapes(self, dims) -> tuple[tuple[int, ...], ...]:
        """(min, opt, max) shapes of one input from its declared dims."""
        return tuple(tuple(self.axis(d)[k] if isinstance(d, str) else d for d in dims) for k in range(3))

    def check(self, sizes: dict[str, int]) -> None:
        """BadInput naming the first axis outside the profile, its value and the profile's bounds."""
        for name, value in sizes.items():
            low, _, high = self.axis(name)
            if not low <= value <= high:
                flag = {"batch": "--max-batch (rows: batch x beam)", "src_len": "--max-src-len",
                        "past_len": "--max-new-tokens", "new_len": "--max-new-tokens"}[name]
                raise BadInput(f"{name} {value} is outside the engine profile ({low}..{high}); rebuild the engines "
                               f"for it with twostep build-engine {flag}")
        if sizes.get("past_len", 0) + sizes.get("new_len", 0) > self.max_new_tokens:
            raise BadInput(f"decoding past the engine profile's {self.max_new_tokens} target positions; rebuild "
                           "the engines with twostep build-engine --max-new-tokens")


__all__ = ["Profile", "DEFAULT_ROWS"]
