"""Validation (twostep/exporter/validate.py): parity runs on a shape grid apart from the trace shapes."""

from __future__ import annotations

from twostep.exporter.graphs import TRACE_SIZES
from twostep.exporter.validate import SHAPE_GRID


def test_grid_differs_from_trace_shapes_and_covers_the_edges():
    for axis, sizes in SHAPE_GRID.items():
        assert TRACE_SIZES[axis] not in sizes
    assert 0 in SHAPE_GRID["past_len"] and 1 in SHAPE_GRID["new_len"] and 1 in SHAPE_GRID["batch"]
