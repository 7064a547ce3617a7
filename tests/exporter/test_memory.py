"""Export within memory (issue 48): the weights are memory-mapped once and never copied whole. A model of
~300 MB is exported (fp32 and int8, validation on) in a child process whose process tree is sampled
(benchmarks/memory.py); its peak PSS above the same export of a model of a few MB (the fixed cost: Python,
torch, ONNX Runtime) must stay within 1.5x the larger model's parameter bytes. Any whole copy of the weights
(the eager model copied out of its file, a graph serialized in memory, the quantizer's whole-model proto, a
session's prepacked weights next to the model's) makes it 2x or more. int8 is allowed 0.5 GiB more, whatever
the model's size: the quantizer's working memory (ONNX Runtime's quantization modules, a few 16 MB slices of a
weight: quantize.QUANTIZE_CHUNK), measured at 0.4-0.5 GiB here. The graphs take the external-data path of a
model past 2 GB (shared.EXTERNAL_DATA_BYTES lowered to 0 in the child), the path 3B models take."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from benchmarks.memory import measure
from twostep.model.checkpoint import save_checkpoint
from twostep.model.config import preset
from twostep.model.transformer import Transformer

EXPORT = """
import sys
from twostep.exporter import shared
shared.EXTERNAL_DATA_BYTES = 0
from twostep.exporter.export import export
export(sys.argv[1], sys.argv[2], dtype=sys.argv[3], jobs=1)
"""


def checkpoint(path, d_model: int, layers: int, vocab: int):
    torch.manual_seed(0)
    config = preset("base", vocab).replace(d_model=d_model, d_ff=4 * d_model, n_heads=8, n_encoder_layers=layers,
                                           n_decoder_layers=layers, max_positions=64)
    model = Transformer(config)
    save_checkpoint(model, path)
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_export_holds_the_weights_once(tmp_path, dtype):
    small = checkpoint(tmp_path / "small", 64, 1, 1000)
    large = checkpoint(tmp_path / "large", 512, 4, 32000)
    assert 250e6 < large < 400e6 and small < 5e6
    peaks = {}
    for name in ("small", "large"):
        peak = measure([sys.executable, "-c", EXPORT, str(tmp_path / name), str(tmp_path / f"{name}-art"), dtype],
                       interval=0.02, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert peak.returncode == 0
        peaks[name] = peak.pss
    grown = peaks["large"] - peaks["small"]
    allowed = 1.5 * large + (1 << 29 if dtype == "int8" else 0)
    assert grown <= allowed, (f"{dtype}: the export of {large / 1e6:.0f} MB of parameters took {grown / 1e6:.0f} MB "
                              f"more at its peak than a tiny one's ({peaks})")
