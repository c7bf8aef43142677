"""REINFORCE with a learned baseline (Tuan et al. Eq. 1; Ranzato et al. 2015; survey Sec. III-A).

One gradient step per sampled batch:
    loss = −mean_t (R_t − b(s_t)) log π_θ(y_t | x, y_<t),   b trained by MSE on the detached state.
"""

from __future__ import annotations

from rayseq.algos.common import (
    LearnerState,
    RolloutAlgo,
    advantages,
    grad_pass,
    optimizer_step,
    returns_gamma,
    rollout_metrics,
    rollout_tensors,
    value_baseline,
    with_entropy,
)
from rayseq.losses import reinforce_loss, value_loss
from rayseq.types import Rollout


class Reinforce(RolloutAlgo):
    name = "reinforce"

    def build_modules(self, run_cfg, generator, task, device) -> dict:
        """b(s_t) and its Adam (trained every update, subtracted with ``algo.use_baseline``)."""
        return value_baseline(run_cfg, generator, device)

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        cfg = self.cfg
        b = rollout_tensors(rollout, state.device, returns_gamma(cfg))  # SeqGAN's update too: Q given
        out = grad_pass(state.generator, b.src, b.src_len, b.tokens, bool(state.entropy_coef))
        values = self.modules["baseline"](out.states)
        adv = advantages(b.returns, self.values_for_advantage(values), b.action_mask, cfg.normalize_advantages)
        loss, stats = reinforce_loss(out.logp, adv, b.action_mask)
        extra: dict = {}
        loss = with_entropy(state, loss, out.logits, b.action_mask, extra, entropy=out.entropy)
        grad_norm = optimizer_step(state.gen_opt, loss, state.generator.parameters(), cfg.max_grad_norm)
        v_loss, v_stats = value_loss(values, b.returns, b.action_mask)
        optimizer_step(self.modules["base_opt"], v_loss, self.modules["baseline"].parameters(), None)
        return {
            **rollout_metrics(rollout),
            "loss/policy": loss.item(),
            "loss/value": v_loss.item(),
            "policy/advantage_mean": float(stats.advantage_mean),
            "policy/grad_norm": grad_norm,
            "value/explained_variance": float(v_stats.explained_variance),
            **extra,
        }
