"""Rollout's per-row fields and extras through rows, split and concat (rayseq.types), by hand."""

from __future__ import annotations

import numpy as np
import pytest

from rayseq.types import Rollout


def _rollout(B: int, T: int, first: int, extras: dict) -> Rollout:
    tokens = np.arange(first, first + B * T, dtype=np.int64).reshape(B, T)
    ones = np.ones((B, T), np.float32)
    return Rollout(src=tokens[:, :1], src_len=np.ones(B, np.int64), tokens=tokens, token_mask=ones, action_mask=ones,
                   logp=-ones, rewards=0 * ones, score=np.arange(B, dtype=np.float32), extras=extras)


def test_extras_are_cut_split_and_concatenated_with_the_rows():
    # 4 rows; an extra per row (B,) and one per row and position (B, 2)
    r = _rollout(4, 3, 0, {"s": np.array([0.5, 1.5, 2.5, 3.5], np.float32),
                           "g": np.array([[1, 2], [3, 4], [5, 6], [7, 8]])})
    picked = r.rows(np.array([3, 0]))
    np.testing.assert_array_equal(picked.extras["s"], [3.5, 0.5])
    np.testing.assert_array_equal(picked.extras["g"], [[7, 8], [1, 2]])
    a, b = r.split(2)
    np.testing.assert_array_equal(a.extras["g"], [[1, 2], [3, 4]])
    np.testing.assert_array_equal(b.extras["s"], [2.5, 3.5])
    back = Rollout.concat([a, b])
    for k in ("s", "g"):
        np.testing.assert_array_equal(back.extras[k], r.extras[k])
    assert picked.extras is not r.extras and r.extras["s"].shape == (4,)  # cutting leaves the original whole


def test_concat_pads_two_dimensional_extras_to_the_widest_part():
    # a shard whose greedy replies end after 1 token beside one whose replies take 3: padded with 0, as tokens are
    one = _rollout(1, 2, 0, {"g": np.array([[9]]), "s": np.array([1.0], np.float32)})
    two = _rollout(2, 2, 10, {"g": np.array([[1, 2, 3], [4, 5, 6]]), "s": np.array([2.0, 3.0], np.float32)})
    out = Rollout.concat([one, two])
    np.testing.assert_array_equal(out.extras["g"], [[9, 0, 0], [1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(out.extras["s"], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(out.tokens[0], [0, 1])
    assert Rollout.concat([_rollout(1, 2, 0, {}), _rollout(1, 2, 5, {})]).extras == {}


def test_concat_refuses_parts_with_different_extras():
    with pytest.raises(ValueError, match="different extras"):
        Rollout.concat([_rollout(1, 2, 0, {"g": np.zeros((1, 1))}), _rollout(1, 2, 0, {})])
