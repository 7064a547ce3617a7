"""The eager PyTorch reference behind the decoding loop: `encode` and `decode_step`, nothing re-implemented."""

from __future__ import annotations

import numpy as np
import torch

from twostep.model.transformer import KV, Transformer


class TorchSession:
    def __init__(self, model: Transformer, device: str | torch.device = "cpu"):
        self.model = model.eval()
        self.device = torch.device(device)
        self.mask: torch.Tensor | None = None
        self.cross: list[KV] = []
        self.past: list[KV] = []

    @torch.inference_mode()
    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> None:
        self.mask = torch.from_numpy(attention_mask).to(self.device)
        self.cross = self.model.encode(torch.from_numpy(input_ids).to(self.device), self.mask)
        self.past = self.model.empty_cache(input_ids.shape[0])

    @torch.inference_mode()
    def step(self, input_ids: np.ndarray) -> np.ndarray:
        ids = torch.from_numpy(input_ids).to(self.device)
        logits, self.past = self.model.decode_step(ids, self.mask, self.past, self.cross)
        return logits[:, -1].float().cpu().numpy()

    @torch.inference_mode()
    def reorder(self, origin: np.ndarray, cache_only: bool = False) -> None:
        index = torch.from_numpy(origin).to(self.device)
        self.past = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.past]
        if not cache_only:
            self.mask = self.mask.index_select(0, index)
            self.cross = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.cross]
