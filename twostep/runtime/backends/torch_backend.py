"""`torch`: the eager reference, running `encode`/`decode_step` behind the graphs' tensor names."""

from __future__ import annotations

import numpy as np
import torch

from twostep.exporter.graphs import DecoderGraph, EncoderGraph
from twostep.exporter.spec import graph_specs
from twostep.model.transformer import Transformer
from twostep.runtime.backends.base import Backend, Feeds


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, model: Transformer, device: str = "cpu", threads: int | None = None):
        super().__init__(model.config, graph_specs(model.config))
        self.model, self.device, self.threads = model.eval(), torch.device(device), threads

    @classmethod
    def unavailable(cls, device: str = "cpu") -> str | None:
        if device.startswith("cuda") and not torch.cuda.is_available():
            return "torch was built without CUDA or no GPU is visible; use --device cpu"
        return None

    def _load(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        self.model.to(self.device)
        self.wrappers = {"encoder": EncoderGraph(self.model), "decoder": DecoderGraph(self.model)}

    @torch.inference_mode()
    def _run(self, graph: str, feeds: Feeds) -> Feeds:
        spec = self.graphs[graph]
        t = {k: torch.from_numpy(np.ascontiguousarray(v)).to(self.device) for k, v in feeds.items()}
        if graph == "encoder":
            outputs = self.wrappers["encoder"](t["input_ids"], t["attention_mask"])
        else:
            past = [t[s.name] for s in spec.past_self]
            cross = [t[s.name] for s in spec.past_cross]
            logits, present = self.wrappers["decoder"](t["input_ids"], t["encoder_attention_mask"], t["past_lengths"],
                                                       past, cross)
            outputs = [logits, *present]
        return {name: out.float().cpu().numpy() for name, out in zip(spec.output_names, outputs)}

    def session(self):
        from twostep.runtime.torch_session import TorchSession

        self.load()
        return TorchSession(self.model, self.device)
