"""Hand-computed checks of the objectives in ``rayseq.losses`` and ``rayseq.rewards``.

References: Tuan, Zhang, Lee, Chen (2018), "Proximal Policy Optimization and its Dynamic Version for
Sequence Generation" — Eq. 1 (REINFORCE with baseline), Eq. 3 (PPO clip), Eq. 4 (PPO-dynamic);
Ranzato et al. (2015) for MIXER and the value baseline. Style after torchtune's
``tests/torchtune/rlhf/loss/test_ppo_loss.py``: tiny tensors, the arithmetic in comments.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rayseq.losses import (
    mixer_combine,
    mixer_loss,
    ppo_clip_loss,
    ppo_dynamic_bounds,
    ppo_dynamic_loss,
    reinforce_loss,
    token_nll_loss,
    value_loss,
)
from rayseq.losses.returns import discounted_returns
from rayseq.rewards import terminal_rewards

F64 = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def leaf(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64, requires_grad=True)


def assert_stats_detached(stats) -> None:
    assert isinstance(stats, tuple) and hasattr(stats, "_fields"), "stats must be a NamedTuple"
    for name, value in zip(stats._fields, stats):
        assert isinstance(value, torch.Tensor), name
        assert not value.requires_grad, f"stats.{name} is not detached"


# -- REINFORCE, Eq. 1 ---------------------------------------------------------------------------


def test_reinforce_loss_hand_computed():
    # Eq. 1: ∇θ = A_t ∇θ log π(a_t|s_t); loss = −Σ_t m_t A_t logp_t / Σ_t m_t
    logp = leaf([[-1.0, -2.0, -0.5], [-0.1, -3.0, -4.0]])
    adv = t([[1.0, -1.0, 2.0], [0.5, 3.0, 10.0]])
    mask = t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, stats = reinforce_loss(logp, adv, mask)
    # logp·A = [[-1, 2, -1], [-0.05, -9, (masked)]]; sum = -9.05 over 5 tokens -> mean -1.81
    assert loss.item() == pytest.approx(1.81)
    # advantage_mean = (1 − 1 + 2 + 0.5 + 3) / 5 = 1.1; logp_mean = (−1 − 2 − 0.5 − 0.1 − 3) / 5 = −1.32
    assert stats.advantage_mean.item() == pytest.approx(1.1)
    assert stats.logp_mean.item() == pytest.approx(-1.32)
    assert_stats_detached(stats)
    loss.backward()
    # ∂loss/∂logp = −m·A / 5
    torch.testing.assert_close(logp.grad, t([[-0.2, 0.2, -0.4], [-0.1, -0.6, 0.0]]))


def test_reinforce_masked_tokens_contribute_nothing():
    torch.manual_seed(0)
    logp_a = -torch.rand(3, 5, dtype=F64)
    adv_a = torch.randn(3, 5, dtype=F64)
    mask = t([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 1, 1, 1, 0]])
    # same values where mask = 1, garbage where mask = 0
    logp_b = torch.where(mask > 0, logp_a, t(-123.0))
    adv_b = torch.where(mask > 0, adv_a, t(1e3))
    grads, losses = [], []
    for lp, a in ((logp_a, adv_a), (logp_b, adv_b)):
        lp = lp.clone().requires_grad_(True)
        loss, _ = reinforce_loss(lp, a, mask)
        loss.backward()
        losses.append(loss.detach())
        grads.append(lp.grad)
    torch.testing.assert_close(losses[0], losses[1])
    torch.testing.assert_close(grads[0], grads[1])
    assert (grads[0][mask == 0] == 0).all()
    assert (grads[0][mask == 1] != 0).all()


def test_reinforce_advantages_are_constants():
    logp = leaf([[-1.0, -2.0]])
    adv = leaf([[1.0, 2.0]])
    loss, _ = reinforce_loss(logp, adv, t([[1.0, 1.0]]))
    loss.backward()
    assert adv.grad is None
    assert logp.grad is not None


# -- PPO clip, Eq. 3 ----------------------------------------------------------------------------


def _ratio_inputs(ratios):
    """old_logp, logp (leaf) such that ρ = exp(logp − old_logp) equals ``ratios``."""
    ratios = t(ratios)
    old_logp = torch.log(torch.full_like(ratios, 0.3))
    logp = (old_logp + torch.log(ratios)).detach().requires_grad_(True)
    return logp, old_logp


def test_ppo_clip_loss_inside_and_outside_range():
    # ε = 0.2 -> clip range [0.8, 1.2]. Row 0 has A = +2, row 1 has A = −1; ratios [1.1, 1.5, 0.5].
    logp, old_logp = _ratio_inputs([[1.1, 1.5, 0.5], [1.1, 1.5, 0.5]])
    adv = t([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]])
    mask = torch.ones(2, 3, dtype=F64)
    loss, stats = ppo_clip_loss(logp, old_logp, adv, mask, eps=0.2)
    # Eq. 3 objective min(ρA, clip(ρ, 0.8, 1.2)A), the pessimistic of the two:
    # A=+2: ρ=1.1 inside -> 2.2;  ρ=1.5 -> min(3.0, 2.4) = 2.4 (clipped);  ρ=0.5 -> min(1.0, 1.6) = 1.0
    # A=−1: ρ=1.1 inside -> −1.1; ρ=1.5 -> min(−1.5, −1.2) = −1.5;        ρ=0.5 -> min(−0.5, −0.8) = −0.8
    # sum = 5.6 − 3.4 = 2.2; mean over 6 = 0.3667; loss = −0.3667
    assert loss.item() == pytest.approx(-2.2 / 6)
    loss.backward()
    # gradient flows only through the unclipped term: ∂(ρA)/∂logp = ρA, and loss = −mean
    # A=+2: [−2.2, 0 (clipped), −1.0] / 6;  A=−1: [1.1, 1.5, 0 (clipped)] / 6
    torch.testing.assert_close(logp.grad, t([[-2.2, 0.0, -1.0], [1.1, 1.5, 0.0]]) / 6)
    # ρ = 1.5 and 0.5 lie outside [0.8, 1.2] in both rows: 4 of 6
    assert stats.clipfrac.item() == pytest.approx(4 / 6)
    assert_stats_detached(stats)


def test_ppo_clip_stats_hand_computed_with_mask():
    logp, old_logp = _ratio_inputs([[1.1, 1.5, 0.5], [1.1, 1.5, 0.5]])
    adv = torch.ones(2, 3, dtype=F64)
    mask = t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the last ρ = 0.5 is masked
    _, stats = ppo_clip_loss(logp, old_logp, adv, mask, eps=0.2)
    # outside [0.8, 1.2] among the 5 unmasked: 1.5, 0.5 (row 0), 1.5 (row 1) -> 3/5
    assert stats.clipfrac.item() == pytest.approx(3 / 5)
    # approx_kl = mean[(ρ − 1) − log ρ] (Schulman's k3):
    #   ρ=1.1: 0.1 − log 1.1 = 0.0046898; ρ=1.5: 0.5 − log 1.5 = 0.0945349; ρ=0.5: −0.5 + log 2 = 0.1931472
    k3 = {r: (r - 1) - math.log(r) for r in (1.1, 1.5, 0.5)}
    expected_kl = (2 * k3[1.1] + 2 * k3[1.5] + k3[0.5]) / 5
    assert expected_kl == pytest.approx(0.0783193, abs=1e-7)
    assert stats.approx_kl.item() == pytest.approx(expected_kl)
    # ratio_mean = (1.1 + 1.5 + 0.5 + 1.1 + 1.5) / 5 = 1.14
    assert stats.ratio_mean.item() == pytest.approx(1.14)


def test_ppo_clip_ratio_one_stats():
    # ρ = 1 everywhere: nothing clipped, KL 0, ratio mean 1, loss −mean(A)
    old_logp = torch.log(t([[0.2, 0.5, 0.9]]))
    logp = old_logp.clone().requires_grad_(True)
    adv = t([[1.0, -2.0, 4.0]])
    loss, stats = ppo_clip_loss(logp, old_logp, adv, torch.ones(1, 3, dtype=F64))
    assert loss.item() == pytest.approx(-1.0)  # −(1 − 2 + 4) / 3
    assert stats.clipfrac.item() == 0.0
    assert stats.approx_kl.item() == pytest.approx(0.0, abs=1e-12)
    assert stats.ratio_mean.item() == pytest.approx(1.0)


# -- PPO-dynamic, Eq. 4 -------------------------------------------------------------------------

PI_OLD = [0.5, 0.2, 0.1, 0.9]
# √(1/π − 1): 0.5 -> √1 = 1; 0.2 -> √4 = 2; 0.1 -> √9 = 3; 0.9 -> √(1/9) = 1/3
SQRT_TERM = [1.0, 2.0, 3.0, 1.0 / 3.0]


def test_ppo_dynamic_bounds_exact_values():
    old_logp = torch.log(t(PI_OLD))
    beta, alpha = ppo_dynamic_bounds(old_logp)  # α1 = β1 = ∞, α2 = β2 = 1 (paper, Supp. C)
    torch.testing.assert_close(beta, t(SQRT_TERM))
    torch.testing.assert_close(alpha, t(SQRT_TERM))
    # scales: β = β2·√(1/π − 1), α = α2·√(1/π − 1), independently
    beta, alpha = ppo_dynamic_bounds(old_logp, alpha2=2.0, beta2=0.5)
    torch.testing.assert_close(beta, t([0.5, 1.0, 1.5, 1.0 / 6.0]))
    torch.testing.assert_close(alpha, t([2.0, 4.0, 6.0, 2.0 / 3.0]))


def test_ppo_dynamic_bounds_caps_bind():
    old_logp = torch.log(t(PI_OLD))
    beta, alpha = ppo_dynamic_bounds(old_logp, alpha1=2.5, beta1=0.4)
    # α = min(2.5, [1, 2, 3, 1/3]) = [1, 2, 2.5, 1/3]; β = min(0.4, [1, 2, 3, 1/3]) = [0.4, 0.4, 0.4, 1/3]
    torch.testing.assert_close(alpha, t([1.0, 2.0, 2.5, 1.0 / 3.0]))
    torch.testing.assert_close(beta, t([0.4, 0.4, 0.4, 1.0 / 3.0]))
    # SeqGAN setting of Supp. C: α1 = 10, β1 = 0.5, α2 = β2 = 0.2; at π_old = 0.1: α = 0.6, β = 0.5
    beta, alpha = ppo_dynamic_bounds(torch.log(t([0.1, 1e-6])), alpha1=10, beta1=0.5, alpha2=0.2, beta2=0.2)
    torch.testing.assert_close(alpha, t([0.6, 10.0]))  # 0.2·√(1e6 − 1) ≈ 200 -> capped at 10
    torch.testing.assert_close(beta, t([0.5, 0.5]))


def test_ppo_dynamic_bounds_widen_as_pi_old_shrinks():
    pi = torch.linspace(0.99, 0.01, 50, dtype=F64)  # decreasing
    beta, alpha = ppo_dynamic_bounds(torch.log(pi))
    assert (torch.diff(beta) > 0).all()
    assert (torch.diff(alpha) > 0).all()


def test_ppo_dynamic_bounds_zero_width_at_pi_one():
    beta, alpha = ppo_dynamic_bounds(torch.zeros(3, dtype=F64))  # log π_old = 0 -> √(1/1 − 1) = 0
    assert (beta == 0).all() and (alpha == 0).all()
    # float32 accuracy near π = 1: 1/π − 1 via expm1, so π = 1 − 1e-6 gives √(1e-6/(1−1e-6)) ≈ 1e-3, not 0
    beta32, _ = ppo_dynamic_bounds(torch.log1p(torch.tensor([-1e-6])))
    assert beta32.item() == pytest.approx(1e-3, rel=1e-3)


def test_ppo_dynamic_loss_hand_computed():
    # π_old = [0.1, 0.5, 0.9], π = [0.5, 0.8, 0.45] -> ρ = [5, 1.6, 0.5]; A = [+1, +1, −1]
    # bounds (α2 = β2 = 1): √(1/π_old − 1) = [3, 1, 1/3] -> clip ranges [−2, 4], [0, 2], [2/3, 4/3]
    old_logp = torch.log(t([[0.1, 0.5, 0.9]]))
    logp = torch.log(t([[0.5, 0.8, 0.45]])).requires_grad_(True)
    adv = t([[1.0, 1.0, -1.0]])
    loss, stats = ppo_dynamic_loss(logp, old_logp, adv, torch.ones(1, 3, dtype=F64))
    # ρ=5 > 4: upper bound clips, min(5, 4) = 4
    # ρ=1.6 in [0, 2]: not clipped, 1.6 (PPO-clip with ε=0.2 would have clipped it to 1.2)
    # ρ=0.5 < 2/3 with A<0: min(−0.5, −2/3) = −2/3 (lower bound clips)
    # objective = (4 + 1.6 − 2/3) / 3 = 74/45; loss = −74/45
    assert loss.item() == pytest.approx(-74 / 45)
    loss.backward()
    # only the unclipped middle token has a gradient: −ρA/3 = −1.6/3
    torch.testing.assert_close(logp.grad, t([[0.0, -1.6 / 3, 0.0]]))
    assert stats.clipfrac.item() == pytest.approx(2 / 3)
    assert stats.ratio_mean.item() == pytest.approx((5 + 1.6 + 0.5) / 3)
    assert_stats_detached(stats)

    # same tokens under PPO-clip ε=0.2: [min(5, 1.2), min(1.6, 1.2), min(−0.5, −0.8)] = [1.2, 1.2, −0.8]
    clip_loss, _ = ppo_clip_loss(logp.detach(), old_logp, adv, torch.ones(1, 3, dtype=F64), eps=0.2)
    assert clip_loss.item() == pytest.approx(-(1.2 + 1.2 - 0.8) / 3)


def test_ppo_dynamic_loss_respects_caps():
    # π_old = 0.1 (√ term 3), ρ = 5, A = 1: with α1 = 0.5 the upper bound is 1.5 -> objective 1.5
    old_logp = torch.log(t([[0.1]]))
    logp = torch.log(t([[0.5]]))
    loss, stats = ppo_dynamic_loss(logp, old_logp, t([[1.0]]), t([[1.0]]), alpha1=0.5)
    assert loss.item() == pytest.approx(-1.5)
    assert stats.clipfrac.item() == 1.0


def _rho_one_case(seed: int):
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 6
    # π_old strictly inside (0, 1) so the dynamic clip range has nonzero width
    old_logp = torch.log(0.05 + 0.9 * torch.rand(B, T, generator=g, dtype=F64))
    adv = torch.randn(B, T, generator=g, dtype=F64)
    mask = (torch.rand(B, T, generator=g) > 0.3).to(F64)
    mask[0, -2:] = 0  # right padding as well as interior zeros (MIXER-style action masks)
    assert (mask == 0).any() and (mask == 1).any()
    return old_logp, adv, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradients_equal_reinforce_at_ratio_one(seed):
    # At ρ = 1 (first PPO step after sampling, K=1) the clip is inactive and
    # ∇ min(ρA, clip(ρ)A) = A ∇ρ = A ∇ log π — the REINFORCE gradient of Eq. 1 (Tuan et al. Sec. 3).
    old_logp, adv, mask = _rho_one_case(seed)
    grads = {}
    for name in ("reinforce", "ppo", "ppo_dynamic"):
        logp = old_logp.clone().requires_grad_(True)
        if name == "reinforce":
            loss, _ = reinforce_loss(logp, adv, mask)
        elif name == "ppo":
            loss, _ = ppo_clip_loss(logp, old_logp, adv, mask, eps=0.2)
        else:
            loss, _ = ppo_dynamic_loss(logp, old_logp, adv, mask)
        loss.backward()
        grads[name] = logp.grad
    assert torch.allclose(grads["ppo"], grads["reinforce"])
    assert torch.allclose(grads["ppo_dynamic"], grads["reinforce"])
    assert (grads["reinforce"][mask == 0] == 0).all()
    torch.testing.assert_close(grads["reinforce"], -adv * mask / mask.sum())


def test_ppo_dynamic_gradient_equals_reinforce_when_pi_old_is_one():
    # π_old = 1 gives the zero-width range [1, 1]; at ρ = 1 the clamp must still pass the full gradient
    old_logp = t([[0.0, math.log(0.5)]])  # float32 log_softmax returns exactly 0 for a confident policy
    adv = t([[1.0, 1.0]])
    mask = torch.ones(1, 2, dtype=F64)
    lp_dyn = old_logp.clone().requires_grad_(True)
    ppo_dynamic_loss(lp_dyn, old_logp, adv, mask)[0].backward()
    lp_pg = old_logp.clone().requires_grad_(True)
    reinforce_loss(lp_pg, adv, mask)[0].backward()
    torch.testing.assert_close(lp_dyn.grad, lp_pg.grad)


# -- MIXER --------------------------------------------------------------------------------------


def test_mixer_loss_hand_computed():
    logp = leaf([[-1.0, -2.0, -3.0], [-0.5, -1.5, -7.0]])
    # advantages at cross-entropy positions and padding must be ignored (9 and 5 are garbage)
    adv = t([[9.0, 9.0, 2.0], [9.0, -1.0, 5.0]])
    xent = t([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    rl = t([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    loss, stats = mixer_loss(logp, adv, xent, rl)
    # per token: xent -> logp; rl -> A·logp
    # row 0: −1, −2, 2·(−3) = −6;  row 1: −0.5, (−1)·(−1.5) = 1.5, pad
    # sum = −8; tokens = 5; loss = 8/5 = 1.6
    assert loss.item() == pytest.approx(1.6)
    # advantage_mean over rl tokens = (2 − 1)/2; logp_mean over all 5 tokens = −8/5
    assert stats.advantage_mean.item() == pytest.approx(0.5)
    assert stats.logp_mean.item() == pytest.approx(-1.6)
    assert_stats_detached(stats)
    loss.backward()
    # ∂/∂logp = −(xent + A·rl)/5
    torch.testing.assert_close(logp.grad, t([[-1.0, -1.0, -2.0], [-1.0, 1.0, 0.0]]) / 5)


def test_mixer_loss_limits():
    torch.manual_seed(0)
    logp = -torch.rand(4, 5, dtype=F64)
    adv = torch.randn(4, 5, dtype=F64)
    mask = (torch.rand(4, 5) > 0.3).to(F64)
    zero = torch.zeros_like(mask)
    # δ = 0: pure cross-entropy
    l_x, _ = mixer_loss(logp, adv, mask, zero)
    l_nll, _ = token_nll_loss(logp, mask)
    torch.testing.assert_close(l_x, l_nll)
    # δ = T: pure REINFORCE
    l_r, _ = mixer_loss(logp, adv, zero, mask)
    l_pg, _ = reinforce_loss(logp, adv, mask)
    torch.testing.assert_close(l_r, l_pg)


def test_mixer_combine_hand_computed_with_ppo_on_the_sampled_tokens():
    """MIXER-PPO (Tuan et al. Table 1 middle block): PPO's clipped objective on the sampled tokens, cross-entropy
    on the forced ones, summed per token over both."""
    logp = leaf([[-1.0, -2.0, -3.0], [-0.5, -1.5, -7.0]])
    old = t([[-1.0, -2.0, -3.0 - math.log(2.0)], [-0.5, -1.5, -7.0]])  # ρ = 2 at (0, 2), 1 at (1, 1)
    adv = t([[9.0, 9.0, 2.0], [9.0, -1.0, 5.0]])
    xent = t([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    rl = t([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    ppo, _ = ppo_clip_loss(logp, old, adv, rl, eps=0.2)
    # sampled tokens: (0, 2) min(2·2, 1.2·2) = 2.4; (1, 1) min(1·(−1), 1·(−1)) = −1 -> ppo = −(2.4 − 1)/2 = −0.7
    assert ppo.item() == pytest.approx(-0.7)
    loss = mixer_combine(ppo, rl, logp, xent)
    # (2 · (−0.7) − (−1 − 2 − 0.5)) / 5 = (−1.4 + 3.5) / 5 = 0.42
    assert loss.item() == pytest.approx(0.42)
    # with REINFORCE on the sampled tokens it is exactly MIXER's loss
    pg, _ = reinforce_loss(logp, adv, rl)
    torch.testing.assert_close(mixer_combine(pg, rl, logp, xent), mixer_loss(logp, adv, xent, rl)[0])


# -- MLE and the value baseline -----------------------------------------------------------------


def test_token_nll_loss_hand_computed():
    logp = leaf([[-1.0, -2.0], [-3.0, -4.0]])
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = token_nll_loss(logp, mask)
    # (1 + 2 + 3) / 3 = 2; the masked −4 is ignored
    assert loss.item() == pytest.approx(2.0)
    assert stats.nll.item() == pytest.approx(2.0)
    assert stats.tokens.item() == 3
    assert_stats_detached(stats)
    loss.backward()
    torch.testing.assert_close(logp.grad, t([[-1.0, -1.0], [-1.0, 0.0]]) / 3)


def test_value_loss_hand_computed():
    values = leaf([[1.0, 2.0], [3.0, 4.0]])
    returns = leaf([[1.0, 0.0], [5.0, 4.0]])
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = value_loss(values, returns, mask)
    # squared errors on unmasked: (1−1)², (2−0)², (3−5)² = 0, 4, 4 -> mean 8/3
    assert loss.item() == pytest.approx(8 / 3)
    # value_mean = (1 + 2 + 3)/3 = 2
    assert stats.value_mean.item() == pytest.approx(2.0)
    # R = [1, 0, 5]: mean 2, Var = (1 + 4 + 9)/3 = 14/3; residual R − b = [0, −2, 2]: Var = 8/3
    # explained variance = 1 − (8/3)/(14/3) = 3/7
    assert stats.explained_variance.item() == pytest.approx(3 / 7)
    assert_stats_detached(stats)
    loss.backward()
    # ∂/∂b = 2(b − R)/3 on unmasked; returns are targets (no gradient)
    torch.testing.assert_close(values.grad, t([[0.0, 4.0 / 3], [-4.0 / 3, 0.0]]))
    assert returns.grad is None


def test_value_loss_perfect_predictor():
    torch.manual_seed(0)
    returns = torch.randn(3, 4, dtype=F64)
    mask = t([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    loss, stats = value_loss(returns.clone(), returns, mask)
    assert loss.item() == 0.0
    assert stats.explained_variance.item() == pytest.approx(1.0)
    # a constant predictor at the mean explains nothing
    mean = (returns * mask).sum() / mask.sum()
    _, stats0 = value_loss(torch.full_like(returns, mean.item()), returns, mask)
    assert stats0.explained_variance.item() == pytest.approx(0.0, abs=1e-12)


# -- returns and terminal rewards ---------------------------------------------------------------


def _returns_loop(rewards: np.ndarray, lengths: list[int], gamma: float) -> np.ndarray:
    """R_t = Σ_{τ=t}^{L−1} γ^{τ−t} r_τ for t < L, else 0 (Tuan et al. Eq. 1)."""
    B, T = rewards.shape
    out = np.zeros((B, T))
    for b in range(B):
        for s in range(lengths[b]):
            out[b, s] = sum(gamma ** (tau - s) * rewards[b, tau] for tau in range(s, lengths[b]))
    return out


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_discounted_returns_matches_loop(gamma):
    torch.manual_seed(0)
    B, T = 7, 6
    lengths = [6, 0, 1, 3, 5, 2, 6]
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).to(F64)
    rewards = torch.randn(B, T, dtype=F64)  # nonzero at padded positions too: they must be ignored
    out = discounted_returns(rewards, mask, gamma)
    expected = _returns_loop(rewards.numpy(), lengths, gamma)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-10, atol=1e-12)


def test_discounted_returns_terminal_reward_float32():
    # a terminal reward of 1 at the last real token: R_t = γ^{L−1−t}
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    out = discounted_returns(rewards, mask, 0.5)
    torch.testing.assert_close(out, torch.tensor([[0.25, 0.5, 1.0, 0.0]]))


def _terminal_loop(score: np.ndarray, token_mask: np.ndarray) -> np.ndarray:
    out = np.zeros(token_mask.shape, dtype=np.float32)
    for b in range(token_mask.shape[0]):
        last = -1
        for s in range(token_mask.shape[1]):
            if token_mask[b, s] > 0:
                last = s
        if last >= 0:
            out[b, last] = score[b]
    return out


def test_terminal_rewards_matches_loop():
    rng = np.random.default_rng(0)
    B, T = 50, 7
    lengths = rng.integers(0, T + 1, size=B)
    lengths[:3] = [0, T, 1]  # a zero-length row, a full row, a one-token row
    token_mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    score = rng.normal(size=B).astype(np.float32)
    out = terminal_rewards(score, token_mask)
    assert out.dtype == np.float32 and out.shape == (B, T)
    np.testing.assert_array_equal(out, _terminal_loop(score, token_mask))
    assert (out[0] == 0).all()  # zero-length row gets no reward
    assert out[1, T - 1] == score[1] and out[2, 0] == score[2]
