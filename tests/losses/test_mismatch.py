"""The engine–policy log-prob mismatch and truncated importance sampling (rayseq.losses.mismatch), on hand-computed
tensors."""

from __future__ import annotations

import math

import torch

from rayseq.losses import ppo_clip_loss
from rayseq.losses.mismatch import logp_mismatch, truncated_is_weights


def test_mismatch_stats():
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    engine = torch.tensor([[-1.0, -2.5, -9.0]])  # the last token is masked out
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    stats = logp_mismatch(logp, engine, mask)
    # |log r| = [0, 0.5]: mean 0.25, max 0.5; k3 = (r − 1) − log r with log r = [0, 0.5]
    assert math.isclose(float(stats.diff_mean), 0.25, rel_tol=1e-6)
    assert math.isclose(float(stats.diff_max), 0.5, rel_tol=1e-6)
    assert math.isclose(float(stats.kl), ((math.exp(0.5) - 1 - 0.5) + 0) / 2, rel_tol=1e-6)


def test_truncated_weights():
    logp = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    engine = torch.tensor([[-1.0, -1.5, -0.5, -5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w = truncated_is_weights(logp, engine, mask, cap=1.5)
    # ratios π_old / π_engine = [1, e^0.5 = 1.65 -> capped 1.5, e^-0.5], 1 where masked
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.5, math.exp(-0.5), 1.0]]))


def test_weights_on_advantages_weigh_the_clipped_surrogate():
    """w ≥ 0 per token: the surrogate with advantages w·A is w·min(ρA, clip(ρ)A) token by token (how ppo_update
    applies the correction)."""
    logp = torch.tensor([[-1.0, -0.5, -2.0]])
    old = torch.tensor([[-1.2, -1.0, -1.5]])
    adv = torch.tensor([[1.0, -2.0, 0.5]])
    mask = torch.ones(1, 3)
    w = torch.tensor([[0.5, 2.0, 1.0]])
    weighted, _ = ppo_clip_loss(logp, old, adv * w, mask, eps=0.2)
    ratio = torch.exp(logp - old)
    per_token = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    torch.testing.assert_close(weighted, -(w * per_token).mean())
