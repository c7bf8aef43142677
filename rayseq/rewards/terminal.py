"""Sequence-level scores as per-token rewards."""

from __future__ import annotations

import numpy as np


def terminal_rewards(score: np.ndarray, token_mask: np.ndarray) -> np.ndarray:
    """score (B,), token_mask (B, T) -> rewards (B, T): r_t = score on each row's last real token, else 0.

    Rows with no real token get no reward.
    """
    B, T = token_mask.shape
    out = np.zeros((B, T), dtype=np.float32)
    length = (token_mask > 0).sum(axis=1)
    rows = np.nonzero(length > 0)[0]
    out[rows, length[rows] - 1] = score[rows]
    return out
