"""Maximum likelihood and the value-baseline regression."""

from __future__ import annotations

from typing import NamedTuple

import torch

from rayseq.losses.policy import masked_mean


class NLLStats(NamedTuple):
    nll: torch.Tensor  # mean per-token negative log-likelihood
    tokens: torch.Tensor  # unmasked tokens counted


class ValueStats(NamedTuple):
    value_mean: torch.Tensor
    explained_variance: torch.Tensor  # 1 − Var[R − b] / Var[R]


def token_nll_loss(logp: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, NLLStats]:
    """MLE / teacher-forced cross-entropy: −mean_t log π_θ(y*_t | x, y*_<t) over unmasked tokens."""
    loss = -masked_mean(logp, mask)
    return loss, NLLStats(loss.detach(), mask.sum().detach())


def value_loss(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, ValueStats]:
    """Baseline regression (Ranzato et al. 2015): mean_t (b(s_t) − R_t)² over unmasked tokens."""
    target = returns.detach()
    loss = masked_mean((values - target) ** 2, mask)
    with torch.no_grad():
        var_r = masked_mean((target - masked_mean(target, mask)) ** 2, mask)
        resid = target - values
        var_e = masked_mean((resid - masked_mean(resid, mask)) ** 2, mask)
        ev = 1.0 - var_e / var_r.clamp(min=1e-8)
    return loss, ValueStats(masked_mean(values, mask).detach(), ev)
