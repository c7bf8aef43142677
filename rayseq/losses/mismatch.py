"""The engine–policy log-prob mismatch and its correction.

An engine with kernels of its own (vLLM) samples y_t ~ π_engine, which differs from the policy's own computation
π_θ on the same weights (kernels, precision, batch shape). The ratio algorithms weigh each sampled token by π_θ / π_old
with π_old the policy's own computation (``Rollout.logp``, by the learners: :func:`rayseq.algos.common.
behaviour_logprobs`), and correct for sampling from π_engine rather than
π_old with truncated importance sampling (Ionides 2008; Yao et al. 2025, "Your efficient RL framework secretly brings
you off-policy RL training", as TRL and veRL apply it by default with vLLM):

    w_t = min(π_old(y_t | …) / π_engine(y_t | …), C)

multiplying token t's advantage (w ≥ 0, so w·min(ρA, clip(ρ)A) = min(ρ·wA, clip(ρ)·wA): the surrogate unchanged,
its advantages reweighted).

Shapes: (B, T) float tensors; ``mask`` 1 for sampled tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rayseq.losses.policy import masked_mean


class MismatchStats(NamedTuple):
    diff_mean: torch.Tensor  # mean |log π_old − log π_engine| over sampled tokens
    diff_max: torch.Tensor  # max of the same
    kl: torch.Tensor  # KL(π_engine ‖ π_old) ≈ E_engine[(r − 1) − log r], r = π_old / π_engine (k3 estimator, ≥ 0)


def logp_mismatch(logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor) -> MismatchStats:
    """How far the engine's log-probs are from the policy's on the sampled tokens (module docstring)."""
    log_r = (logp - engine_logp) * mask
    diff = log_r.abs()
    return MismatchStats(masked_mean(diff, mask), (diff * mask).max() if diff.numel() else diff.sum(),
                         masked_mean(torch.expm1(log_r) - log_r, mask))


def truncated_is_weights(logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                         cap: float) -> torch.Tensor:
    """w_t = min(exp(log π_old − log π_engine), C) on sampled tokens, 1 elsewhere (module docstring); the decoupled
    objective's behaviour weight min(π_prox / π_behaviour, C) is the same with (π_prox, π_behaviour) in their places
    (:func:`rayseq.algos.ppo.ppo_update`)."""
    w = torch.exp(logp - engine_logp).clamp(max=cap)
    return torch.where(mask > 0, w, torch.ones_like(w))
