"""MIXER (Ranzato et al. 2016, "Sequence Level Training with Recurrent Neural Networks"; Keneshloo et al.
survey Sec. IV-A), and its PPO / PPO-dynamic versions (Tuan et al. 2018, Table 1 middle block).

For every sequence: cross-entropy on the first ``len(y*) − δ`` tokens of ITS reference y* (forced: the
decoder reads them), then the policy samples the rest and REINFORCE (with the learned baseline) trains the
sampled tokens. len(y*) counts the reference's end token, so with δ = 1 the policy decides where to stop;
a reference shorter than δ is sampled whole (the prefix is clamped at 0). δ starts at ``mixer_delta_start``
and grows by ``mixer_delta_step`` every ``mixer_delta_every`` iterations, until every reference is sampled
whole (then MIXER is REINFORCE). The forced prefix is per row (the rollout workers compute it from each
reference's length: :class:`ReferencePrefix`, the sampler of MIXER's requests): a fixed ``max_len − δ`` prefix would
force the padding of short references and, on chit-chat's 21-token cap, sample almost nothing. The prefix is forced
by the policy's own decoding loop, so MIXER samples with ``rollout.engine=builtin``.

- ``mixer``: one REINFORCE step per batch (:func:`rayseq.losses.mixer_loss`),
- ``mixer_ppo``: PPO's clipped surrogate (Tuan et al. Eq. 3) on the sampled tokens, cross-entropy on the
  forced ones, in PPO's K-epoch minibatch loop (:func:`rayseq.losses.mixer_combine`); Supplement C: ε = 0.2,
- ``mixer_ppo_dynamic``: the same with PPO-dynamic's bounds (Eq. 4); Supplement C: α1 = β1 = ∞, α2 = β2 = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from rayseq.algos.common import (
    BASELINE_FIELDS,
    LearnerState,
    RolloutAlgo,
    advantages,
    grad_micro_batches,
    grad_pass,
    optimizer_step,
    rollout_metrics,
    rollout_tensors,
    value_baseline,
    with_entropy,
)
from rayseq.algos.ppo import CLIP_FIELDS, PPO_FIELDS, clip_surrogate, minibatch_seed, ppo_update
from rayseq.algos.ppo_dynamic import DYNAMIC_FIELDS, dynamic_surrogate
from rayseq.algos.reinforce import accumulated_pg_update
from rayseq.algos.sampling import Sampled, SamplingCall, check_builtin_engine
from rayseq.losses import mixer_loss, value_loss
from rayseq.types import Rollout, RolloutRequest, to_torch


def mixer_part(logp, adv, part) -> tuple:
    """MIXER's loss on a part of the batch (:func:`rayseq.losses.mixer_loss`): the cross-entropy on its forced tokens
    and REINFORCE on its sampled ones, over all its tokens."""
    return mixer_loss(logp, adv, part.token_mask - part.action_mask, part.action_mask)


# δ's schedule (Mixer.delta)
MIXER_FIELDS = {
    "mixer_delta_start": (int, Field(1, ge=0, description="MIXER: initial number δ of REINFORCE steps.")),
    "mixer_delta_step": (int, Field(1, ge=1, description="MIXER: δ grows by this much ...")),
    "mixer_delta_every": (int, Field(50, ge=1, description="MIXER: ... every this many iterations.")),
}


@dataclass(frozen=True)
class ReferencePrefix:
    """MIXER's draw (Ranzato et al. 2016): row b's first max(len(y*_b) − δ, 0) tokens are its reference's
    (``PromptBatch.tgt``, forced: action_mask 0, log π_θ of the forced token recorded), the rest sampled from π_θ by
    the policy's own decoding loop (``sample(..., prefix=, prefix_len=)``) with the request's temperature and random
    stream. Nothing beside the replies is scored."""

    delta: int  # δ: the number of final reference tokens the policy samples

    def sample(self, call: SamplingCall) -> Sampled:
        prefix = to_torch(call.prompts.tgt, call.src.device)
        prefix_len = (to_torch(call.prompts.tgt_len, call.src.device) - self.delta).clamp(min=0)
        return Sampled(call.policy.sample(call.src, call.src_len, call.max_len, temperature=call.temperature,
                                          prefix=prefix, prefix_len=prefix_len, generator=call.rng))

    def score(self, task, rollout: Rollout) -> None:
        """Nothing beside the replies to score."""


class Mixer(RolloutAlgo):
    name = "mixer"
    fields = {**BASELINE_FIELDS, **MIXER_FIELDS}
    needs_targets = True

    def build_modules(self, run_cfg, generator, task, device) -> dict:
        """b(s_t) and its Adam (trained every update, its PPO versions' too)."""
        return value_baseline(run_cfg, generator, device)

    def delta(self, iteration: int) -> int:
        """δ at ``iteration``: the number of final reference tokens the policy samples."""
        c = self.cfg
        return c.mixer_delta_start + c.mixer_delta_step * (iteration // c.mixer_delta_every)

    def rollout_request(self, iteration: int, max_len: int, temperature: float, seed: int) -> RolloutRequest:
        return RolloutRequest(max_len=max_len, temperature=temperature, seed=seed,
                              sampler=ReferencePrefix(self.delta(iteration)))

    @classmethod
    def check_config(cls, cfg) -> None:
        check_builtin_engine(cfg, "forces reference prefixes")  # ReferencePrefix: in the policy's own loop

    def schedule_metrics(self, rollout: Rollout, iteration: int) -> dict:
        real = float(rollout.token_mask.sum())
        return {"mixer/delta": float(self.delta(iteration)),
                "mixer/sampled_frac": float(rollout.action_mask.sum()) / max(real, 1.0)}

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        cfg = self.cfg
        b = rollout_tensors(rollout, state.device, cfg.gamma)
        pieces = grad_micro_batches(state, len(rollout), b.src.shape[1] + b.tokens.shape[1])
        if pieces is not None:  # learner.micro_batch_size rows at a time: MIXER's loss divides by all the tokens
            m = accumulated_pg_update(self, state, rollout, b, pieces, mixer_part, denominator="token_mask")
            return {**m, **self.schedule_metrics(rollout, iteration)}
        out = grad_pass(state.generator, b.src, b.src_len, b.tokens, bool(state.entropy_coef))
        values = self.modules["baseline"](out.states)
        adv = advantages(b.returns, self.values_for_advantage(values), b.action_mask, cfg.normalize_advantages)
        xent_mask = b.token_mask - b.action_mask
        loss, stats = mixer_loss(out.logp, adv, xent_mask, b.action_mask)
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
            **self.schedule_metrics(rollout, iteration),
            **extra,
        }


class MixerPPO(Mixer):
    name = "mixer_ppo"
    off_policy_ratio = True
    fields = {**BASELINE_FIELDS, **MIXER_FIELDS, **PPO_FIELDS, **CLIP_FIELDS}

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        m = ppo_update(self.cfg, state, rollout, clip_surrogate(self.cfg), seed=minibatch_seed(self, iteration),
                       modules=self.modules, use_baseline=self.baseline_on, mixer=True)
        return {**m, **self.schedule_metrics(rollout, iteration)}


class MixerPPODynamic(Mixer):
    name = "mixer_ppo_dynamic"
    off_policy_ratio = True
    fields = {**BASELINE_FIELDS, **MIXER_FIELDS, **PPO_FIELDS, **DYNAMIC_FIELDS}

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        surrogate, bounds = dynamic_surrogate(self.cfg)
        m = ppo_update(self.cfg, state, rollout, surrogate, seed=minibatch_seed(self, iteration),
                       modules=self.modules, use_baseline=self.baseline_on, mixer=True)
        return {**m, **bounds, **self.schedule_metrics(rollout, iteration)}
