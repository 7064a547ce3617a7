"""The decoder's inputs between steps, row by row (twostep/runtime/backends/rows.py): rows leaving free their
columns."""

from __future__ import annotations

import numpy as np


def rows_of_cache(max_width=None):
    from twostep.runtime.backends.rows import DecoderRows, NumpyOps

    return DecoderRows(NumpyOps(), "mask", ["cross"], ["self"], max_width=max_width)


def encoded(lengths: list[int]) -> dict:
    width = max(lengths)
    mask = np.array([[1] * n + [0] * (width - n) for n in lengths])
    return {"mask": mask, "cross": np.ones((len(lengths), 2, width, 3), np.float32) * mask[:, None, :, None]}


def grow(rows, new_len=1) -> None:
    """One step: every row's cache one column wider (the graph's present), as a decoder does."""
    past = rows.tensors["self"]
    present = np.concatenate([past, np.ones((past.shape[0], 2, new_len, 3), np.float32)], axis=2)
    rows.advance({"self": present}, new_len)


def test_a_sentence_leaving_at_the_widest_cache_an_engine_allows_leaves_room_for_the_next_step():
    rows = rows_of_cache(max_width=8)
    rows.start({**encoded([4]), "self": np.zeros((1, 2, 0, 3), np.float32)}, np.array([4]))
    for _ in range(3):
        grow(rows)
    rows.admit(encoded([2]), np.array([2]), np.array([0]), np.array([1]))  # joins at step 4
    for _ in range(5):
        grow(rows)
    assert rows.past_len == 8 and rows.lengths.tolist() == [8, 5]  # row 0 needs every column
    rows.release(np.array([0]))  # done at the engine's last position
    assert rows.past_len == 5 < 8  # the next step fits the profile
    assert rows.lengths.tolist() == [0, 5]


def test_the_sources_columns_shrink_once_a_long_source_left():
    rows = rows_of_cache()
    rows.start({**encoded([20, 3]), "self": np.zeros((2, 2, 0, 3), np.float32)}, np.array([20, 3]))
    grow(rows)
    rows.admit(encoded([4]), np.array([4]), np.array([0]), np.array([2]))
    assert rows.tensors["mask"].shape == (3, 20)
    rows.release(np.array([0]))  # the 20-token source is done
    assert rows.tensors["mask"].shape == (3, 4) and rows.tensors["cross"].shape == (3, 2, 4, 3)
    assert rows.tensors["mask"][1:].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
