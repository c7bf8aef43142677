"""Learner: holds the generator, the value baseline, (SeqGAN) the discriminator and the rollout policy
G_β, and their optimizers; applies the algorithm and the discriminator's d-steps."""

from __future__ import annotations

import copy
import random

import numpy as np
import torch

from rayseq.algos import MLE, LearnerState, make_algo
from rayseq.config import RunConfig
from rayseq.losses.discriminator import discriminator_loss
from rayseq.models import Critic, ValueBaseline
from rayseq.models.discriminator import build_discriminator
from rayseq.models.generator import build_generator
from rayseq.tasks import make_task
from rayseq.types import PromptBatch, Rollout, to_torch


def make_generator(cfg: RunConfig, task):
    """The task's generator (conditional or not, banned ids) from the model config."""
    return build_generator(len(task.vocab), cfg.model, task.specials, conditional=getattr(task, "conditional", True),
                           banned_ids=getattr(task, "banned_ids", ()))


def make_discriminator(cfg: RunConfig, task):
    d = cfg.disc
    return build_discriminator(len(task.vocab), d.emb_dim, d.filter_sizes, d.num_filters, d.dropout,
                               pad_id=task.specials.pad, sep_id=task.specials.bos)


class Learner:
    def __init__(self, cfg: dict):
        self.cfg = RunConfig.model_validate(cfg)
        c = self.cfg
        torch.set_num_threads(c.learner.torch_threads)
        torch.manual_seed(c.seed)
        random.seed(c.seed)
        np.random.seed(c.seed % 2**32)  # noqa: NPY002 -- seeds third-party code that uses the legacy RNG
        use_cuda = c.learner.device == "cuda" or (c.learner.device == "auto" and c.learner.num_gpus > 0)
        if use_cuda and not torch.cuda.is_available():  # never a silent CPU fallback
            raise RuntimeError(f"learner.device={c.learner.device} with learner.num_gpus={c.learner.num_gpus}, but "
                               "no CUDA device is visible to the learner; use learner.device=cpu")
        self.device = torch.device("cuda" if use_cuda else "cpu")
        self.task = make_task(c.task, c.reward)
        generator = make_generator(c, self.task).to(self.device)
        baseline = ValueBaseline(c.model.hidden_dim).to(self.device)
        self.state = LearnerState(
            generator=generator,
            baseline=baseline,
            gen_opt=torch.optim.Adam(generator.parameters(), lr=c.train.pretrain_lr),
            base_opt=torch.optim.Adam(baseline.parameters(), lr=c.algo.baseline_lr),
            device=self.device,
        )
        if c.algorithm.uses_critic:
            self.state.critic = Critic(c.model.hidden_dim, c.algo.critic_hidden).to(self.device)
            self.state.critic_opt = torch.optim.Adam(self.state.critic.parameters(), lr=c.algo.critic_lr)
        self.stage = "mle"
        self.algo = MLE(c.algo, c.seed)
        self.version = 0
        self.disc = self.disc_opt = self.rollout_policy = None
        self.disc_version = 0
        if c.is_gan:
            self.disc = make_discriminator(c, self.task).to(self.device)
            self.disc_opt = torch.optim.Adam(self.disc.parameters(), lr=c.disc.lr)

    def placement(self) -> dict:
        """Where the learner runs: pid, device, placement group id (diagnostics)."""
        import os

        from rayseq.distributed.worker import placement_group_id

        return {"pid": os.getpid(), "device": str(self.device), "placement_group": placement_group_id()}

    def start_stage(self, stage: str) -> None:
        """``mle`` (pretraining), ``disc`` (SeqGAN: discriminator pretraining, G unchanged) or ``train``
        (the configured algorithm, with a fresh Adam at algo.lr; SeqGAN's rollout policy G_β = G_θ)."""
        if stage == self.stage:
            return
        if stage not in ("disc", "train"):
            raise ValueError(f"unknown stage {stage!r}")
        self.stage = stage
        if stage == "train":
            self.algo = make_algo(self.cfg.algo, self.cfg.seed)
            self.state.gen_opt = torch.optim.Adam(self.state.generator.parameters(), lr=self.cfg.algo.lr)
            if self.cfg.uses_mc and self.cfg.algo.rollout_update_rate > 0:
                self.rollout_policy = copy.deepcopy(self.state.generator).eval()

    def get_weights(self) -> dict:
        """Generator (and SeqGAN's rollout policy G_β) state dicts on CPU, published once per version."""

        def cpu(m):
            return None if m is None else {k: v.detach().cpu() for k, v in m.state_dict().items()}

        return {"generator": cpu(self.state.generator), "rollout_policy": cpu(self.rollout_policy)}

    def get_version(self) -> int:
        """Generator updates so far (the weights version the rollouts of the next update are tagged with)."""
        return self.version

    def get_disc_version(self) -> int:
        return self.disc_version

    def get_disc_weights(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.disc.state_dict().items()}

    def rollout_request(self, iteration: int, max_len: int, temperature: float, seed: int):
        """The algorithm's request built from the learner's copy (algorithms whose requests carry state)."""
        return self.algo.rollout_request(iteration, max_len, temperature, seed)

    def validate(self) -> dict:
        """Validation-set reward handed to the algorithm (interpolation: keep or undo, anneal λ)."""
        reward = self.task.validation_reward(self.state.generator, self.device)
        return self.algo.on_validation(self.state, reward)

    def update(self, batch, iteration: int) -> dict:
        self.state.generator.train()
        metrics = self.algo.update(self.state, batch, iteration)
        if self.algo.kind == "rollout":
            metrics["rollout/staleness"] = float(self.version - batch.version)
        if self.rollout_policy is not None and getattr(self.algo, "adversarial", False):
            self._update_rollout_policy()
        self.version += 1
        metrics["learner/version"] = float(self.version)
        return metrics

    @torch.no_grad()
    def _update_rollout_policy(self) -> None:
        """β ← r·β + (1 − r)·θ (SeqGAN code's ROLLOUT.update_params; the paper's G_β = G_θ is r = 0)."""
        r = self.cfg.algo.rollout_update_rate
        for b, t in zip(self.rollout_policy.parameters(), self.state.generator.parameters()):
            b.mul_(r).add_(t, alpha=1.0 - r)

    def train_discriminator(self, positives: PromptBatch, negatives: Rollout, seed: int) -> dict:
        """One d-step (SeqGAN Alg. 1): ``disc.epochs`` epochs of minibatch BCE (Eq. 5) over the real
        (input, target) pairs and the freshly generated negatives, shuffled together."""
        c, d = self.cfg.disc, self.device
        self.disc.train()
        neg_len = (negatives.token_mask > 0).sum(1)
        tokens = _pad_cat(positives.tgt, negatives.tokens, self.task.specials.pad)
        lengths = np.concatenate([positives.tgt_len, neg_len])
        src = _pad_cat(positives.src, negatives.src, self.task.specials.pad)
        src_len = np.concatenate([positives.src_len, negatives.src_len])
        labels = np.concatenate([np.ones(len(positives)), np.zeros(len(negatives))]).astype(bool)
        tokens, lengths, src, src_len = (to_torch(a, d) for a in (tokens, lengths, src, src_len))
        conditional = src.shape[1] > 0
        labels = torch.from_numpy(labels).to(d)
        perm_rng = torch.Generator().manual_seed(int(seed))
        sums = {"disc/loss": 0.0, "disc/accuracy": 0.0, "disc/d_real": 0.0, "disc/d_fake": 0.0}
        n = 0
        for _ in range(c.epochs):
            perm = torch.randperm(len(labels), generator=perm_rng).to(d)
            for a in range(0, len(perm), c.batch_size):
                idx = perm[a : a + c.batch_size]
                logits = self.disc(tokens[idx], lengths[idx], src[idx] if conditional else None,
                                   src_len[idx] if conditional else None)
                y = labels[idx]
                loss, stats = discriminator_loss(logits[y], logits[~y], c.l2_reg, self.disc.out.parameters())
                self.disc_opt.zero_grad(set_to_none=True)
                loss.backward()
                self.disc_opt.step()
                sums["disc/loss"] += loss.item()
                sums["disc/accuracy"] += float(stats.accuracy)
                sums["disc/d_real"] += float(stats.d_real) if bool(y.any()) else 0.0
                sums["disc/d_fake"] += float(stats.d_fake) if bool((~y).any()) else 0.0
                n += 1
        self.disc_version += 1
        out = {k: v / max(n, 1) for k, v in sums.items()}
        out["disc/version"] = float(self.disc_version)
        return out

    def evaluate(self, split: str = "val") -> tuple[dict, dict]:
        """The task's ``val/*`` (during training: what selects) or ``test/*`` (once, reported) metrics."""
        return self.task.evaluate(self.state.generator, self.device, split=split)

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        s = self.state
        out = {
            "generator": s.generator.state_dict(),
            "baseline": s.baseline.state_dict(),
            "gen_opt": s.gen_opt.state_dict(),
            "base_opt": s.base_opt.state_dict(),
            "stage": self.stage,
            "version": self.version,
            "torch_rng": torch.get_rng_state(),
        }
        if self.device.type == "cuda":  # dropout and anything else drawn on the GPU
            out["cuda_rng"] = torch.cuda.get_rng_state_all()
        if self.disc is not None:
            out |= {"disc": self.disc.state_dict(), "disc_opt": self.disc_opt.state_dict(),
                    "disc_version": self.disc_version}
        if self.rollout_policy is not None:
            out["rollout_policy"] = self.rollout_policy.state_dict()
        if s.critic is not None:
            out |= {"critic": s.critic.state_dict(), "critic_opt": s.critic_opt.state_dict()}
        if hasattr(self.algo, "state_dict"):
            out["algo"] = self.algo.state_dict()
        return out

    def load_state_dict(self, d: dict) -> None:
        s = self.state
        s.generator.load_state_dict(d["generator"])
        s.baseline.load_state_dict(d["baseline"])
        self.start_stage(d["stage"])
        s.gen_opt.load_state_dict(d["gen_opt"])
        s.base_opt.load_state_dict(d["base_opt"])
        self.version = int(d["version"])
        torch.set_rng_state(d["torch_rng"])
        if self.device.type == "cuda" and "cuda_rng" in d:
            torch.cuda.set_rng_state_all(d["cuda_rng"])
        if self.disc is not None and "disc" in d:
            self.disc.load_state_dict(d["disc"])
            self.disc_opt.load_state_dict(d["disc_opt"])
            self.disc_version = int(d["disc_version"])
        if self.rollout_policy is not None and "rollout_policy" in d:
            self.rollout_policy.load_state_dict(d["rollout_policy"])
        if s.critic is not None and "critic" in d:
            s.critic.load_state_dict(d["critic"])
            s.critic_opt.load_state_dict(d["critic_opt"])
        if "algo" in d and hasattr(self.algo, "load_state_dict"):
            self.algo.load_state_dict(d["algo"])

    def apply_config_lrs(self) -> dict:
        """Set the optimizers' learning rates from the config: ``load_state_dict`` restores the saved ones,
        and a resumed run (a Tune PBT exploit: another trial's checkpoint, a mutated ``algo.lr``) must use
        its own. Returns the rates now in use."""
        c, s = self.cfg, self.state
        lrs = {"generator": c.algo.lr if self.stage == "train" else c.train.pretrain_lr, "baseline": c.algo.baseline_lr}
        opts = {"generator": s.gen_opt, "baseline": s.base_opt}
        if self.disc_opt is not None:
            lrs["disc"], opts["disc"] = c.disc.lr, self.disc_opt
        if s.critic_opt is not None:
            lrs["critic"], opts["critic"] = c.algo.critic_lr, s.critic_opt
        for k, opt in opts.items():
            for g in opt.param_groups:
                g["lr"] = lrs[k]
        return lrs

    def init_from(self, d: dict) -> dict:
        """Start from another run's pretrained generator, baseline and (if both have one) discriminator;
        optimizers and stage start fresh. Returns what was loaded (for the log)."""
        self.state.generator.load_state_dict(d["generator"])
        self.state.baseline.load_state_dict(d["baseline"])
        loaded = {"generator": True, "disc": False}
        if self.disc is not None and "disc" in d:
            self.disc.load_state_dict(d["disc"])
            self.disc_version = int(d.get("disc_version", 0))
            loaded["disc"] = True
        return loaded


def evaluate_checkpoint(location: str, split: str = "test", device: str = "cpu") -> tuple[dict, dict]:
    """The ``split`` metrics (and details) of a checkpoint's generator (file, run directory or URI), on this
    process: e.g. the test figures of the trial a search chose on its validation metric."""
    from rayseq.checkpoint import load_checkpoint

    ck = load_checkpoint(location)
    cfg = RunConfig.model_validate(ck["config"])
    task = make_task(cfg.task, cfg.reward)
    generator = make_generator(cfg, task).to(device)
    generator.load_state_dict(ck["learner"]["generator"])
    return task.evaluate(generator, device, split=split)


def _pad_cat(a: np.ndarray, b: np.ndarray, pad: int) -> np.ndarray:
    """Concatenate two (n, L) int arrays along rows, right-padding the narrower one."""
    width = max(a.shape[1], b.shape[1])
    out = np.full((len(a) + len(b), width), pad, dtype=np.int64)
    out[: len(a), : a.shape[1]] = a
    out[len(a) :, : b.shape[1]] = b
    return out
