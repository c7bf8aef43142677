"""The policy-loss variants of GRPO-style training, under the names TRL's ``GRPOConfig.loss_type`` gives them.

Since 2025 the clipped objectives differ in three places: the objective of each token (PPO's clip, CISPO's clipped
weight, SAPO's soft gate, GMPO's geometric mean), the ratio it reads (``log_ratio``: one per token, or GSPO's one per
reply, :mod:`rayseq.losses.aggregate`), and how the token terms are averaged (per token, per reply, over a constant).
Each variant is one function here; :data:`LOSS_TYPES` maps a name to it, and the algorithms choose from that mapping
(:mod:`rayseq.algos.loss_menu`).

Every variant takes the contract of :mod:`rayseq.losses.policy`:

    loss(logp, old_logp, advantages, mask, *, keep=None, **coefficients) -> (scalar loss to minimise, PolicyStats)

logp, old_logp, advantages, mask: float tensors (B, T): log π_θ (with gradient), log π_old, A_i,t (constants; GRPO's
are one per reply, on every token), 1 on the tokens the loss counts. ``keep`` (B, T) 0/1: the tokens whose terms
count (the high-entropy tokens); the denominators still count every token of ``mask``.

References (TRL's and veRL's names in brackets)
- Shao et al. 2024, "DeepSeekMath", Sec. 4.1, Eq. 3 [grpo; seq-mean-token-mean].
- Yu et al. 2025, "DAPO", arXiv:2503.14476, Sec. 3.3 and Eq. 8 [dapo, bnpo; token-mean].
- Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective" (Dr.GRPO), arXiv:2503.20783
  [dr_grpo; seq-mean-token-sum-norm].
- LUSPO, arXiv:2602.05261 [luspo; seq-mean-token-sum].
- Zheng et al. 2025, "Group Sequence Policy Optimization" (GSPO), arXiv:2507.18071 [importance_sampling_level=sequence].
- MiniMax 2025, "MiniMax-M1", arXiv:2506.13585, Sec. 3.1 (CISPO); the cap ε_max of Khatri et al. 2025, "The Art of
  Scaling Reinforcement Learning Compute for LLMs" (ScaleRL), arXiv:2510.13786 [cispo].
- Gao et al. 2025, "Soft Adaptive Policy Optimization" (SAPO), arXiv:2511.20347 [sapo].
- Zhao et al. 2025, "Geometric-Mean Policy Optimization" (GMPO), arXiv:2507.20673 [TRL's experimental GMPOTrainer;
  veRL's loss_mode=geo_mean].
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch

from rayseq.losses.aggregate import (
    constant_length_mean,
    masked_mean,
    sequence_log_ratio,
    sequence_mean,
    sequence_sum_mean,
    token_log_ratio,
    token_mean,
)
from rayseq.losses.policy import PolicyStats, clip_range, clipped_surrogate

Tensor = torch.Tensor


def grpo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, eps: float = 0.2,
              eps_high: float | None = None, delta: float | None = None, log_ratio=token_log_ratio,
              keep: Tensor | None = None) -> tuple[Tensor, PolicyStats]:
    """GRPO as DeepSeekMath writes it (Shao et al. 2024, Eq. 3, without its KL term): each reply's token mean of
    PPO's clipped objective, then the mean over replies [TRL grpo; veRL seq-mean-token-mean]:

        L = −(1/B) Σ_i (1/|y_i|) Σ_t min(ρ_i,t A_i,t, clip(ρ_i,t, 1 − ε, 1 + ε_high) A_i,t)

    ε_high = ε when None (DAPO's Clip-Higher otherwise); ``delta`` caps ρ in the unclipped term (INTELLECT-2,
    :func:`rayseq.losses.policy.clipped_objective`); ρ from ``log_ratio`` (per token; GSPO's per reply with
    :func:`rayseq.losses.aggregate.sequence_log_ratio`, GSPO's objective itself)."""
    lower, upper = clip_range(eps, eps_high)
    return clipped_surrogate(logp, old_logp, advantages, mask, lower, upper, delta=delta, log_ratio=log_ratio,
                              aggregate=sequence_mean, keep=keep)


def dapo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, eps: float = 0.2,
              eps_high: float | None = None, delta: float | None = None, log_ratio=token_log_ratio,
              keep: Tensor | None = None) -> tuple[Tensor, PolicyStats]:
    """DAPO's token-level policy-gradient loss (Yu et al. 2025, Sec. 3.3, Eq. 8): PPO's clipped objective averaged
    over every token of the batch [TRL dapo (its default) and bnpo; veRL token-mean]:

        L = −Σ_i Σ_t min(ρ_i,t A_i,t, clip(ρ_i,t, 1 − ε, 1 + ε_high) A_i,t) / Σ_i |y_i|

    With ε_high = None, ``delta`` None and per-token ratios this is :func:`rayseq.losses.ppo_clip_loss` (Tuan et al.
    Eq. 3), bit for bit. TRL's bnpo divides by the tokens of each process's micro-batch, dapo by the whole batch's;
    here the denominator is always the minibatch's (a split over ranks takes shares of it), so they are one loss."""
    lower, upper = clip_range(eps, eps_high)
    return clipped_surrogate(logp, old_logp, advantages, mask, lower, upper, delta=delta, log_ratio=log_ratio,
                              aggregate=token_mean, keep=keep)


def dr_grpo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, max_len: int,
                 eps: float = 0.2, eps_high: float | None = None, delta: float | None = None,
                 log_ratio=token_log_ratio, keep: Tensor | None = None) -> tuple[Tensor, PolicyStats]:
    """Dr.GRPO (Liu et al. 2025, "GRPO Done Right"): GRPO without the per-reply 1/|y_i| (and, through
    ``scale_rewards=none``, without the std of the advantage), the token sums divided by a constant
    [TRL dr_grpo; veRL seq-mean-token-sum-norm]:

        L = −(1/B) Σ_i Σ_t min(ρ_i,t A_i,t, clip(ρ_i,t, 1 − ε, 1 + ε_high) A_i,t) / L_max

    L_max = ``max_len``, the longest reply the task allows (TRL's ``max_completion_length``): a long wrong reply is
    no longer penalised less per token than a short one."""
    lower, upper = clip_range(eps, eps_high)
    return clipped_surrogate(logp, old_logp, advantages, mask, lower, upper, delta=delta, log_ratio=log_ratio,
                              aggregate=partial(constant_length_mean, max_len=max_len), keep=keep)


def luspo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, eps: float = 0.2,
               eps_high: float | None = None, delta: float | None = None, log_ratio=token_log_ratio,
               keep: Tensor | None = None) -> tuple[Tensor, PolicyStats]:
    """LUSPO, length-unbiased sequence policy optimisation (arXiv:2602.05261): GSPO's sequence loss scaled by the
    reply's length, i.e. the token sums averaged over replies [TRL luspo; veRL seq-mean-token-sum]:

        L = −(1/B) Σ_i Σ_t min(s_i A_i, clip(s_i, 1 − ε, 1 + ε_high) A_i)

    with s_i GSPO's ratio (``log_ratio=sequence_log_ratio``, the paper's setting); per-token ratios give veRL's
    seq-mean-token-sum of PPO's objective."""
    lower, upper = clip_range(eps, eps_high)
    return clipped_surrogate(logp, old_logp, advantages, mask, lower, upper, delta=delta, log_ratio=log_ratio,
                              aggregate=sequence_sum_mean, keep=keep)


def cispo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, eps_max: float,
               log_ratio=token_log_ratio, keep: Tensor | None = None) -> tuple[Tensor, PolicyStats]:
    """CISPO, clipped importance-sampling-weight policy optimisation (MiniMax-M1, Sec. 3.1): clip the importance
    weight, not the update, so every token keeps a gradient; averaged over the batch's tokens [TRL cispo]:

        L = −Σ_i Σ_t sg(min(ρ_i,t, ε_max)) A_i,t log π_θ(y_i,t | …) / Σ_i |y_i|

    sg = stop-gradient; ε_max = TRL's ``epsilon_high`` (ScaleRL uses 5.0). PolicyStats.clipfrac: the share of
    tokens whose weight was capped (ρ > ε_max)."""
    log_rho = log_ratio(logp, old_logp, mask)
    ratio = torch.exp(log_rho)
    weight = torch.clamp(ratio, max=eps_max).detach()
    loss = -token_mean(weight * advantages.detach() * logp, mask, keep)
    return loss, _stats(ratio, log_rho, mask, ratio > eps_max)


def sapo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, tau_pos: float = 1.0,
              tau_neg: float = 1.05, log_ratio=token_log_ratio,
              keep: Tensor | None = None) -> tuple[Tensor, PolicyStats]:
    """SAPO, soft adaptive policy optimisation (Gao et al. 2025): a smooth gate instead of the hard clip, each
    reply's token mean then the mean over replies [TRL sapo]:

        L = −(1/B) Σ_i (1/|y_i|) Σ_t f(ρ_i,t) A_i,t,      f(ρ) = (4/τ) σ(τ (ρ − 1)),   τ = τ_pos if A > 0 else τ_neg

    f'(1) = 1, so on-policy its gradient is GRPO's; away from ρ = 1 the gradient ρ·4σ(1 − σ) decays smoothly
    (faster for A ≤ 0, τ_neg > τ_pos). PolicyStats.clipfrac: the mean of 1 − 4σ(1 − σ), the share of the on-policy
    gradient the gate takes away (0 at ρ = 1; 1 for a token PPO would clip, in the limit)."""
    log_rho = log_ratio(logp, old_logp, mask)
    ratio = torch.exp(log_rho)
    adv = advantages.detach()
    tau = torch.where(adv > 0, adv.new_tensor(tau_pos), adv.new_tensor(tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    loss = -sequence_mean(gate * adv, mask, keep)
    with torch.no_grad():
        s = torch.sigmoid(tau * (ratio - 1))
        damped = 1 - 4 * s * (1 - s)
    return loss, _stats(ratio, log_rho, mask, damped)


def gmpo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, eps: float = 0.4,
              eps_high: float | None = None, keep: Tensor | None = None) -> tuple[Tensor, PolicyStats]:
    """GMPO, geometric-mean policy optimisation (Zhao et al. 2025): the geometric mean of the reply's clipped token
    ratios instead of their arithmetic mean, so one outlier token ratio moves the reply's weight less:

        L = −(1/B) Σ_i A_i exp((1/|y_i|) Σ_t ℓ_i,t),
        ℓ_i,t = min(log ρ_i,t, clip(log ρ_i,t, −ε, ε_high)) if A_i > 0 else max(log ρ_i,t, clip(log ρ_i,t, −ε, ε_high))

    the clip in log space (ratio range (e^−ε, e^ε_high); the paper uses ε = ε_high = 0.4), sign-aware as PPO's min.
    A_i = the mean of the reply's advantages over ``mask`` (GRPO's are one per reply). ``keep`` drops tokens from the
    geometric mean (as TRL's GMPOTrainer does); a reply with no token in ``mask`` adds 0 (TRL's adds the constant
    −A_i, with no gradient either). PolicyStats.clipfrac: the share of tokens with log ρ outside [−ε, ε_high]."""
    high = eps if eps_high is None else eps_high
    log_rho = logp - old_logp.detach()
    counted = mask.sum(-1).clamp(min=1.0)
    adv = ((advantages.detach() * mask).sum(-1) / counted)[:, None]  # (B, 1)
    clamped = torch.clamp(log_rho, -eps, high)
    clipped = torch.where(adv > 0, torch.minimum(log_rho, clamped), torch.maximum(log_rho, clamped))
    inside = mask if keep is None else mask * keep
    log_weight = (clipped * inside).sum(-1) / inside.sum(-1).clamp(min=1.0)  # (B,)
    loss = -(torch.exp(log_weight) * adv[:, 0]).mean()
    return loss, _stats(torch.exp(log_rho), log_rho, mask, (log_rho < -eps) | (log_rho > high))


def _stats(ratio: Tensor, log_rho: Tensor, mask: Tensor, clipped: Tensor) -> PolicyStats:
    """PolicyStats over ``mask``: the mean of ``clipped`` (bool or a share per token), k3's approx. KL, E[ρ]."""
    with torch.no_grad():
        return PolicyStats(clipfrac=masked_mean(clipped.to(ratio.dtype), mask),
                           approx_kl=masked_mean((ratio - 1.0) - log_rho, mask),
                           ratio_mean=masked_mean(ratio, mask))


def token_entropy(logits: Tensor) -> Tensor:
    """H(π(·|s_t)) = −Σ_v π(v) log π(v) per position, (B, T) from logits (B, T, V) (−inf for banned ids, which add
    nothing), in fp32 from bf16 logits too."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    # banned ids (logit −inf) add nothing, and no 0·∞ reaches the gradient (entr's derivative is infinite at 0)
    logp = torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))
    return -(logp.exp() * logp).sum(-1)


def high_entropy_mask(entropy: Tensor, mask: Tensor, quantile: float, *,
                      population: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """The tokens of ``mask`` whose entropy is in the top ``quantile`` ρ (Wang et al. 2025, "Beyond the 80/20 Rule:
    High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM Reasoning", arXiv:2506.01939: ρ = 0.2),
    (B, T) 0/1 in ``mask``'s dtype:

        keep_t = m_t · [H_t ≥ q],   q = the (1 − ρ)-quantile of the entropies of the population's tokens

    ``population``: (entropy, mask) of the whole batch when ``entropy`` is a part of it (a learner rank's rows);
    None: this batch. ρ = 0 keeps the highest-entropy tokens alone; ρ = 1 every token. (TRL's
    ``get_high_entropy_mask``: the quantile of the tokens' entropies in fp32, linear interpolation.)"""
    pop_h, pop_m = (entropy, mask) if population is None else population
    values = pop_h[pop_m > 0].float()
    if values.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(values, 1.0 - quantile)
    return ((entropy * mask >= threshold) & (mask > 0)).to(mask.dtype)


class LossType(NamedTuple):
    """A ``loss_type``: its function, its aggregation alone, and what its denominator counts."""

    loss: Callable  # the variant: (logp, old_logp, advantages, mask, *, keep, **coefficients) -> (loss, PolicyStats)
    # how it averages the token terms, for an update whose objective is its own (PPO-dynamic's bounds, REINFORCE);
    # None: the variant is an objective of its own (CISPO, SAPO, GMPO) and has no meaning there
    aggregate: Callable | None
    per_reply: bool  # its denominator counts replies (else tokens): what a part of a minibatch takes a share of


LOSS_TYPES: dict[str, LossType] = {
    "dapo": LossType(dapo_loss, token_mean, per_reply=False),
    "bnpo": LossType(dapo_loss, token_mean, per_reply=False),  # TRL's per-micro-batch token mean: dapo here
    "grpo": LossType(grpo_loss, sequence_mean, per_reply=True),
    "dr_grpo": LossType(dr_grpo_loss, constant_length_mean, per_reply=True),
    "luspo": LossType(luspo_loss, sequence_sum_mean, per_reply=True),
    "cispo": LossType(cispo_loss, None, per_reply=False),
    "sapo": LossType(sapo_loss, None, per_reply=True),
    "gmpo": LossType(gmpo_loss, None, per_reply=True),
}

# veRL's (and ROLL's) ``loss_agg_mode`` names of the same aggregations of PPO's clipped objective
VERL_AGGREGATIONS = {
    "token-mean": "dapo",
    "seq-mean-token-mean": "grpo",
    "seq-mean-token-sum": "luspo",
    "seq-mean-token-sum-norm": "dr_grpo",
}

IMPORTANCE_SAMPLING_LEVELS = {"token": token_log_ratio, "sequence": sequence_log_ratio}
