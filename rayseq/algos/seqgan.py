"""SeqGAN (Yu et al. 2017, Algorithm 1 and Eq. 4-8) in one file, and its PPO / PPO-dynamic variants (Tuan et al.
2018, Table 1 lower block, Supplement C).

Algorithm 1 is :meth:`Adversarial.training_step` (one iteration) and :meth:`Adversarial.pretrain_step` (the
algorithm's own pretraining stage), written against the actor groups (:mod:`rayseq.algos.iteration`):

    pretrain G_θ by MLE; G_β ← G_θ                                  (stage ``mle``; then :meth:`Adversarial.start`)
    pretrain D on G_θ's samples against real data                   (its own stage: :meth:`Adversarial.d_step`)
    repeat:  for g-steps: sample Y ~ G_θ (rollout group), Q(Y_1:t−1, y_t) by Monte-Carlo search with G_β on the rollout
                          workers (:func:`mc_continuations`, :mod:`rayseq.rewards.mc_search`) scored by D on the
                          scorers (:func:`score_continuations`) (Eq. 4), update θ (Eq. 8) on the learner, where
                          :meth:`Adversarial.assign_scores` gives the rollout its Q;
                          β ← r·β + (1−r)·θ                         (:func:`average_rollout_policy`, after the update)
             for d-steps: fresh negatives from G_θ, train D k epochs (:meth:`Adversarial.d_step`, :func:`d_step`, Eq. 5)

The family's state is its own: D and its optimizer, D's version (the d-steps so far) and G_β live in the learner's
copy of the algorithm (:meth:`Adversarial.build_modules`, checkpointed with it); the rollout workers hold a G_β copy
and the scorers a D copy (:meth:`Adversarial.worker_modules`, :meth:`Adversarial.scorer_modules`). The ``disc:``
config section is the family's (:class:`DiscConfig`).

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

import copy
import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from pydantic import Field, model_validator

from rayseq.algos.common import BASELINE_FIELDS, LearnerState, RolloutAlgo, value_baseline
from rayseq.algos.parallel import DataParallel
from rayseq.algos.ppo import CLIP_FIELDS, PPO_FIELDS, clip_surrogate, minibatch_seed, ppo_update
from rayseq.algos.ppo_dynamic import DYNAMIC_FIELDS, dynamic_surrogate
from rayseq.algos.reinforce import Reinforce
from rayseq.config.base import Section
from rayseq.losses import discriminator_loss
from rayseq.models import make_discriminator, make_generator
from rayseq.rewards.mc_search import mc_search, q_values
from rayseq.types import PromptBatch, Rollout, RolloutRequest, to_torch


class DiscConfig(Section):
    """``disc:`` — SeqGAN's CNN discriminator (Yu et al. Sec. 4 and Appendix) and its training (Alg. 1): the SeqGAN
    family's config section (``Algorithm.sections``)."""

    emb_dim: int = Field(64, ge=1, description="Token embedding size of D.")
    filter_sizes: list[int] = Field(
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 20], min_length=1, description="Convolution window sizes (paper)."
    )
    num_filters: list[int] = Field(
        [100, 200, 200, 200, 200, 100, 100, 100, 100, 100, 160, 160], min_length=1,
        description="Feature maps per window size (paper).",
    )
    dropout: float = Field(0.25, ge=0.0, lt=1.0, description="Dropout before the output (code: keep 0.75).")
    l2_reg: float = Field(0.2, ge=0.0, description="L2 penalty on the output layer (SeqGAN code: 0.2).")
    lr: float = Field(1e-4, gt=0, description="Adam learning rate of D (SeqGAN code: 1e-4).")
    batch_size: int = Field(64, ge=1, description="D minibatch size.")
    pretrain_steps: int = Field(50, ge=0, description="D pretraining d-steps before adversarial training (paper: 50).")
    d_steps: int = Field(5, ge=0, description="d-steps per adversarial iteration (paper: 5).")
    epochs: int = Field(3, ge=1, description="k: epochs over each d-step's data (paper: 3).")
    num_negatives: int = Field(10000, ge=1, description="Fresh generated negatives (and as many positives) per d-step.")

    # what a resumed run may change (rayseq.config.resume), and which keys shape D's weights (train.init_from
    # takes a pretrained D only when they are equal: rayseq.checkpoint.init_from_differences)
    resumable: ClassVar[tuple[str, ...]] = ("lr",)
    weights_keys: ClassVar[tuple[str, ...]] = ("emb_dim", "filter_sizes", "num_filters")

    @model_validator(mode="after")
    def _check_filters(self) -> DiscConfig:
        if len(self.filter_sizes) != len(self.num_filters):
            raise ValueError(
                f"disc.filter_sizes has {len(self.filter_sizes)} entries "
                f"but disc.num_filters has {len(self.num_filters)}"
            )
        if min(self.filter_sizes) < 1 or min(self.num_filters) < 1:
            raise ValueError("disc.filter_sizes and disc.num_filters must be positive")
        return self


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
    """What the SeqGAN family shares: its state (D, D's optimizer and version, G_β), Algorithm 1's iteration
    (``g_steps`` policy steps rewarded by D, then ``disc.d_steps`` d-steps), D pretraining, and G_β's moving average
    after each update. ``score`` says how a sampled rollout gets D's reward (Monte-Carlo Q here; D(Y) and a critic in
    SeqGAN-critic), ``policy_update`` the generator's step."""

    sections = {"disc": DiscConfig}
    own_reward = True
    needs_task_reward = False
    defaults = {"use_baseline": False}
    pretrain_label = "D pretraining"
    progress_metrics = {"rollout/reward_mean": "reward", "disc/accuracy": "d_acc"}
    disc_version = 0  # d-steps so far: the version of D the scorers hold (set on the learner's copy)
    _beta_ready = False  # G_β is published once training starts (start)

    # -- its state: D and its optimizer on the learner, G_β (with a rollout_update_rate); copies on the actors ------
    def build_modules(self, run_cfg, generator, task, device) -> dict:
        """D and its Adam (``disc.lr``); G_β when it differs from G_θ (``algo.rollout_update_rate`` > 0)."""
        disc = make_discriminator(run_cfg, task).to(device)
        modules = {"disc": disc, "disc_opt": torch.optim.Adam(disc.parameters(), lr=run_cfg.disc.lr)}
        if self.uses_rollout_policy(run_cfg):
            modules["rollout_policy"] = copy.deepcopy(generator).eval()  # G_β ← G_θ again when training starts
        self.disc_cfg, self.pad_id = run_cfg.disc, task.specials.pad  # what its d-steps read
        return modules

    @classmethod
    def uses_rollout_policy(cls, run_cfg) -> bool:
        """Monte-Carlo search with a G_β of its own (``algo.rollout_update_rate`` > 0; 0: G_β is G_θ)."""
        return getattr(run_cfg.algo, "rollout_update_rate", 0) > 0

    @classmethod
    def worker_modules(cls, run_cfg, task, device) -> dict:
        """The rollout workers' G_β (built at start, not on the first weights, so that in-process runs draw the same
        global random numbers before and after a resume)."""
        if not cls.uses_rollout_policy(run_cfg):
            return {}
        return {"rollout_policy": make_generator(run_cfg, task).to(device).eval()}

    @classmethod
    def scorer_modules(cls, run_cfg, task, device) -> dict:
        """The scorers' copy of D."""
        return {"disc": make_discriminator(run_cfg, task).to(device).eval()}

    def worker_weights(self) -> dict:
        beta = self.modules.get("rollout_policy")
        return {"rollout_policy": _cpu(beta)} if beta is not None and self._beta_ready else {}

    def scorer_weights(self) -> tuple[int, dict]:
        return self.disc_version, {"disc": _cpu(self.modules["disc"])}

    def config_lrs(self, run_cfg) -> dict:
        return {**super().config_lrs(run_cfg), "disc_opt": run_cfg.disc.lr}

    def start(self, state: LearnerState) -> None:
        """G_β ← G_θ: the rollout policy starts as the pretrained generator."""
        beta = self.modules.get("rollout_policy")
        if beta is not None:
            beta.load_state_dict(state.generator.state_dict())
            self._beta_ready = True

    def own_state_dict(self) -> dict:
        return {"disc_version": self.disc_version}

    def load_own_state_dict(self, state: dict) -> None:
        self.disc_version = int(state.get("disc_version", self.disc_version))

    def init_from(self, state: dict) -> dict:
        """A pretrained D, when the run started from has one (its G_β is not taken: training starts from G_θ)."""
        if "disc" in state:
            self.modules["disc"].load_state_dict(state["disc"])
            self.disc_version = int(state.get("disc_version", 0))
        return {"discriminator": "disc" in state}

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.rollout.num_workers > 0 and cfg.scorer.num_scorers == 0:
            raise ValueError("scorer.num_scorers=0: SeqGAN scores Monte-Carlo continuations on scorer actors; "
                             "set scorer.num_scorers >= 1 (or rollout.num_workers=0 to run in-process)")
        if cfg.model.arch == "hf":
            raise ValueError(f"algo.name={cfg.algo.name}: the SeqGAN family is not supported with "
                             "model.arch=hf (its discriminator and Monte-Carlo search need rayseq's vocabulary "
                             "and the RNN's states); use a rollout algorithm, e.g. ppo_dynamic or grpo")
        n = cfg.learner.num_learners
        if n > 1:  # each rank takes its rows of every d-step minibatch
            rows = 2 * cfg.disc.num_negatives
            sizes = {"disc.batch_size": min(cfg.disc.batch_size, rows)}
            if rows % cfg.disc.batch_size:
                sizes["2 * disc.num_negatives mod disc.batch_size"] = rows % cfg.disc.batch_size
            for key, size in sizes.items():
                if size < n:
                    raise ValueError(f"learner.num_learners={n}: {key}={size} rows cannot give each learner one; use "
                                     f"at least {n}")

    # -- Algorithm 1 ------------------------------------------------------------------------------
    def training_step(self, groups, step) -> dict:
        """One iteration of Algorithm 1: g-steps, then d-steps."""
        metrics: dict = {}
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
            metrics.update(groups.learner.update(shards, step.stage_iter, scores))  # θ by Eq. 8; β ← r·β + (1−r)·θ
            t4 = time.perf_counter()
            metrics.update(timing)
            metrics.update({"time/sync_s": t1 - t0, "time/rollout_s": t2 - t1, "time/learn_s": t4 - t3,
                      "time/mc_total_s": t3 - t2})
        t5 = time.perf_counter()
        for _ in range(self.discriminator_steps(step.stage_iter, step.cfg.disc.d_steps)):
            metrics.update(self.d_step(groups, step))
        metrics["time/disc_s"] = time.perf_counter() - t5
        return metrics

    def score(self, groups, shards: list, seed: int, step) -> tuple[list, dict]:
        """Q(Y_1:t−1, y_t) of every sampled token (Eq. 4): ``algo.mc_rollouts`` continuations of each prefix by G_β
        on the rollout workers, scored by D on the scorers; the per-shard Q handles (the learner's
        :meth:`assign_scores` takes them) and timings."""
        groups.scorer.sync_weights()
        pending = groups.rollout.run_on_shards(mc_continuations, shards, self.cfg.mc_rollouts,
                                               step.cfg.rollout.temperature, seed=seed)
        parts, infos = groups.scorer.run_on_pending(score_continuations, pending)
        return parts, {"time/mc_s": max(i["mc_s"] for i in infos), "time/score_s": max(i["score_s"] for i in infos)}

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
        metrics = self.policy_update(state, rollout, iteration)
        beta = self.modules.get("rollout_policy")
        if beta is not None:
            average_rollout_policy(beta, state.generator, self.cfg.rollout_update_rate)
        return metrics

    def aux_update(self, state: LearnerState, positives: PromptBatch, negatives: Rollout, seed: int) -> dict:
        """One d-step on the learner (:func:`d_step`); D's version advances (the scorers load it when they score)."""
        out = d_step(self.modules["disc"], self.modules["disc_opt"], positives, negatives, self.disc_cfg,
                     self.pad_id, state.device, seed, state.dp)
        self.disc_version += 1
        out["disc/version"] = float(self.disc_version)
        return out

    def discriminator_steps(self, iteration: int, d_steps: int) -> int:
        """d-steps after the g-steps of ``iteration`` (``disc.d_steps``)."""
        return d_steps

    @classmethod
    def pretrain_steps(cls, cfg) -> int:
        """D pretraining: ``disc.pretrain_steps`` d-steps on the pretrained G_θ's samples."""
        return cfg.disc.pretrain_steps

    def pretrain_step(self, groups, step) -> dict:
        return self.d_step(groups, step)

    def d_step(self, groups, step) -> dict:
        """One d-step: ``disc.num_negatives`` fresh negatives from G_θ (on the rollout workers) and as many real
        examples, ``disc.epochs`` epochs on the learner (:meth:`aux_update`, :func:`d_step`)."""
        t0 = time.perf_counter()
        n = step.cfg.disc.num_negatives
        groups.rollout.sync_weights()
        seed = step.seed(step.iteration)
        request = RolloutRequest(max_len=step.task.max_tgt_len, temperature=1.0, seed=seed ^ 0x5EED)
        negatives = groups.rollout.sample(step.task.sample_prompts(step.rng, n), request)
        positives = step.task.sample_prompts(step.rng, n, with_targets=True)
        t1 = time.perf_counter()
        metrics = groups.learner.aux_update(positives, negatives, seed)
        metrics.update({"time/negatives_s": t1 - t0, "time/disc_s": time.perf_counter() - t0})
        return metrics


def _cpu(module) -> dict:
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


# -- what Algorithm 1 runs on the actors: Monte-Carlo continuations on a rollout worker, Q from D on a scorer ---------
@dataclass
class MCBatch:
    """Monte-Carlo continuations of a shard of rollouts (SeqGAN Eq. 4), from a worker to a scorer."""

    src: np.ndarray  # (B, S) int64 inputs (conditional tasks; (B, 0) otherwise)
    src_len: np.ndarray  # (B,) int64
    tokens: np.ndarray  # (B, T) int64 the sampled sequences Y_1:T
    lengths: np.ndarray  # (B,) int64 their lengths
    cont: np.ndarray  # (B, T−1, N, T) int32 prefix Y_1:t + G_β's continuation, pad after the end
    cont_len: np.ndarray  # (B, T−1, N) int64
    info: dict = field(default_factory=dict)  # worker id, timings


def mc_continuations(worker, rollout: Rollout, n_rollouts: int, temperature: float, *, seed: int) -> tuple:
    """On a rollout worker: SeqGAN Eq. 4's continuations of every prefix of the shard ``rollout`` by G_β (the
    generator while the worker holds no G_β of its own: ``algo.rollout_update_rate=0``), batched from cached states
    (:func:`rayseq.rewards.mc_search.mc_search`). Returns (:class:`MCBatch`, info: worker, ``mc_s``)."""
    t0 = time.perf_counter()
    dev = worker.device
    policy = worker.modules.get("rollout_policy", worker.generator)
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    tokens, mask = to_torch(rollout.tokens, dev), to_torch(rollout.token_mask, dev)
    c = mc_search(policy, to_torch(rollout.src, dev), to_torch(rollout.src_len, dev), tokens, mask, n_rollouts,
                  temperature=temperature, generator=gen)
    info = {"worker": worker.index, "mc_s": time.perf_counter() - t0}
    batch = MCBatch(src=rollout.src, src_len=rollout.src_len, tokens=rollout.tokens,
                    lengths=(rollout.token_mask > 0).sum(1).astype(np.int64),
                    cont=c.tokens.cpu().numpy().astype(np.int32), cont_len=c.lengths.cpu().numpy(), info=info)
    return batch, dict(info)


def score_continuations(scorer, batch: MCBatch) -> tuple:
    """On a scorer: Q (B, T) float32 by SeqGAN Eq. 4 for the batch's sequences, and timings (``score_s``). The
    continuations of prefix t share its windows: D convolves them once per sequence
    (:meth:`rayseq.models.discriminator.CNNDiscriminator.score_shared_prefix`)."""
    t0 = time.perf_counter()
    dev, disc = scorer.device, scorer.modules["disc"]
    B, Tm1, N, T = batch.cont.shape
    conditional = batch.src.shape[1] > 0
    src = to_torch(batch.src, dev) if conditional else None
    src_len = to_torch(batch.src_len, dev) if conditional else None
    tokens, lengths = to_torch(batch.tokens, dev), to_torch(batch.lengths, dev)
    cont = to_torch(batch.cont.astype(np.int64), dev)
    bs = scorer.cfg.scorer.batch_size
    d_cont = disc.score_shared_prefix(tokens, lengths, cont, to_torch(batch.cont_len, dev),
                                      torch.arange(1, T, device=dev), src, src_len, batch_size=bs)
    d_full = disc.score(tokens, lengths, src, src_len, batch_size=bs)
    q = q_values(d_cont, d_full, lengths)
    return q.cpu().numpy().astype(np.float32), {"score_s": time.perf_counter() - t0, "scored": B * Tm1 * N,
                                                "mc_s": batch.info["mc_s"]}


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


def with_value_baseline(algo, run_cfg, generator, task, device) -> dict:
    """The modules of SeqGAN with a policy update that trains the value baseline whether or not
    ``algo.use_baseline`` subtracts it (REINFORCE's, PPO's): b(s_t) and its Adam, then D, its Adam and G_β."""
    return {**value_baseline(run_cfg, generator, device),
            **Adversarial.build_modules(algo, run_cfg, generator, task, device)}


class SeqGAN(Adversarial, Reinforce):
    name = "seqgan"
    data_parallel = False  # its REINFORCE step could run on several learners; its whole iteration is not tested there
    fields = {**SEQGAN_BASELINE_FIELDS, **SEQGAN_FIELDS}
    build_modules = with_value_baseline
    policy_update = Reinforce.update  # one gradient step on Eq. 8


class SeqGANPPO(Adversarial, RolloutAlgo):
    name = "seqgan_ppo"
    data_parallel = True
    off_policy_ratio = True
    fields = {**SEQGAN_BASELINE_FIELDS, **SEQGAN_FIELDS, **PPO_FIELDS, **CLIP_FIELDS}
    build_modules = with_value_baseline

    def policy_update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        return ppo_update(self.cfg, state, rollout, clip_surrogate(self.cfg), seed=minibatch_seed(self, iteration),
                          modules=self.modules, use_baseline=self.baseline_on)


class SeqGANPPODynamic(Adversarial, RolloutAlgo):
    name = "seqgan_ppo_dynamic"
    data_parallel = True
    off_policy_ratio = True
    fields = {**SEQGAN_BASELINE_FIELDS, **SEQGAN_FIELDS, **PPO_FIELDS, **DYNAMIC_FIELDS}
    defaults = {"use_baseline": False, **SEQGAN_DYNAMIC_BOUNDS}
    build_modules = with_value_baseline

    def policy_update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        surrogate, bounds = dynamic_surrogate(self.cfg)  # Supplement C's SeqGAN values unless given
        m = ppo_update(self.cfg, state, rollout, surrogate, seed=minibatch_seed(self, iteration),
                       modules=self.modules, use_baseline=self.baseline_on)
        return {**m, **bounds}
