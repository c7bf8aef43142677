"""RaggedRows (rayseq/data/dataset.py): token rows held unpadded, read as the padded array they stand for."""

from __future__ import annotations

import numpy as np
import pytest

from rayseq.data.dataset import RaggedRows, pad_rows


def plain_padded(rows: list[np.ndarray], width: int, pad: int) -> np.ndarray:
    out = np.full((len(rows), width), pad, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def test_every_index_reads_what_the_padded_array_gives():
    rng = np.random.default_rng(0)
    rows = [rng.integers(4, 400, rng.integers(0, 12)) for _ in range(40)]  # an empty row among them
    lens = np.array([len(r) for r in rows])
    ids = np.concatenate(rows).astype(np.int32)
    full = plain_padded(rows, 12, 7)
    ragged = RaggedRows(ids, lens, 12, 7)
    assert np.array_equal(pad_rows(ids, lens, 12, 7), full)
    assert ragged.shape == full.shape and ragged.dtype == full.dtype and len(ragged) == 40
    assert np.array_equal(np.asarray(ragged), full) and np.asarray(ragged).dtype == np.int64
    for index in (0, 39, -1, np.int64(5), slice(3, 17), slice(None, None, 4), slice(0, 0), np.array([9, 2, 2, 39]),
                  lens > 5, [1, 0]):
        got = ragged[index]
        assert got.dtype == np.int64 and np.array_equal(got, full[index]), index
    for i, n in enumerate(lens):  # a row's tokens: a view of the ids, no copy
        assert np.array_equal(ragged[i, :n], full[i, :n]) and (n == 0 or np.shares_memory(ragged[i, :n], ragged.ids))
        for cols in (slice(None), slice(2, None), slice(0, 12), slice(1, 3)):
            assert np.array_equal(ragged[i, cols], full[i, cols]), (i, cols)
    assert np.array_equal(ragged[np.array([3, 4]), :5], full[np.array([3, 4]), :5])
    assert ragged.nbytes < full.nbytes
    with pytest.raises(IndexError):
        ragged[40]
    with pytest.raises(ValueError, match="RaggedRows: 5 ids for rows of 6"):
        RaggedRows(np.arange(5), np.array([3, 3]), 4, 0)
    with pytest.raises(ValueError, match=r"the longest 3 \(width 2\)"):
        RaggedRows(np.arange(6), np.array([3, 3]), 2, 0)
