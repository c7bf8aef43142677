"""MIXER (Ranzato et al. 2015; Keneshloo et al. survey Sec. IV-A).

For every sequence: cross-entropy on the first T−δ tokens (taken from the reference), REINFORCE
(with the learned baseline) on the last δ tokens, which the policy samples after the reference prefix.
δ starts at ``mixer_delta_start`` and grows by ``mixer_delta_step`` every ``mixer_delta_every``
iterations until the whole sequence is sampled (then MIXER is REINFORCE).
"""

from __future__ import annotations

from rayseq.algos.common import LearnerState, RolloutAlgo, advantages, rollout_metrics, rollout_tensors, step
from rayseq.losses import mixer_loss, value_loss
from rayseq.types import Rollout, RolloutRequest


class Mixer(RolloutAlgo):
    needs_targets = True

    def delta(self, iteration: int, max_len: int) -> int:
        c = self.cfg
        return min(max_len, c.mixer_delta_start + c.mixer_delta_step * (iteration // c.mixer_delta_every))

    def rollout_request(self, iteration: int, max_len: int, temperature: float, seed: int) -> RolloutRequest:
        prefix = max_len - self.delta(iteration, max_len)
        return RolloutRequest(max_len=max_len, temperature=temperature, prefix_len=prefix, seed=seed)

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        cfg = self.cfg
        b = rollout_tensors(rollout, state.device, cfg.gamma)
        out = state.generator.logprobs(b.src, b.src_len, b.tokens)
        values = state.baseline(out.states)
        adv = advantages(b.returns, self.values_for_advantage(values), b.action_mask, cfg.normalize_advantages)
        xent_mask = b.token_mask - b.action_mask
        loss, stats = mixer_loss(out.logp, adv, xent_mask, b.action_mask)
        grad_norm = step(state.gen_opt, loss, state.generator.parameters(), cfg.max_grad_norm)
        v_loss, v_stats = value_loss(values, b.returns, b.action_mask)
        step(state.base_opt, v_loss, state.baseline.parameters(), None)
        return {
            **rollout_metrics(rollout),
            "loss/policy": loss.item(),
            "loss/value": v_loss.item(),
            "policy/advantage_mean": float(stats.advantage_mean),
            "policy/grad_norm": grad_norm,
            "mixer/delta": float(self.delta(iteration, rollout.tokens.shape[1])),
            "value/explained_variance": float(v_stats.explained_variance),
        }
