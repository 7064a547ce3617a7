"""The model as the two exported graphs see it: thin wrappers that flatten `encode` and `decode_step` into
named tensors. The exporter traces them; the eager torch backend runs them.

Nothing here re-implements the model: the wrappers only turn per-layer (k, v) pairs into flat tensor lists
in the order the spec (twostep.artifact.spec) declares.
"""

from __future__ import annotations

import torch
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


def search_outputs(logits: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
    """The decoder's search outputs (twostep.artifact.spec) from its logits (B, T, V): of the last position,
    log_norm = log(sum(exp(logits - max))), and the `width` largest logits and their ids (fp16 exports convert
    them with the rest of the graph)."""
    logits = logits.float()  # over every position, then the last one's: no copy of the last position's logits
    top_logits, top_ids = torch.topk(logits, width, dim=-1)
    log_norm = torch.log(torch.exp(logits - top_logits[..., :1]).sum(-1))
    return log_norm[:, -1], top_logits[:, -1], top_ids[:, -1]


class DecoderGraph(nn.Module):
    def __init__(self, model: Transformer, width: int):
        super().__init__()
        self.model, self.width = model, width

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, past_lengths: Tensor,
                past_self: list[Tensor], past_cross: list[Tensor]) -> tuple:
        return decoder_outputs(self.model, self.width, input_ids, encoder_attention_mask, past_lengths, past_self,
                               past_cross)


def decoder_outputs(model: Transformer, width: int, input_ids: Tensor, encoder_attention_mask: Tensor,
                    past_lengths: Tensor, past_self: list[Tensor], past_cross: list[Tensor], attend=None) -> tuple:
    """A step decoder's outputs in the spec's order: logits, the present self-attention cache, the search outputs
    and, for a model with alignment heads, the alignment (B, T, S)."""
    aligned = model.config.alignment_heads > 0
    logits, present, *alignment = model.decode_step(input_ids, encoder_attention_mask, pairs(past_self),
                                                    pairs(past_cross), past_lengths, attend, alignment=aligned)
    return logits, flatten(present), *search_outputs(logits, width), *alignment
