"""The Bradley–Terry loss (rayseq.losses.preference) on hand-computed pairs, and against TRL's RewardTrainer
formula written out."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rayseq.losses.preference import bradley_terry_loss


def test_hand_computed():
    r_pos = torch.tensor([2.0, 0.0])
    r_neg = torch.tensor([0.0, 1.0])
    # differences 2 and −1: L = (log(1 + e^−2) + log(1 + e^1)) / 2
    loss, stats = bradley_terry_loss(r_pos, r_neg)
    want = (math.log(1 + math.exp(-2)) + math.log(1 + math.exp(1))) / 2
    assert float(loss) == pytest.approx(want, rel=1e-6)
    assert float(stats.accuracy) == 0.5 and float(stats.margin) == pytest.approx(0.5)
    assert float(stats.reward_mean) == pytest.approx(0.75)
    # margin m = (1, 0): differences 1 and −1 → (log(1 + e^−1) + log(1 + e^1)) / 2
    loss_m, _ = bradley_terry_loss(r_pos, r_neg, torch.tensor([1.0, 0.0]))
    assert float(loss_m) == pytest.approx((math.log(1 + math.exp(-1)) + math.log(1 + math.exp(1))) / 2, rel=1e-6)
    # centring term c = 0.5: sums 2 and 1 → c · (4 + 1) / 2 = 1.25 added
    loss_c, stats_c = bradley_terry_loss(r_pos, r_neg, None, 0.5)
    assert float(loss_c) == pytest.approx(want + 1.25, rel=1e-6)
    assert float(stats_c.center) == pytest.approx(2.5)


def test_ties_are_not_accurate_and_gradient_is_trls():
    r_pos = torch.tensor([0.3, 1.0, -0.5], requires_grad=True)
    r_neg = torch.tensor([0.3, -1.0, 0.5], requires_grad=True)
    margin = torch.tensor([0.1, 0.0, 0.4])
    loss, stats = bradley_terry_loss(r_pos, r_neg, margin, 0.01)
    assert float(stats.accuracy) == pytest.approx(1 / 3)  # a tie (0.3, 0.3) counts 0, as TRL's
    # TRL RewardTrainer.compute_loss, written out
    trl = -F.logsigmoid(r_pos - r_neg - margin).mean() + 0.01 * torch.mean((r_pos + r_neg) ** 2)
    torch.testing.assert_close(loss, trl)
    g = torch.autograd.grad(loss, [r_pos, r_neg])
    g_trl = torch.autograd.grad(trl, [r_pos, r_neg])
    for a, b in zip(g, g_trl):
        torch.testing.assert_close(a, b)
