"""Export within memory (issue 48): the weights are memory-mapped once and never copied whole. A model of
~300 MB is exported (fp32, validation on) in a child process whose process tree is sampled
(benchmarks/memory.py); its peak PSS above the same export of a model of a few MB (the fixed cost: Python,
torch, ONNX Runtime) must stay within 1.75x the larger model's parameter bytes. Any whole copy of the weights
(the eager model copied out of its file, a graph serialized in memory, a session's prepacked weights next to
the model's) makes it 2x or more; the export as it is takes 1.51x on an AVX2 AMD EPYC (ONNX Runtime's
sessions and the trace's buffers above the weights), less on an AMX Xeon, so the bound sits between the two.
The graphs take the external-data path of a model past 2 GB (shared.EXTERNAL_DATA_BYTES lowered to 0 in the
child), the path 3B models take.

int8 and int4 quantize those graphs (the export's next step, the same code) in a child process of their own,
whose peak above quantizing the small model's must stay within the larger model's parameter bytes: ONNX
Runtime's whole-graph quantizers hold the graph and two more copies of its weights (measured: 0.60 GiB above the
small model's for this 0.28 GiB model; one weight at a time, 0.20 GiB for int8 and 0.23 GiB for int4)."""

from __future__ import annotations

import subprocess
import sys

import onnx
import pytest
import torch

from benchmarks.memory import measure
from twostep.model.checkpoint import save_checkpoint
from twostep.model.config import preset
from twostep.model.transformer import Transformer

# Peaks of PSS, whose shared pages count less while another worker's processes map the same libraries:
# `make test` runs these alone
pytestmark = pytest.mark.serial

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


QUANTIZE = """
import shutil
import sys
from pathlib import Path

from twostep.exporter.int4 import quantize_int4
from twostep.exporter.quantize import quantize_int8

source, copy = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(source, copy)
for graph in ("encoder.onnx", "decoder.onnx", "decoder_inplace.onnx"):
    {"int8": quantize_int8, "int4": quantize_int4}[sys.argv[3]](copy / graph)
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The small and the large model exported in fp32, each in a child process sampled: (parameter bytes of the
    large one, {name: peak PSS}, {name: artifact})."""
    tmp = tmp_path_factory.mktemp("memory")
    small = checkpoint(tmp / "small", 64, 1, 1000)
    large = checkpoint(tmp / "large", 512, 4, 32000)
    assert 250e6 < large < 400e6 and small < 5e6
    peaks, artifacts = {}, {}
    for name in ("small", "large"):
        artifacts[name] = tmp / f"{name}-art"
        peak = measure([sys.executable, "-c", EXPORT, str(tmp / name), str(artifacts[name]), "fp32"],
                       interval=0.02, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert peak.returncode == 0
        peaks[name] = peak.pss
    return large, peaks, artifacts


@pytest.mark.slow
def test_export_holds_the_weights_once(exported):
    large, peaks, _ = exported
    grown = peaks["large"] - peaks["small"]
    assert grown <= 1.75 * large, (f"the export of {large / 1e6:.0f} MB of parameters took {grown / 1e6:.0f} MB "
                                  f"more at its peak than a tiny one's ({peaks})")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_quantizing_holds_one_weight_at_a_time(exported, tmp_path, dtype):
    large, _, artifacts = exported
    peaks = {}
    for name, artifact in artifacts.items():
        peak = measure([sys.executable, "-c", QUANTIZE, str(artifact), str(tmp_path / name), dtype], interval=0.02,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert peak.returncode == 0, peak
        assert sum(n.op_type in ("MatMulInteger", "MatMulNBits")
                   for n in onnx.load(str(tmp_path / name / "decoder.onnx"), load_external_data=False).graph.node)
        peaks[name] = peak.pss
    grown = peaks["large"] - peaks["small"]
    assert grown <= large, (f"{dtype}: quantizing the graphs of {large / 1e6:.0f} MB of parameters took "
                            f"{grown / 1e6:.0f} MB more at its peak than a tiny model's ({peaks})")
