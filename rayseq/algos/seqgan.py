"""SeqGAN (Yu et al. 2017, Algorithm 1 and Eq. 4-8) in one file, and its PPO / PPO-dynamic variants (Tuan et al.
2018, Table 1 lower block, Supplement C).

Algorithm 1, and where each line runs:

    pretrain G_θ by MLE; G_β ← G_θ                                  (the driver's ``mle`` stage)
    pretrain D on G_θ's samples against real data                   (stage ``disc``: :func:`d_step`)
    repeat:  for g-steps: sample Y ~ G_θ, Q(Y_1:t−1, y_t) by Monte-Carlo search with G_β scored by D (Eq. 4;
                          rollout workers and scorer actors, :mod:`rayseq.rewards.mc_search`), update θ (Eq. 8)
             β ← r·β + (1−r)·θ                                      (:func:`average_rollout_policy`)
             for d-steps: fresh negatives from G_θ, train D k epochs (:func:`d_step`, Eq. 5)

The driver runs the loop through the algorithm's hooks: ``policy_steps`` (g-steps), ``scoring =
"monte_carlo_q"`` (how a rollout gets its Q), ``discriminator_steps`` (d-steps); the learner calls the two
functions below. The reward of token y_t is Q(Y_1:t−1, y_t), delivered as ``Rollout.returns``; the generator
follows the policy gradient

    ∇J(θ) ≈ Σ_t Q(Y_1:t−1, y_t) ∇_θ log G_θ(y_t | Y_1:t−1)                  (SeqGAN Eq. 8)

with no baseline, as SeqGAN's code (``algo.use_baseline=true`` subtracts the learned one):

- ``seqgan``: one gradient step on that objective (:func:`rayseq.losses.reinforce_loss`),
- ``seqgan_ppo``: PPO's clipped surrogate (Tuan et al. Eq. 3, ε = 0.2),
- ``seqgan_ppo_dynamic``: PPO-dynamic (Eq. 4) with Supplement C's SeqGAN setting α1 = 10, β1 = 0.5,
  α2 = β2 = 0.2: the algorithm's ``defaults``, resolved into the run's config (what config.yaml shows is
  what the loss receives); ``algo.alpha1=...`` etc. change them.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from rayseq.algos.common import (
    CLIP_PARAMS,
    DYNAMIC_PARAMS,
    PPO_PARAMS,
    SEQGAN_PARAMS,
    LearnerState,
    RolloutAlgo,
)
from rayseq.algos.ppo import minibatch_seed, ppo_update
from rayseq.algos.ppo_dynamic import dynamic_surrogate
from rayseq.algos.reinforce import Reinforce
from rayseq.losses import discriminator_loss, ppo_clip_loss
from rayseq.types import PromptBatch, Rollout, to_torch


# -- Algorithm 1's discriminator and rollout-policy steps (run by the learner) ------------------------------------
def d_step(disc, opt, positives: PromptBatch, negatives: Rollout, dcfg, pad_id: int, device, seed: int) -> dict:
    """One d-step (Algorithm 1): ``dcfg.epochs`` epochs of minibatch BCE (Eq. 5) over the real (input, target)
    pairs and the freshly generated negatives, shuffled together with a generator seeded by ``seed``; L2 on D's
    output layer (``dcfg.l2_reg``, SeqGAN's code). Returns the epoch-mean loss, accuracy, D(real), D(fake)."""
    disc.train()
    neg_len = (negatives.token_mask > 0).sum(1)
    tokens = _pad_cat(positives.tgt, negatives.tokens, pad_id)
    lengths = np.concatenate([positives.tgt_len, neg_len])
    src = _pad_cat(positives.src, negatives.src, pad_id)
    src_len = np.concatenate([positives.src_len, negatives.src_len])
    labels = np.concatenate([np.ones(len(positives)), np.zeros(len(negatives))]).astype(bool)
    tokens, lengths, src, src_len = (to_torch(a, device) for a in (tokens, lengths, src, src_len))
    conditional = src.shape[1] > 0
    labels = torch.from_numpy(labels).to(device)
    perm_rng = torch.Generator().manual_seed(int(seed))
    sums = {"disc/loss": 0.0, "disc/accuracy": 0.0, "disc/d_real": 0.0, "disc/d_fake": 0.0}
    n = 0
    for _ in range(dcfg.epochs):
        perm = torch.randperm(len(labels), generator=perm_rng).to(device)
        for a in range(0, len(perm), dcfg.batch_size):
            idx = perm[a : a + dcfg.batch_size]
            logits = disc(tokens[idx], lengths[idx], src[idx] if conditional else None,
                          src_len[idx] if conditional else None)
            y = labels[idx]
            loss, stats = discriminator_loss(logits[y], logits[~y], dcfg.l2_reg, disc.out.parameters())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sums["disc/loss"] += loss.item()
            sums["disc/accuracy"] += float(stats.accuracy)
            sums["disc/d_real"] += float(stats.d_real) if bool(y.any()) else 0.0
            sums["disc/d_fake"] += float(stats.d_fake) if bool((~y).any()) else 0.0
            n += 1
    return {k: v / max(n, 1) for k, v in sums.items()}


@torch.no_grad()
def average_rollout_policy(rollout_policy, generator, r: float) -> None:
    """β ← r·β + (1 − r)·θ after each g-step (SeqGAN code's ROLLOUT.update_params; the paper's G_β = G_θ is r = 0)."""
    for b, t in zip(rollout_policy.parameters(), generator.parameters()):
        b.mul_(r).add_(t, alpha=1.0 - r)


def _pad_cat(a: np.ndarray, b: np.ndarray, pad: int) -> np.ndarray:
    """Concatenate two (n, L) int arrays along rows, right-padding the narrower one."""
    width = max(a.shape[1], b.shape[1])
    out = np.full((len(a) + len(b), width), pad, dtype=np.int64)
    out[: len(a), : a.shape[1]] = a
    out[len(a) :, : b.shape[1]] = b
    return out


class Adversarial:
    """What the SeqGAN family shares: D gives the reward (no task reward), ``g_steps`` policy steps per iteration,
    then ``disc.d_steps`` d-steps."""

    adversarial = True
    needs_task_reward = False
    defaults = {"use_baseline": False}

    def policy_steps(self) -> int:
        return self.cfg.g_steps


# Tuan et al. Supplement C, PPO-dynamic with SeqGAN
SEQGAN_DYNAMIC_BOUNDS = {"alpha1": 10.0, "beta1": 0.5, "alpha2": 0.2, "beta2": 0.2}


# SeqGAN's returns are Q itself (Rollout.returns), so γ is not read; the baseline stays available (off by default)
SEQGAN_BASELINE_PARAMS = ("baseline_lr", "use_baseline", "normalize_advantages")


class SeqGAN(Adversarial, Reinforce):
    name = "seqgan"
    params = (*SEQGAN_BASELINE_PARAMS, *SEQGAN_PARAMS)
    monte_carlo = True
    scoring = "monte_carlo_q"


class SeqGANPPO(Adversarial, RolloutAlgo):
    name = "seqgan_ppo"
    off_policy_ratio = True
    params = (*SEQGAN_BASELINE_PARAMS, *SEQGAN_PARAMS, *PPO_PARAMS, *CLIP_PARAMS)
    monte_carlo = True
    scoring = "monte_carlo_q"

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        surrogate = partial(ppo_clip_loss, eps=self.cfg.eps)
        return ppo_update(self.cfg, state, rollout, surrogate, seed=minibatch_seed(self, iteration),
                          use_baseline=self.baseline_on)


class SeqGANPPODynamic(Adversarial, RolloutAlgo):
    name = "seqgan_ppo_dynamic"
    off_policy_ratio = True
    params = (*SEQGAN_BASELINE_PARAMS, *SEQGAN_PARAMS, *PPO_PARAMS, *DYNAMIC_PARAMS)
    defaults = {"use_baseline": False, **SEQGAN_DYNAMIC_BOUNDS}
    monte_carlo = True
    scoring = "monte_carlo_q"

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        surrogate, bounds = dynamic_surrogate(self.cfg)  # Supplement C's SeqGAN values unless given
        m = ppo_update(self.cfg, state, rollout, surrogate, seed=minibatch_seed(self, iteration),
                       use_baseline=self.baseline_on)
        return {**m, **bounds}
