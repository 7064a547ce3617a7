"""Validation (twostep/exporter/validate.py): parity runs on a shape grid apart from the trace shapes."""

from __future__ import annotations

import pytest

from twostep.exporter.graphs import TRACE_SIZES
from twostep.exporter.validate import EXPORT_GRID, FULL_GRID


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
