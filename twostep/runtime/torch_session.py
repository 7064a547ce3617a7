"""The eager PyTorch reference behind the decoding loop: `encode` and `decode_step`, nothing re-implemented.

Its decoder inputs between steps are kept like every other session's (twostep.runtime.backends.rows), in
torch tensors under the graphs' names: rows at different positions, sentences joining and leaving.
"""

from __future__ import annotations

import numpy as np
import torch

from twostep.exporter.graphs import pairs
from twostep.exporter.spec import graph_specs
from twostep.model.transformer import Transformer
from twostep.runtime.backends.base import check_positions
from twostep.runtime.backends.rows import DecoderRows, TorchOps

MASK = "encoder_attention_mask"


class TorchSession:
    def __init__(self, model: Transformer, device: str | torch.device = "cpu"):
        self.model = model.eval()
        self.device = torch.device(device)
        decoder = graph_specs(model.config)["decoder"]
        self.cross_names = [t.name for t in decoder.past_cross]
        self.self_names = [t.name for t in decoder.past_self]
        self.rows = DecoderRows(TorchOps(torch), MASK, self.cross_names, self.self_names)

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> dict:
        mask = torch.from_numpy(np.array(attention_mask)).to(self.device)
        cross = self.model.encode(torch.from_numpy(input_ids).to(self.device), mask)
        return {MASK: mask, **dict(zip(self.cross_names, (t for kv in cross for t in kv)))}

    @torch.inference_mode()
    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> None:
        tensors = self.encode(input_ids, attention_mask)
        empty = self.model.empty_cache(input_ids.shape[0])
        tensors.update(zip(self.self_names, (t.to(self.device) for kv in empty for t in kv)))
        self.rows.start(tensors, attention_mask.sum(1))

    @torch.inference_mode()
    def admit(self, input_ids: np.ndarray, attention_mask: np.ndarray, sources: np.ndarray, rows: np.ndarray) -> None:
        self.rows.admit(self.encode(input_ids, attention_mask), attention_mask.sum(1), sources, rows)

    def release(self, rows: np.ndarray) -> None:
        self.rows.release(rows)

    @torch.inference_mode()
    def step(self, input_ids: np.ndarray) -> np.ndarray:
        t = self.rows.tensors
        check_positions(self.model.config, self.rows.longest + input_ids.shape[1])
        ids = torch.from_numpy(input_ids).to(self.device)
        lengths = torch.from_numpy(self.rows.lengths.copy()).to(self.device)
        logits, present = self.model.decode_step(ids, t[MASK], pairs([t[n] for n in self.self_names]),
                                                 pairs([t[n] for n in self.cross_names]), lengths)
        self.rows.advance(dict(zip(self.self_names, (x for kv in present for x in kv))), input_ids.shape[1])
        return logits[:, -1].float().cpu().numpy()

    @torch.inference_mode()
    def reorder(self, origin: np.ndarray, cache_only: bool = False) -> None:
        self.rows.reorder(origin, cache_only)
