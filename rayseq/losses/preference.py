"""The Bradley–Terry loss of a reward model trained on preference pairs.

Bradley & Terry (1952); Christiano et al. (2017) and Ouyang et al. (2022, Eq. 1) for language: the probability that
y⁺ is preferred to y⁻ for the prompt x is σ(r(x, y⁺) − r(x, y⁻)), and the reward model maximises its log-likelihood
on the human choices. Llama 2 (Touvron et al. 2023, Eq. 2) subtracts a margin m(x) the annotators gave (how much
better y⁺ is); Eisenstein et al. (2023) add an auxiliary term that keeps the rewards centred on zero. As TRL's
``RewardTrainer.compute_loss`` defines them (its ``center_rewards_coefficient``):

    L = −(1/B) Σ_i log σ(r⁺_i − r⁻_i − m_i)  +  c · (1/B) Σ_i (r⁺_i + r⁻_i)²

Math layer: torch only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class PreferenceStats(NamedTuple):
    """Detached diagnostics of a batch of pairs."""

    accuracy: torch.Tensor  # () fraction of pairs with r⁺ > r⁻ (ties count 0, as TRL's)
    margin: torch.Tensor  # () mean r⁺ − r⁻
    reward_mean: torch.Tensor  # () mean of r over both replies
    center: torch.Tensor  # () mean (r⁺ + r⁻)², the centring term without its coefficient


def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor, margin: torch.Tensor | None = None,
                       center_coef: float | None = None) -> tuple[torch.Tensor, PreferenceStats]:
    """L (module docstring) of a batch of B pairs.

    Args:
        r_chosen: (B,) r(x, y⁺), the rewards of the preferred replies.
        r_rejected: (B,) r(x, y⁻).
        margin: (B,) m, subtracted from each difference; None: 0.
        center_coef: c of the centring term; None (or 0): no term.

    Returns:
        (L, :class:`PreferenceStats`).
    """
    diff = r_chosen - r_rejected
    loss = -F.logsigmoid(diff if margin is None else diff - margin).mean()
    center = ((r_chosen + r_rejected) ** 2).mean()
    if center_coef:
        loss = loss + center_coef * center
    with torch.no_grad():
        stats = PreferenceStats((diff > 0).float().mean(), diff.mean(),
                                torch.cat([r_chosen, r_rejected]).mean(), center.detach())
    return loss, stats
