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


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016; Keneshloo et al. survey Sec. III-B, the GAE
    equation before Algorithm 3) for right-padded sequences, vectorised over the batch:

        δ_t = r_t + γ V(s_{t+1}) − V(s_t)        (V after the last real token is 0: the episode ended)
        A_t = Σ_k (γλ)^k δ_{t+k} = δ_t + γλ A_{t+1}
        G_t^λ = A_t + V(s_t)                     (the TD(λ) target of the critic)

    rewards, values, mask (B, T) -> (advantages, λ-returns) (B, T), 0 where masked; both detached.
    λ = 1 gives A_t = R_t − V(s_t) (Monte Carlo), λ = 0 the one-step TD error.
    """
    r = (rewards * mask).detach()
    v = (values * mask).detach()
    adv = torch.zeros_like(r)
    nxt_adv = torch.zeros_like(r[:, 0])
    nxt_v = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        delta = r[:, t] + gamma * nxt_v - v[:, t]
        a = (delta + gamma * lam * nxt_adv) * mask[:, t]
        adv[:, t] = a
        nxt_adv, nxt_v = a, v[:, t]
    return adv, (adv + v) * mask
