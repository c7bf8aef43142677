"""Self-critical sequence training (Rennie et al. 2017; Keneshloo et al. survey Sec. III-A, the SC objective
after Algorithm 2): REINFORCE whose baseline is the reward of the model's own greedy decode of the same input,

    ∇L = −Σ_t ∇ log π_θ(ŷ_t | ŷ_<t, x) · (r(ŷ_1..T) − r(ŷ^g_1..T)),

so only samples better than what the model outputs at test time are reinforced. The rollout workers
decode greedily beside the sample (``RolloutRequest.greedy_baseline``) and the reward is computed for both
where the task's reward is (worker or ScorerActor); no learned baseline is used.
"""

from __future__ import annotations

import dataclasses

import torch

from rayseq.algos.common import LearnerState, RolloutAlgo, optimizer_step, rollout_metrics, with_entropy
from rayseq.losses import reinforce_loss
from rayseq.types import Rollout, RolloutRequest, to_torch


def self_critical_advantages(score: torch.Tensor, baseline_score: torch.Tensor,
                             action_mask: torch.Tensor) -> torch.Tensor:
    """A_t = r(ŷ) − r(ŷ^g) on every sampled token: score, baseline_score (B,), action_mask (B, T) -> (B, T)."""
    return (score - baseline_score)[:, None] * action_mask


class SCST(RolloutAlgo):
    name = "scst"
    fields: dict = {}  # the baseline is the greedy decode's reward: no learned one, no discounting

    def rollout_request(self, iteration: int, max_len: int, temperature: float, seed: int) -> RolloutRequest:
        return dataclasses.replace(super().rollout_request(iteration, max_len, temperature, seed), greedy_baseline=True)

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        if rollout.baseline_score is None:
            raise ValueError("scst: the rollout has no greedy baseline (RolloutRequest.greedy_baseline was off)")
        dev = state.device
        mask = to_torch(rollout.action_mask, dev)
        adv = self_critical_advantages(to_torch(rollout.score, dev), to_torch(rollout.baseline_score, dev), mask)
        out = state.generator.logprobs(to_torch(rollout.src, dev), to_torch(rollout.src_len, dev),
                                       to_torch(rollout.tokens, dev))
        loss, stats = reinforce_loss(out.logp, adv, mask)
        extra: dict = {}
        loss = with_entropy(state, loss, out.logits, mask, extra)
        grad_norm = optimizer_step(state.gen_opt, loss, state.generator.parameters(), self.cfg.max_grad_norm)
        return {
            **rollout_metrics(rollout),
            "scst/greedy_reward_mean": float(rollout.baseline_score.mean()),
            "scst/better_than_greedy": float((rollout.score > rollout.baseline_score).mean()),
            "loss/policy": loss.item(),
            "policy/advantage_mean": float(stats.advantage_mean),
            "policy/grad_norm": grad_norm,
            **extra,
        }
