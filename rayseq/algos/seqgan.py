"""SeqGAN (Yu et al. 2017, Algorithm 1 and Eq. 4-8) in one file, and its PPO / PPO-dynamic variants (Tuan et al.
2018, Table 1 lower block, Supplement C).

Algorithm 1 is :meth:`Adversarial.training_step` (one iteration) and :meth:`Adversarial.pretrain_step` (stage
``disc``), written against the actor groups (:mod:`rayseq.algos.iteration`):

    pretrain G_θ by MLE; G_β ← G_θ                                  (the driver's ``mle`` stage; the learner copies G_β)
    pretrain D on G_θ's samples against real data                   (stage ``disc``: :meth:`Adversarial.d_step`)
    repeat:  for g-steps: sample Y ~ G_θ (rollout group), Q(Y_1:t−1, y_t) by Monte-Carlo search with G_β (rollout
                          group, :mod:`rayseq.rewards.mc_search`) scored by D (scorer group) (Eq. 4), update θ (Eq. 8)
                          on the learner, where :meth:`Adversarial.assign_scores` gives the rollout its Q;
                          β ← r·β + (1−r)·θ                         (:func:`average_rollout_policy`, after the update)
             for d-steps: fresh negatives from G_θ, train D k epochs (:meth:`Adversarial.d_step`, :func:`d_step`, Eq. 5)

The reward of token y_t is Q(Y_1:t−1, y_t), delivered as ``Rollout.returns``; the generator follows the policy
gradient

    ∇J(θ) ≈ Σ_t Q(Y_1:t−1, y_t) ∇_θ log G_θ(y_t | Y_1:t−1)                  (SeqGAN Eq. 8)

with no baseline, as SeqGAN's code (``algo.use_baseline=true`` subtracts the learned one):

- ``seqgan``: one gradient step on that objective (:func:`rayseq.losses.reinforce_loss`),
- ``seqgan_ppo``: PPO's clipped surrogate (Tuan et al. Eq. 3, ε = 0.2),
- ``seqgan_ppo_dynamic``: PPO-dynamic (Eq. 4) with Supplement C's SeqGAN setting α1 = 10, β1 = 0.5,
  α2 = β2 = 0.2: the algorithm's ``defaults``, resolved into the run's config (what config.yaml shows is
  what the loss receives); ``algo.alpha1=...`` etc. change them.
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np
import torch
from pydantic import Field

from rayseq.algos.common import BASELINE_FIELDS, LearnerState, RolloutAlgo
from rayseq.algos.iteration import counted
from rayseq.algos.parallel import DataParallel
from rayseq.algos.ppo import CLIP_FIELDS, PPO_FIELDS, minibatch_seed, ppo_update
from rayseq.algos.ppo_dynamic import DYNAMIC_FIELDS, dynamic_surrogate
from rayseq.algos.reinforce import Reinforce
from rayseq.losses import discriminator_loss, ppo_clip_loss
from rayseq.types import PromptBatch, Rollout, RolloutRequest, to_torch


# -- Algorithm 1's discriminator and rollout-policy steps (run by the learner) ------------------------------------
def d_step(disc, opt, positives: PromptBatch, negatives: Rollout, dcfg, pad_id: int, device, seed: int,
           dp: DataParallel | None = None) -> dict:
    """One d-step (Algorithm 1): ``dcfg.epochs`` epochs of minibatch BCE (Eq. 5) over the real (input, target)
    pairs and the freshly generated negatives, shuffled together with a generator seeded by ``seed``; L2 on D's
    output layer (``dcfg.l2_reg``, SeqGAN's code). Returns the epoch-mean loss, accuracy, D(real), D(fake).

    ``dp``: this learner rank's rows of each minibatch, its loss scaled by its share of the minibatch's examples
    (the L2 term, the same on every rank, sums back to itself: the shares sum to 1) and the gradients summed over
    the ranks (:mod:`rayseq.algos.parallel`)."""
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
            w = w_real = w_fake = 1.0  # a rank's shares of the minibatch's examples, real ones, generated ones
            if dp is not None:
                whole, idx = labels[idx], dp.part(idx)
            logits = disc(tokens[idx], lengths[idx], src[idx] if conditional else None,
                          src_len[idx] if conditional else None)
            y = labels[idx]
            loss, stats = discriminator_loss(logits[y], logits[~y], dcfg.l2_reg, disc.out.parameters())
            if dp is not None:
                w = len(idx) / len(whole)
                w_real, w_fake = dp.share(y, whole) if y.any() else 0.0, dp.share(~y, ~whole) if (~y).any() else 0.0
                loss = loss * w
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if dp is not None:
                dp.all_reduce_grads(disc.parameters())
            opt.step()
            sums["disc/loss"] += loss.item()
            sums["disc/accuracy"] += float(stats.accuracy) * w
            sums["disc/d_real"] += float(stats.d_real) * w_real if bool(y.any()) else 0.0
            sums["disc/d_fake"] += float(stats.d_fake) * w_fake if bool((~y).any()) else 0.0
            n += 1
    if dp is not None:
        sums = dp.reduce(sums)
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


def concat_columns(parts: list[np.ndarray], width: int) -> np.ndarray:
    """(B_i, T_i) arrays -> (ΣB_i, max(width, T_i)), each right-padded with 0 (per-shard Q of shards sampled to
    different lengths)."""
    width = max(width, *(p.shape[1] for p in parts))
    return np.concatenate([p if p.shape[1] == width else np.pad(p, ((0, 0), (0, width - p.shape[1])))
                           for p in parts])


class Adversarial:
    """What the SeqGAN family shares: Algorithm 1's iteration (``g_steps`` policy steps rewarded by D, then
    ``disc.d_steps`` d-steps), D pretraining, and G_β's moving average after each update. ``score`` says how a
    sampled rollout gets D's reward (Monte-Carlo Q here; D(Y) and a critic in SeqGAN-critic), ``policy_update`` the
    generator's step."""

    adversarial = True
    needs_task_reward = False
    defaults = {"use_baseline": False}

    def training_step(self, groups, step) -> dict:
        """One iteration of Algorithm 1: g-steps, then d-steps."""

        def iteration() -> dict:
            m: dict = {}
            g_steps = self.cfg.g_steps
            for g in range(g_steps):
                t0 = time.perf_counter()
                groups.rollout.sync_weights()  # G_θ (and G_β) to the rollout workers
                t1 = time.perf_counter()
                seed = step.seed(step.iteration * g_steps + g)
                shards = groups.rollout.sample(step.prompts(self), step.request(self, seed))  # Y ~ G_θ
                t2 = time.perf_counter()
                scores, timing = self.score(groups, shards, seed, step)  # Q(Y_1:t−1, y_t), Eq. 4
                t3 = time.perf_counter()
                m.update(groups.learner.update(shards, step.stage_iter, scores))  # θ by Eq. 8; β ← r·β + (1−r)·θ
                t4 = time.perf_counter()
                m.update(timing)
                m.update({"time/sync_s": t1 - t0, "time/rollout_s": t2 - t1, "time/learn_s": t4 - t3,
                          "time/mc_total_s": t3 - t2})
            t5 = time.perf_counter()
            for _ in range(self.discriminator_steps(step.stage_iter, step.cfg.disc.d_steps)):
                m.update(self.d_step(groups, step))
            m["time/disc_s"] = time.perf_counter() - t5
            return m

        return counted(groups, iteration)

    def score(self, groups, shards: list, seed: int, step) -> tuple[list, dict]:
        """Q(Y_1:t−1, y_t) of every sampled token (Eq. 4): ``algo.mc_rollouts`` continuations of each prefix by G_β
        on the rollout workers, scored by D on the scorers; the per-shard Q handles (the learner's
        :meth:`assign_scores` takes them) and timings."""
        groups.scorer.sync_disc()
        pending = groups.rollout.mc_search(shards, self.cfg.mc_rollouts, step.cfg.rollout.temperature, seed)
        parts, info = groups.scorer.score_mc(pending)
        return parts, {"time/mc_s": info["mc_s"], "time/score_s": info["score_s"]}

    def assign_scores(self, rollout: Rollout, parts: list) -> dict:
        """On the learner: Q as ``Rollout.returns``, D(Y) of the sampled sequence (Q at its last token) as its
        ``score``; metrics, with what Q cost beyond sampling Y (continuation steps of every prefix, D evaluations)."""
        T = rollout.tokens.shape[1]
        lengths = (rollout.token_mask > 0).sum(1)
        q = concat_columns(parts, T)
        rollout.returns = q[:, :T]
        rollout.score = q[np.arange(len(q)), np.maximum(lengths - 1, 0)]
        n = self.cfg.mc_rollouts
        return {"rollout/tokens": float(lengths.sum()),
                "rollout/q_mean": float((q[:, :T] * rollout.token_mask).sum() / max(rollout.token_mask.sum(), 1)),
                "rollout/extra_gen_steps": float(n * int((lengths * (lengths - 1) // 2).sum())),
                "rollout/d_evals": float(n * int(np.maximum(lengths - 1, 0).sum()) + len(lengths))}

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        """The generator's step (:meth:`policy_update`), then β ← r·β + (1−r)·θ (``algo.rollout_update_rate``)."""
        m = self.policy_update(state, rollout, iteration)
        if state.rollout_policy is not None:
            average_rollout_policy(state.rollout_policy, state.generator, self.cfg.rollout_update_rate)
        return m

    def discriminator_steps(self, iteration: int, d_steps: int) -> int:
        """d-steps after the g-steps of ``iteration`` (``disc.d_steps``)."""
        return d_steps

    @classmethod
    def pretrain_steps(cls, cfg) -> int:
        """Stage ``disc``: ``disc.pretrain_steps`` d-steps on the pretrained G_θ's samples."""
        return cfg.disc.pretrain_steps

    def pretrain_step(self, groups, step) -> dict:
        return self.d_step(groups, step)

    def d_step(self, groups, step) -> dict:
        """One d-step: ``disc.num_negatives`` fresh negatives from G_θ (on the rollout workers) and as many real
        examples, ``disc.epochs`` epochs on the learner (:func:`d_step`)."""
        t0 = time.perf_counter()
        n = step.cfg.disc.num_negatives
        groups.rollout.sync_weights()
        seed = step.seed(step.iteration)
        request = RolloutRequest(max_len=step.task.max_tgt_len, temperature=1.0, seed=seed ^ 0x5EED)
        negatives = groups.rollout.sample(step.task.sample_prompts(step.rng, n), request)
        positives = step.task.sample_prompts(step.rng, n, with_targets=True)
        t1 = time.perf_counter()
        m = groups.learner.train_discriminator(positives, negatives, seed)
        m.update({"time/negatives_s": t1 - t0, "time/disc_s": time.perf_counter() - t0})
        return m


# Tuan et al. Supplement C, PPO-dynamic with SeqGAN
SEQGAN_DYNAMIC_BOUNDS = {"alpha1": 10.0, "beta1": 0.5, "alpha2": 0.2, "beta2": 0.2}


# Monte-Carlo Q (SeqGAN Eq. 4) with the rollout policy G_β, and Algorithm 1's g-steps
SEQGAN_FIELDS = {
    "mc_rollouts": (int, Field(16, ge=1, description="SeqGAN: N Monte-Carlo continuations per prefix (Eq. 4).")),
    "rollout_update_rate": (float, Field(
        0.8, ge=0.0, lt=1.0,
        description="SeqGAN: r in β ← r·β + (1−r)·θ for the rollout policy G_β (code: 0.8; 0 = G_β is G_θ).")),
    "g_steps": (int, Field(1, ge=1, description="SeqGAN: generator updates per adversarial iteration (paper: 1).")),
}
# SeqGAN's returns are Q itself (Rollout.returns), so γ is not read; the baseline stays available (off by default)
SEQGAN_BASELINE_FIELDS = {k: v for k, v in BASELINE_FIELDS.items() if k != "gamma"}


class SeqGAN(Adversarial, Reinforce):
    name = "seqgan"
    fields = {**SEQGAN_BASELINE_FIELDS, **SEQGAN_FIELDS}
    monte_carlo = True
    scoring = "monte_carlo_q"
    policy_update = Reinforce.update  # one gradient step on Eq. 8


class SeqGANPPO(Adversarial, RolloutAlgo):
    name = "seqgan_ppo"
    data_parallel = True
    off_policy_ratio = True
    fields = {**SEQGAN_BASELINE_FIELDS, **SEQGAN_FIELDS, **PPO_FIELDS, **CLIP_FIELDS}
    monte_carlo = True
    scoring = "monte_carlo_q"

    def policy_update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        surrogate = partial(ppo_clip_loss, eps=self.cfg.eps, eps_high=self.cfg.eps_high)
        return ppo_update(self.cfg, state, rollout, surrogate, seed=minibatch_seed(self, iteration),
                          use_baseline=self.baseline_on)


class SeqGANPPODynamic(Adversarial, RolloutAlgo):
    name = "seqgan_ppo_dynamic"
    data_parallel = True
    off_policy_ratio = True
    fields = {**SEQGAN_BASELINE_FIELDS, **SEQGAN_FIELDS, **PPO_FIELDS, **DYNAMIC_FIELDS}
    defaults = {"use_baseline": False, **SEQGAN_DYNAMIC_BOUNDS}
    monte_carlo = True
    scoring = "monte_carlo_q"

    def policy_update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        surrogate, bounds = dynamic_surrogate(self.cfg)  # Supplement C's SeqGAN values unless given
        m = ppo_update(self.cfg, state, rollout, surrogate, seed=minibatch_seed(self, iteration),
                       use_baseline=self.baseline_on)
        return {**m, **bounds}
