"""Validation (twostep/exporter/validate.py): parity runs on a shape grid apart from the trace shapes, with a
tolerance that follows the scale of each row compared: it passes a correct graph whose logits are large, and it
refuses wrong graphs at large and small logits."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import hf_models
from twostep.artifact import load_artifact
from twostep.exporter.export import export
from twostep.exporter.graphs import TRACE_SIZES
from twostep.exporter.validate import (
    EXPORT_GRID,
    FULL_GRID,
    Grid,
    compare_graphs,
    grid_feeds,
    row_scale,
    tolerance_failure,
)
from twostep.model.checkpoint import load_checkpoint
from twostep.runtime.backends.ort import OrtBackend
from twostep.runtime.backends.torch_backend import TorchBackend


@pytest.mark.parametrize("grid", [FULL_GRID, EXPORT_GRID], ids=["full", "export"])
def test_grid_differs_from_trace_shapes_and_covers_the_edges(grid):
    for axis, sizes in grid.axes().items():
        assert TRACE_SIZES[axis] not in sizes
    assert 0 in grid.past_len and 1 in grid.new_len and 1 in grid.batch and 1 in grid.src_len
    assert max(grid.src_len) > TRACE_SIZES["src_len"] and max(grid.past_len) > TRACE_SIZES["past_len"]
    # the session choreography (rows trading places, leaving, joining) needs a batch of 3 with padding
    assert (3, max(grid.src_len)) in grid.sessions and all(b in grid.batch for b, _ in grid.sessions)


def test_export_grid_is_a_part_of_verifys():
    for axis, sizes in EXPORT_GRID.axes().items():
        assert set(sizes) <= set(FULL_GRID.axes()[axis])
    assert set(EXPORT_GRID.sessions) < set(FULL_GRID.sessions)


@pytest.fixture(scope="module")
def t5_init(tmp_path_factory):
    """transformers' T5 init (hf_models.t5_init_dir: logit rows of rms sqrt(d_model), over 100) imported: its
    checkpoint directory."""
    pytest.importorskip("transformers", reason="the model is built by transformers")
    from twostep.model.hf import import_hf_directory

    root = tmp_path_factory.mktemp("t5-init")
    import_hf_directory(hf_models.t5_init_dir(root / "hf"), root / "ckpt")
    return root / "ckpt"


@pytest.mark.slow  # an export: two graphs traced, then validated (20 to 50 s on 2 busy cores)
def test_a_correct_graph_of_large_logits_passes_where_the_fixed_tolerance_refused_it(t5_init, tmp_path):
    """`twostep export` validates it (graphs and search outputs on its grid) and writes it; compared again, the
    fixed tolerance (np.allclose's atol 1e-4 + rtol 1e-4) refuses a dozen of its logits, the scaled one passes
    them with room."""
    result = export(t5_init, tmp_path / "art", variants=[])
    assert result.report.ok
    beyond_fixed, worst, smallest_row = 0, 0.0, np.inf
    with OrtBackend(load_artifact(result.path)) as candidate, \
            TorchBackend(load_checkpoint(t5_init).model) as reference:
        for _, graph, feeds in grid_feeds(reference, EXPORT_GRID):
            if graph == "decoder":
                want = reference.run(graph, feeds)["logits"].astype(np.float64)
                err = np.abs(candidate.run(graph, feeds)["logits"] - want)
                beyond_fixed += int((err > 1e-4 + 1e-4 * np.abs(want)).sum())
                worst = max(worst, float((err / (1e-4 * row_scale(want) + 1e-4 * np.abs(want))).max()))
                smallest_row = min(smallest_row, float(row_scale(want).min()))
    assert smallest_row > 100
    assert beyond_fixed > 0  # measured: 12 logits, the worst at 1.9 times what it may have
    assert worst < 0.2  # measured: 0.04 of what the scaled rule allows


def swap_kv(model):  # the decoder's keys projected by the values' weights and its values by the keys'
    attention = model.decoder.layers[0].self_attn
    attention.k_proj, attention.v_proj = attention.v_proj, attention.k_proj


def drop_relative_bias(model):  # T5's position bias left out of the decoder's attention scores
    with torch.no_grad():
        model.decoder.relative_bias.weight.zero_()


def scale_attention(model):  # the 1 / sqrt(d_k) that T5 does not have (an Attention op's default scale)
    attention = model.decoder.layers[0].self_attn
    attention.scale = attention.d_k ** -0.5


def erf_gelu(model):  # gelu's erf form where T5 v1.1 has the tanh approximation (gelu_new)
    model.decoder.layers[0].ffn.activation = torch.nn.functional.gelu


BREAKS = {"swapped K/V": swap_kv, "missing bias": drop_relative_bias, "wrong attention scale": scale_attention,
          "wrong gelu": erf_gelu}
# the export grid's far corner: a batch of 3 with padding, 17 past tokens, 4 new ones (every break shows there)
CORNER = Grid(batch=(3,), src_len=(33,), past_len=(17,), new_len=(4,), sessions=())


@pytest.mark.parametrize("logits", ["large", "small"])
@pytest.mark.parametrize("break_name", BREAKS)
def test_a_wrong_graph_is_refused_at_large_and_small_logits(t5_init, logits, break_name):
    """The model with one thing wrong, as the candidate, against the model: its logits are refused. Large:
    transformers' init, rows of rms 140 or so; small: the same with the output layer times d_model ** -0.5 (as
    T5 v1.0 scales it), rows of rms 1 or so. The wrong gelu comes closest: 3 times what its logits may have."""
    model = load_checkpoint(t5_init).model
    if logits == "small":
        with torch.no_grad():
            model.generator.weight.mul_(model.config.d_model ** -0.5)
    broken = copy.deepcopy(model)
    BREAKS[break_name](broken)
    with TorchBackend(broken) as candidate, TorchBackend(model) as reference:
        failures = compare_graphs(candidate, reference, "fp32", CORNER).failures
    assert any(f.startswith("b3_s33_p17_n4: decoder.logits") for f in failures), failures


def test_rows_of_unit_scale_keep_the_fixed_tolerance():
    """A row of rms 1 or less is held to np.allclose's atol; a larger row's atol is times its rms."""
    want = np.array([[0.5, -0.5, 0.0, 1.0], [30.0, -30.0, 0.0, 10.0]])  # rows of rms 0.61 and 21.8
    assert row_scale(want)[:, 0].tolist() == [1.0, np.sqrt(475)]
    off = np.array([0.0, 0.0, 1.5e-4, 0.0])  # an error at a logit of 0: past atol 1e-4, within 21.8e-4
    assert tolerance_failure(want + [off, 0 * off], want, (1e-4, 1e-4)) is not None
    assert not np.allclose(want + [off, 0 * off], want, 1e-4, 1e-4)
    assert tolerance_failure(want + [0 * off, off], want, (1e-4, 1e-4)) is None
    assert tolerance_failure(want + [0 * off, 20 * off], want, (1e-4, 1e-4)) is not None
