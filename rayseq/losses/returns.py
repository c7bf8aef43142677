"""Returns R_t = Σ_{τ≥t} γ^{τ−t} r_τ (Tuan et al. Eq. 1), vectorised over the batch."""

from __future__ import annotations

import torch


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """rewards, mask (B, T) -> returns (B, T); masked rewards count as 0 and masked returns are 0.

    γ = 1 is a reversed cumulative sum; otherwise one backward pass over T, vectorised over B.
    """
    r = rewards * mask
    if gamma == 1.0:
        out = torch.flip(torch.cumsum(torch.flip(r, [1]), 1), [1])
        return out * mask
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        running = r[:, t] + gamma * running
        out[:, t] = running
    return out * mask
