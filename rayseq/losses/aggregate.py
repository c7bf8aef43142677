"""How per-token policy objectives become one number, and the importance ratio at token or sequence level.

The loss variants of :mod:`rayseq.losses.menu` differ in three places: the objective of each token, the ratio it
reads (one per token, or one per reply: GSPO), and how the token terms are averaged (this module). An aggregation
takes x (B, T), the per-token objective, and ``mask`` (B, T), 1 on the tokens the loss counts; its denominator
counts tokens (``token_mean``) or replies (the others), never a part of the batch: a minibatch split over learner
ranks or micro-batches gives each part its share of that denominator (:mod:`rayseq.algos.parallel`), so the parts
sum to the whole.

``keep`` (B, T) 0/1, optional: the tokens whose terms count (the high-entropy tokens of Wang et al. 2025, "Beyond
the 80/20 Rule"); the denominators still count every token of ``mask``, as TRL's ``top_entropy_quantile`` does.

The names in brackets are TRL's ``loss_type`` and veRL's ``loss_agg_mode`` for the same aggregation.
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over entries where ``mask`` is 1; 0 when nothing is unmasked."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def _kept(x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    return x if keep is None else x * keep


def token_mean(x: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Every token of the batch weighs the same (DAPO, Yu et al. 2025, Sec. 3.3 "Token-Level Policy Gradient Loss"
    and Eq. 8) [dapo, bnpo; token-mean]:

        Σ_i Σ_t m_i,t x_i,t / Σ_i Σ_t m_i,t

    A long reply has as many terms as it has tokens, so neither a long wrong reply nor a short right one is favoured
    per token."""
    return masked_mean(_kept(x, keep), mask)


def sequence_mean(x: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Each reply's token mean, then the mean over replies (GRPO, Shao et al. 2024, "DeepSeekMath", Eq. 3)
    [grpo, sapo; seq-mean-token-mean]:

        (1/B) Σ_i (1/|y_i|) Σ_t m_i,t x_i,t,      |y_i| = max(Σ_t m_i,t, 1)

    Every reply weighs the same whatever its length, so a token of a short reply weighs more than one of a long
    reply (the length bias Dr.GRPO removes). A reply with no token in the loss counts in B with 0."""
    return ((_kept(x, keep) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def sequence_sum_mean(x: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Each reply's token sum, then the mean over replies (LUSPO, arXiv:2602.05261: the sequence loss scaled by its
    length) [luspo; seq-mean-token-sum]:

        (1/B) Σ_i Σ_t m_i,t x_i,t"""
    return (_kept(x, keep) * mask).sum(-1).mean()


def constant_length_mean(x: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor | None = None, *,
                         max_len: int) -> torch.Tensor:
    """Token sums over a constant (Dr.GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical
    Perspective", arXiv:2503.20783) [dr_grpo; seq-mean-token-sum-norm]:

        (1/B) Σ_i Σ_t m_i,t x_i,t / L,      L = ``max_len``, the longest reply the task allows

    Unbiased in length like ``token_mean``, and the scale of a token's term does not depend on the other replies of
    the batch (TRL divides by ``max_completion_length``, veRL by ``loss_scale_factor`` or the padded width)."""
    return (_kept(x, keep) * mask).sum() / (x.shape[0] * max_len)


def token_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log ρ_i,t = log π_θ(y_i,t | …) − log π_old(y_i,t | …), (B, T): one ratio per token (PPO, GRPO)
    [importance_sampling_level=token]."""
    return logp - old_logp.detach()


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's sequence ratio (Zheng et al. 2025, "Group Sequence Policy Optimization", Sec. 4.1) on every token of its
    reply, (B, T) [importance_sampling_level=sequence]:

        log s_i = (1/|y_i|) Σ_t m_i,t (log π_θ(y_i,t | …) − log π_old(y_i,t | …))

    i.e. s_i = (π_θ(y_i) / π_old(y_i))^(1/|y_i|), the geometric mean of the reply's token ratios: one clip decision
    per reply."""
    per_token = (logp - old_logp.detach()) * mask
    per_reply = per_token.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return per_reply.expand_as(logp)
