"""Self-critical sequence training (Rennie et al. 2017; Keneshloo et al. survey Sec. III-A, the SC objective
after Algorithm 2): REINFORCE whose baseline is the reward of the model's own greedy decode of the same input,

    ∇L = −Σ_t ∇ log π_θ(ŷ_t | ŷ_<t, x) · (r(ŷ_1..T) − r(ŷ^g_1..T)),

so only samples better than what the model outputs at test time are reinforced. The rollout workers
decode greedily beside the sample (:class:`GreedyBaseline`, the sampler of SCST's requests) and the reward is
computed for both where the task's reward is (worker or ScorerActor); no learned baseline is used.
"""

from __future__ import annotations

import dataclasses

import torch

from rayseq.algos.common import (
    LearnerState,
    RolloutAlgo,
    grad_micro_batches,
    grad_pass,
    optimizer_step,
    rollout_metrics,
    rollout_tensors,
    with_entropy,
)
from rayseq.algos.reinforce import accumulated_policy_step
from rayseq.algos.sampling import Sampled, SamplingCall, check_builtin_engine
from rayseq.losses import reinforce_loss
from rayseq.types import Rollout, RolloutRequest, to_torch


@dataclasses.dataclass(frozen=True)
class GreedyBaseline:
    """SCST's draw (Rennie et al. 2017): the sample ŷ ~ π_θ through the rollout engine, and beside it the model's
    greedy decode ŷ^g of the same input (argmax at every step), whose reward r(ŷ^g) is the baseline of the
    self-critical advantage r(ŷ) − r(ŷ^g). Extras: ``greedy_tokens`` (B, T') int64 and ``greedy_mask`` (B, T')
    float32 (its real tokens) when sampled; ``greedy_score`` (B,) float32, r(ŷ^g) by the task's reward
    (``task.rewards``), where the sample's reward is computed."""

    def sample(self, call: SamplingCall) -> Sampled:
        drawn = call.engine()
        g = call.policy.sample(call.src, call.src_len, call.max_len, greedy=True)
        extras = {"greedy_tokens": g.tokens.cpu().numpy(), "greedy_mask": g.token_mask.cpu().numpy()}
        return drawn._replace(extras={**drawn.extras, **extras})

    def score(self, task, rollout: Rollout) -> None:
        x = rollout.extras
        _, x["greedy_score"] = task.rewards(rollout.src, rollout.src_len, x["greedy_tokens"], x["greedy_mask"],
                                            key=rollout.key)


def self_critical_advantages(score: torch.Tensor, baseline_score: torch.Tensor,
                             action_mask: torch.Tensor) -> torch.Tensor:
    """A_t = r(ŷ) − r(ŷ^g) on every sampled token: score, baseline_score (B,), action_mask (B, T) -> (B, T)."""
    return (score - baseline_score)[:, None] * action_mask


class SCST(RolloutAlgo):
    name = "scst"
    data_parallel = True  # several learners: each its rows in micro-batches (reinforce.accumulated_policy_step)
    fields: dict = {}  # the baseline is the greedy decode's reward: no learned one, no discounting

    @classmethod
    def check_config(cls, cfg) -> None:
        check_builtin_engine(cfg, "decodes greedily beside each sample")  # GreedyBaseline: the policy's own loop

    def rollout_request(self, iteration: int, max_len: int, temperature: float, seed: int) -> RolloutRequest:
        return dataclasses.replace(super().rollout_request(iteration, max_len, temperature, seed),
                                   sampler=GreedyBaseline())

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        if "greedy_score" not in rollout.extras:
            raise ValueError("scst: the rollout has no greedy baseline (its request's sampler was not GreedyBaseline)")
        baseline_score = rollout.extras["greedy_score"]
        dev = state.device
        mask = to_torch(rollout.action_mask, dev)
        adv = self_critical_advantages(to_torch(rollout.score, dev), to_torch(baseline_score, dev), mask)
        scst = {"scst/greedy_reward_mean": float(baseline_score.mean()),
                "scst/better_than_greedy": float((rollout.score > baseline_score).mean())}
        pieces = grad_micro_batches(state, len(rollout), rollout.src.shape[1] + rollout.tokens.shape[1])
        if pieces is not None:  # learner.micro_batch_size rows at a time (reinforce.accumulated_policy_step)
            b = rollout_tensors(rollout, dev, 1.0)
            m = accumulated_policy_step(state, b, pieces, adv, self.cfg.max_grad_norm)
            return {**rollout_metrics(rollout), **scst, **m}
        out = grad_pass(state.generator, to_torch(rollout.src, dev), to_torch(rollout.src_len, dev),
                        to_torch(rollout.tokens, dev), bool(state.entropy_coef))
        loss, stats = reinforce_loss(out.logp, adv, mask)
        extra: dict = {}
        loss = with_entropy(state, loss, out.logits, mask, extra, entropy=out.entropy)
        grad_norm = optimizer_step(state.gen_opt, loss, state.generator.parameters(), self.cfg.max_grad_norm)
        return {
            **rollout_metrics(rollout),
            **scst,
            "loss/policy": loss.item(),
            "policy/advantage_mean": float(stats.advantage_mean),
            "policy/grad_norm": grad_norm,
            **extra,
        }
