"""Policy-gradient objectives for sequence generation.

References
- Tuan, Zhang, Lee, Chen (2018), "Proximal Policy Optimization and its Dynamic Version for Sequence
  Generation": Eq. 1 (policy gradient), Eq. 3 (PPO clip), Eq. 4 (PPO-dynamic), Supplement A.
- Ranzato et al. (2015) / Keneshloo et al. survey Sec. IV-A: MIXER.
- Yu et al. (2025), "DAPO: An Open-Source LLM Reinforcement Learning System at Scale": Sec. 3.1 Clip-Higher
  (the decoupled clip range of :func:`ppo_clip_loss`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from rayseq.losses.aggregate import masked_mean, token_log_ratio, token_mean


class PolicyStats(NamedTuple):
    clipfrac: torch.Tensor  # share of unmasked tokens whose ratio lies outside the clip range
    approx_kl: torch.Tensor  # E[(ρ − 1) − log ρ] ≈ KL(π_old ‖ π_θ) (Schulman's k3 estimator)
    ratio_mean: torch.Tensor  # E[ρ]


class PGStats(NamedTuple):
    advantage_mean: torch.Tensor
    logp_mean: torch.Tensor


def reinforce_loss(
    logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *, aggregate=token_mean,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, PGStats]:
    """REINFORCE with baseline, Tuan et al. Eq. 1: ∇θ = A_t ∇θ log π_θ(a_t | s_t).

    loss = −mean_t [A_t · log π_θ(a_t|s_t)] over unmasked tokens. ``advantages`` are constants. ``aggregate``: how
    the token terms are averaged (:mod:`rayseq.losses.aggregate`; default the mean over the batch's tokens);
    ``keep``: the tokens whose terms count (``aggregate``'s).
    """
    adv = advantages.detach()
    loss = -aggregate(logp * adv, mask, keep)
    return loss, PGStats(masked_mean(adv, mask).detach(), masked_mean(logp, mask).detach())


def clipped_objective(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    lower: torch.Tensor | float,
    upper: torch.Tensor | float,
    delta: float | None = None,
) -> tuple[torch.Tensor, PolicyStats]:
    """PPO's clipped objective per token, min(ρA, clip(ρ, lower, upper)A) with ρ = exp(log_ratio), (B, T), and its
    diagnostics over ``mask``.

    ``delta``: INTELLECT-2's two-sided clip (Prime Intellect Team 2025, "INTELLECT-2", arXiv:2505.07291): ρ is also
    capped at δ in the unclipped term, min(min(ρ, δ)A, clip(ρ, lower, upper)A), so a token with A < 0 whose ratio has
    grown far cannot take an unbounded step (TRL's ``delta``). None: no cap (Eq. 3).
    """
    adv = advantages.detach()
    ratio = torch.exp(log_ratio)
    lower_t = torch.as_tensor(lower, dtype=ratio.dtype, device=ratio.device)
    upper_t = torch.as_tensor(upper, dtype=ratio.dtype, device=ratio.device)
    # clamp (not min/max) so that a ratio exactly on a bound keeps its full gradient
    clipped = torch.clamp(ratio, lower_t, upper_t)
    unclipped = ratio if delta is None else torch.clamp(ratio, max=delta)
    objective = torch.minimum(unclipped * adv, clipped * adv)
    with torch.no_grad():
        outside = ((ratio < lower_t) | (ratio > upper_t)).to(ratio.dtype)
        stats = PolicyStats(
            clipfrac=masked_mean(outside, mask),
            approx_kl=masked_mean((ratio - 1.0) - log_ratio, mask),
            ratio_mean=masked_mean(ratio, mask),
        )
    return objective, stats


def clip_range(eps: float, eps_high: float | None) -> tuple[float, float]:
    """(1 − ε, 1 + ε_high) with ε_high = ε when None: Eq. 3's range, or DAPO's decoupled one."""
    return 1.0 - eps, 1.0 + (eps if eps_high is None else eps_high)


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    lower: torch.Tensor | float,
    upper: torch.Tensor | float,
    *,
    delta: float | None = None,
    log_ratio=token_log_ratio,
    aggregate=token_mean,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, PolicyStats]:
    """−aggregate[min(ρA, clip(ρ, lower, upper)A)] with log ρ = ``log_ratio(logp, old_logp, mask)``."""
    objective, stats = clipped_objective(log_ratio(logp, old_logp, mask), advantages, mask, lower, upper, delta)
    return -aggregate(objective, mask, keep), stats


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps: float = 0.2,
    eps_high: float | None = None,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, PolicyStats]:
    """PPO, Tuan et al. Eq. 3: L = E[min(ρ_t A_t, clip(ρ_t, 1−ε, 1+ε) A_t)], ρ_t = π_θ/π_θold.

    ``eps_high``: DAPO's decoupled clip (Yu et al. 2025, Sec. 3.1 "Clip-Higher"; the clip term of the DAPO objective,
    Eq. 8 of arXiv:2503.14476): clip(ρ_t, 1−ε_low, 1+ε_high) with ε_low = ``eps``, so a token with A_t > 0 may grow
    its ratio up to 1+ε_high (DAPO: ε_low 0.2, ε_high 0.28). None: ε_high = ε (Eq. 3).
    Returns −L averaged over unmasked tokens (the terms of ``keep``'s tokens, when given).
    """
    lower, upper = clip_range(eps, eps_high)
    return clipped_surrogate(logp, old_logp, advantages, mask, lower, upper, keep=keep)


def ppo_dynamic_bounds(
    old_logp: torch.Tensor,
    *,
    alpha1: float = math.inf,
    alpha2: float = 1.0,
    beta1: float = math.inf,
    beta2: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-dynamic's per-token bounds (Eq. 4): returns (β, α) with

    β = min(β1, β2·√(1/π_old − 1)),   α = min(α1, α2·√(1/π_old − 1)).

    √(1/π_old − 1) comes from bounding KL(π_old ‖ π) ≤ δ to second order (Supplement A, Eq. 7);
    1/π − 1 is computed as expm1(−log π) for accuracy when π is close to 1.
    """
    d = torch.sqrt(torch.expm1(-old_logp.detach()).clamp(min=0.0))
    beta = torch.clamp(beta2 * d, max=beta1)
    alpha = torch.clamp(alpha2 * d, max=alpha1)
    return beta, alpha


def ppo_dynamic_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    alpha1: float = math.inf,
    alpha2: float = 1.0,
    beta1: float = math.inf,
    beta2: float = 1.0,
    delta: float | None = None,
    aggregate=token_mean,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, PolicyStats]:
    """PPO-dynamic, Tuan et al. Eq. 4: ∇θ min(ρ_t A_t, clip(ρ_t, 1−β, 1+α) A_t),
    β, α from :func:`ppo_dynamic_bounds` — wider for low-probability actions.

    Returns −objective averaged over unmasked tokens, or as ``aggregate`` averages the token terms
    (:mod:`rayseq.losses.aggregate`: per reply, over a constant); ``delta`` caps ρ in the unclipped term
    (:func:`clipped_objective`); ``keep``: the tokens whose terms count.
    """
    beta, alpha = ppo_dynamic_bounds(old_logp, alpha1=alpha1, alpha2=alpha2, beta1=beta1, beta2=beta2)
    return clipped_surrogate(logp, old_logp, advantages, mask, 1.0 - beta, 1.0 + alpha, delta=delta,
                              aggregate=aggregate, keep=keep)


def mixer_loss(
    logp: torch.Tensor,
    advantages: torch.Tensor,
    xent_mask: torch.Tensor,
    rl_mask: torch.Tensor,
) -> tuple[torch.Tensor, PGStats]:
    """MIXER (Ranzato et al. 2015; survey Sec. IV-A): cross-entropy on the first T−δ (reference)
    tokens, REINFORCE on the last δ (sampled) tokens of each sequence.

    loss = −Σ_t [xent_mask_t · log π(y_t) + rl_mask_t · A_t · log π(y_t)] / Σ_t (xent_mask_t + rl_mask_t)
    """
    adv = advantages.detach()
    total = xent_mask + rl_mask
    per_token = logp * xent_mask + logp * adv * rl_mask
    loss = -per_token.sum() / total.sum().clamp(min=1.0)
    return loss, PGStats(masked_mean(adv, rl_mask).detach(), masked_mean(logp, total).detach())


def mixer_combine(rl_loss: torch.Tensor, rl_mask: torch.Tensor, logp: torch.Tensor,
                  xent_mask: torch.Tensor) -> torch.Tensor:
    """MIXER's objective with any policy objective on its sampled tokens (Tuan et al. Table 1's MIXER-PPO and
    MIXER-PPO-dynamic rows; Ranzato et al. 2015): the per-token sum of the policy objective over the δ sampled
    tokens and of the cross-entropy −log π(y*_t) over the forced reference tokens, divided by their number:

        loss = (n_rl · rl_loss − Σ_t xent_mask_t log π(y_t)) / (n_rl + n_xent),   n_* = Σ_t mask_t

    ``rl_loss`` is the masked mean over ``rl_mask`` that every objective here returns (reinforce_loss,
    ppo_clip_loss, ppo_dynamic_loss), so with ``reinforce_loss`` this is :func:`mixer_loss`. logp, masks (B, T).
    """
    n_rl, n_xent = rl_mask.sum(), xent_mask.sum()
    return (rl_loss * n_rl - (logp * xent_mask).sum()) / (n_rl + n_xent).clamp(min=1.0)
