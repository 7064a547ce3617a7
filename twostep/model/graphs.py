"""The model as the two exported graphs see it: thin wrappers that flatten `encode` and `decode_step` into
named tensors. The exporter traces them; the eager torch backend runs them.

Nothing here re-implements the model: the wrappers only turn per-layer (k, v) pairs into flat tensor lists
in the order the spec (twostep.artifact.spec) declares.
"""

from __future__ import annotations

from torch import Tensor, nn

from twostep.model.transformer import Transformer


def pairs(flat: list[Tensor]) -> list[tuple[Tensor, Tensor]]:
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


def flatten(kv: list[tuple[Tensor, Tensor]]) -> list[Tensor]:
    return [t for pair in kv for t in pair]


class EncoderGraph(nn.Module):
    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> list[Tensor]:
        return flatten(self.model.encode(input_ids, attention_mask))


class DecoderGraph(nn.Module):
    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, past_lengths: Tensor,
                past_self: list[Tensor], past_cross: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
        logits, present = self.model.decode_step(input_ids, encoder_attention_mask, pairs(past_self),
                                                 pairs(past_cross), past_lengths)
        return logits, flatten(present)
