"""SeqGAN with a learned critic in place of Monte-Carlo search (the SeqGAN paper's stated future work:
Yu et al. 2017, Sec. 4 end / Sec. 6; the actor-critic of the Keneshloo et al. survey, Sec. III-B).

SeqGAN estimates Q(Y_1:t−1, y_t) by N Monte-Carlo continuations of every prefix scored by D (Eq. 4):
B·N·T(T−1)/2 generator steps and B·N·(T−1) discriminator evaluations per batch. Here only the B sampled
sequences are scored, D(Y_1:T) is the terminal reward, and the critic V_ψ(s_t) on the decoder state supplies
the rest: s_{t+1} has read y_t, so

    Q̂(Y_1:t−1, y_t) = r_t + γ V_ψ(s_{t+1})     (= D(Y_1:T) on the last token, as in Eq. 4)

and the generator follows SeqGAN's Eq. 8 with Q̂ (no baseline, as SeqGAN; ``algo.use_baseline=true``
subtracts V_ψ(s_t), i.e. uses the TD error). The critic regresses on TD(λ) targets of the same batch
(:func:`rayseq.losses.gae`, λ = ``algo.gae_lambda``). The discriminator and its d-steps are SeqGAN's.
"""

from __future__ import annotations

import time

import numpy as np

from rayseq.algos.actor_critic import (
    CRITIC_FIELDS,
    build_critic,
    critic_pass,
    critic_step,
    policy_step,
    with_warmup,
)
from rayseq.algos.common import BASELINE_FIELDS, LearnerState, RolloutAlgo, rollout_metrics
from rayseq.algos.seqgan import SEQGAN_FIELDS, Adversarial
from rayseq.losses import gae, masked_mean
from rayseq.rewards import terminal_rewards
from rayseq.types import Rollout, to_torch


class SeqGANCritic(Adversarial, RolloutAlgo):
    name = "seqgan_critic"
    fields = {**{k: BASELINE_FIELDS[k] for k in ("gamma", "use_baseline")},  # use_baseline: subtract V_ψ(s_t)
              "g_steps": SEQGAN_FIELDS["g_steps"], **CRITIC_FIELDS}

    def build_modules(self, run_cfg, generator, task, device) -> dict:
        """The critic V_ψ and its Adam, then SeqGAN's D and its Adam (no G_β: no Monte-Carlo search)."""
        return {**build_critic(run_cfg, generator, device),
                **Adversarial.build_modules(self, run_cfg, generator, task, device)}

    def config_lrs(self, run_cfg) -> dict:
        return {"critic_opt": run_cfg.algo.critic_lr, **Adversarial.config_lrs(self, run_cfg)}

    @classmethod
    def train_iters(cls, cfg) -> int:
        return with_warmup(cfg)

    def discriminator_steps(self, iteration: int, d_steps: int) -> int:
        """D waits while only the critic learns (the first ``critic_warmup`` iterations)."""
        return 0 if iteration < self.cfg.critic_warmup else d_steps

    def score(self, groups, shards: list, seed: int, step) -> tuple[list, dict]:
        """D(Y) of each sampled sequence only, on the scorers (no Monte-Carlo search; the critic does the rest)."""
        groups.scorer.sync_weights()
        parts, infos = groups.scorer.run_on_shards(score_sequences, shards)
        return parts, {"time/mc_s": 0.0, "time/score_s": max(i["score_s"] for i in infos)}

    def assign_scores(self, rollout: Rollout, parts: list) -> dict:
        """On the learner: D(Y) as the sequence's score and terminal reward."""
        d_y = np.concatenate(parts)
        rollout.score = d_y
        rollout.rewards = terminal_rewards(d_y, rollout.token_mask)
        lengths = (rollout.token_mask > 0).sum(1)
        return {"rollout/tokens": float(lengths.sum()), "rollout/extra_gen_steps": 0.0,
                "rollout/d_evals": float(len(lengths))}

    def policy_update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        cfg = self.cfg
        b, out, values, rewards = critic_pass(state, self.modules["critic"], rollout, cfg.gamma)
        _, q = gae(rewards, values, b.token_mask, cfg.gamma, 0.0)  # λ = 0: r_t + γ V(s_{t+1})
        adv = (q - values.detach() * b.token_mask) if self.baseline_on else q
        _, targets = gae(rewards, values, b.token_mask, cfg.gamma, cfg.gae_lambda)
        m = policy_step(cfg, state, out, adv, b.action_mask, train=iteration >= cfg.critic_warmup)
        m.update(critic_step(self.modules, values, targets, b.token_mask))
        m["rollout/q_mean"] = float(masked_mean(q, b.token_mask))
        return {**rollout_metrics(rollout), **m}


def score_sequences(scorer, rollout: Rollout) -> tuple:
    """On a scorer: D(Y) (B,) float32 of the shard's whole sequences (the terminal reward), and timings."""
    t0 = time.perf_counter()
    dev = scorer.device
    conditional = rollout.src.shape[1] > 0
    lengths = to_torch((rollout.token_mask > 0).sum(1).astype(np.int64), dev)
    src = to_torch(rollout.src, dev) if conditional else None
    src_len = to_torch(rollout.src_len, dev) if conditional else None
    p = scorer.modules["disc"].score(to_torch(rollout.tokens, dev), lengths, src, src_len,
                                     batch_size=scorer.cfg.scorer.batch_size)
    return p.cpu().numpy().astype(np.float32), {"score_s": time.perf_counter() - t0, "scored": len(rollout)}
