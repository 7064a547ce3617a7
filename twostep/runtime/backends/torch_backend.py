"""`torch`: the eager reference, running `encode`/`decode_step` behind the graphs' tensor names.

Its session keeps the decoder's inputs between steps in torch tensors under the graphs' names, like every other
session (the RowSession base): rows at different positions, sentences joining and leaving.
"""

from __future__ import annotations

import numpy as np
import torch

from twostep.artifact.spec import graph_specs, search_width
from twostep.model.graphs import DecoderGraph, EncoderGraph, pairs
from twostep.model.transformer import Transformer
from twostep.runtime.backends.base import Backend, Feeds
from twostep.runtime.backends.rows import TorchOps
from twostep.runtime.backends.session import MASK, RowSession


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
        self.wrappers = {"encoder": EncoderGraph(self.model),
                         "decoder": DecoderGraph(self.model, search_width(self.config))}

    @torch.inference_mode()
    def _run(self, graph: str, feeds: Feeds, outputs: list[str] | None = None) -> Feeds:
        spec = self.graphs[graph]
        t = {k: torch.from_numpy(np.ascontiguousarray(v)).to(self.device) for k, v in feeds.items()}
        if graph == "encoder":
            outputs = self.wrappers["encoder"](t["input_ids"], t["attention_mask"])
        else:
            past = [t[s.name] for s in spec.past_self]
            cross = [t[s.name] for s in spec.past_cross]
            logits, present, *search = self.wrappers["decoder"](t["input_ids"], t["encoder_attention_mask"],
                                                                t["past_lengths"], past, cross)
            outputs = [logits, *present, *search]
        return {name: (out.float() if out.is_floating_point() else out).cpu().numpy()
                for name, out in zip(spec.output_names, outputs)}

    def session(self) -> TorchSession:
        self.load()
        return TorchSession(self.model, self.device)


class TorchSession(RowSession):
    """Every call runs in inference mode: the rows' tensors are inference tensors, written in place."""

    def __init__(self, model: Transformer, device: str | torch.device = "cpu"):
        self.model = model.eval()
        self.device = torch.device(device)
        super().__init__(model.config, graph_specs(model.config)["decoder"], TorchOps(torch))
        self.cross_names = [t.name for t in self.decoder.past_cross]
        self.self_names = [t.name for t in self.decoder.past_self]
        self.search_width = 0  # the eager reference gives the logits: the search runs on the host, in float64

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, rows: int) -> dict:
        mask = torch.from_numpy(np.array(attention_mask)).to(self.device)
        cross = self.model.encode(torch.from_numpy(input_ids).to(self.device), mask)
        return {MASK: mask, **dict(zip(self.cross_names, (t for kv in cross for t in kv)))}

    def empty_cache(self, batch: int) -> dict:
        empty = self.model.empty_cache(batch)
        return dict(zip(self.self_names, (t.to(self.device) for kv in empty for t in kv)))

    def run_decoder(self, input_ids: np.ndarray, need_logits: bool = True) -> tuple[dict, dict]:
        """The full logits only, whatever is asked: the eager reference leaves the search to the host."""
        t = self.rows.tensors
        ids = torch.from_numpy(input_ids).to(self.device)
        lengths = torch.from_numpy(self.rows.lengths.copy()).to(self.device)
        logits, present = self.model.decode_step(ids, t[MASK], pairs([t[n] for n in self.self_names]),
                                                 pairs([t[n] for n in self.cross_names]), lengths)
        return ({"logits": logits[:, -1].float().cpu().numpy()},
                dict(zip(self.self_names, (x for kv in present for x in kv))))

    @torch.inference_mode()
    def alignment(self, input_ids: np.ndarray, attention_mask: np.ndarray, targets: np.ndarray) -> np.ndarray:
        if not self.config.alignment_heads:
            return super().alignment(input_ids, attention_mask, targets)  # refuses
        mask = torch.from_numpy(np.array(attention_mask)).to(self.device)
        cross = self.model.encode(torch.from_numpy(np.array(input_ids)).to(self.device), mask)
        ids = torch.from_numpy(np.ascontiguousarray(targets, np.int64)).to(self.device)
        _, _, aligned = self.model.decode_step(ids, mask, self.model.empty_cache(len(ids)), cross, alignment=True)
        return aligned.float().cpu().numpy()

    @torch.inference_mode()
    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> None:
        super().start(input_ids, attention_mask)

    @torch.inference_mode()
    def admit(self, input_ids: np.ndarray, attention_mask: np.ndarray, sources: np.ndarray, rows: np.ndarray) -> None:
        super().admit(input_ids, attention_mask, sources, rows)

    @torch.inference_mode()
    def search_step(self, input_ids: np.ndarray, need_logits: bool = True) -> dict:
        return super().search_step(input_ids, need_logits)

    @torch.inference_mode()
    def reorder(self, origin: np.ndarray, cache_only: bool = False) -> None:
        super().reorder(origin, cache_only)
