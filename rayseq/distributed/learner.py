"""Learner: holds the generator, the value baseline, (SeqGAN) the discriminator and the rollout policy
G_β, and their optimizers; applies the algorithm and the discriminator's d-steps."""

from __future__ import annotations

import copy
import random
import time

import numpy as np
import torch

from rayseq.algos import MLE, LearnerState, make_algo, seqgan
from rayseq.algos.common import baseline_lr
from rayseq.algos.regularizers import KLController, apply_kl_penalty, sampled_kl
from rayseq.config import RunConfig
from rayseq.distributed.handles import FlatWeights, as_rollout, resolve
from rayseq.distributed.placement import placement_group_id
from rayseq.models import Critic, ValueBaseline, make_discriminator, make_generator, reference_policy
from rayseq.seeding import set_deterministic
from rayseq.tasks import make_task
from rayseq.types import PromptBatch, Rollout, to_torch


class Learner:
    def __init__(self, cfg: dict):
        self.cfg = RunConfig.model_validate(cfg)
        c = self.cfg
        torch.set_num_threads(c.learner.torch_threads)
        set_deterministic(c.deterministic)
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
        baseline = ValueBaseline(generator.state_dim).to(self.device)
        self.state = LearnerState(
            generator=generator,
            baseline=baseline,
            gen_opt=torch.optim.Adam(generator.parameters(), lr=c.train.pretrain_lr),
            base_opt=torch.optim.Adam(baseline.parameters(), lr=baseline_lr(c.algo)),
            device=self.device,
        )
        if c.algorithm.uses_critic:
            self.state.critic = Critic(generator.state_dim, c.algo.critic_hidden).to(self.device)
            self.state.critic_opt = torch.optim.Adam(self.state.critic.parameters(), lr=c.algo.critic_lr)
        # KL to the pretrained policy (in the reward) and the entropy bonus, for regularized (rollout) algorithms
        regularized = c.algorithm.regularized
        self.kl = KLController(c.algo.kl_coef, c.algo.kl_target) if regularized else None
        self.state.entropy_coef = c.algo.entropy_coef if regularized else 0.0
        self.ref_policy = None  # π_ref: the generator as the algorithm stage starts, frozen
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

        return {"pid": os.getpid(), "device": str(self.device), "placement_group": placement_group_id()}

    # -- data parallel (learner.num_learners > 1; rayseq.distributed.groups.LearnerGroup sets it up) ------------
    @staticmethod
    def rendezvous() -> tuple[str, int]:
        """Rank 0's address for the process group: this node's IP and a free TCP port on it."""
        import socket

        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def join_data_parallel(self, rank: int, world: int, address: str, port: int, timeout_s: float) -> str:
        """Join the learners' process group as ``rank`` of ``world`` (gloo on CPU, NCCL on GPU; rank 0 listens at
        ``address:port``); every update from here on takes this rank's rows of each minibatch and sums the ranks'
        gradients (:mod:`rayseq.algos.parallel`). ``timeout_s``: how long a collective waits for a lost rank.
        Returns the backend."""
        import datetime

        import torch.distributed as dist

        from rayseq.algos.parallel import DataParallel

        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        self.state.dp = DataParallel(rank, world, self.device)
        return backend

    def actor_id(self) -> str | None:
        """This learner's Ray actor id (hex; None in-process): what a RayActorError names when it is the one lost."""
        import ray

        return ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None

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
                self.rollout_policy = self.state.rollout_policy = copy.deepcopy(self.state.generator).eval()
            if self.kl is not None and self.kl.coef > 0:
                self.ref_policy = reference_policy(self.state.generator)

    def get_weights(self) -> dict:
        """Generator (and SeqGAN's rollout policy G_β) state dicts on CPU, published once per version."""

        def cpu(m):
            return None if m is None else {k: v.detach().cpu() for k, v in m.state_dict().items()}

        return {"generator": cpu(self.state.generator), "rollout_policy": cpu(self.rollout_policy)}

    def get_flat_weights(self) -> FlatWeights:
        """:meth:`get_weights` as one buffer (what the Ray groups publish: one object per version)."""
        return FlatWeights.pack(self.get_weights())

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
        kl_metrics = self._kl_penalty(batch) if self.ref_policy is not None and self.algo.kind == "rollout" else {}
        metrics = {**self.algo.update(self.state, batch, iteration), **kl_metrics}
        if self.algo.kind == "rollout":
            metrics["rollout/staleness"] = float(self.version - batch.version)
        self.version += 1
        metrics["learner/version"] = float(self.version)
        return metrics

    def update_rollout(self, shards: list, iteration: int, scores: list | None = None, rows=None) -> dict:
        """The rollout algorithm's update on a rollout that arrives as shard handles (ObjectRefs fetched here, from
        the object store, never through the driver; in-process the shards themselves), concatenated here in shard
        order. Returns the metrics: each configured reward term (``reward/<name>``), the scores' (below), the
        update's.

        ``scores``: per-shard handles of what the algorithm's iteration computed on the scorers (SeqGAN's Q, D(Y)),
        which the learner's copy of the algorithm gives the rollout (``Algorithm.assign_scores``). ``rows``: (N,) the
        rows of the concatenation to train on (dynamic sampling's kept groups); None: all."""
        t0 = time.perf_counter()
        parts = [shards] if isinstance(shards, Rollout) else resolve(shards)
        rollout = as_rollout(shards if isinstance(shards, Rollout) else parts)
        if rows is not None:
            rollout = rollout.rows(np.asarray(rows, dtype=np.int64))
        m = {"time/fetch_s": time.perf_counter() - t0,  # the shards from the object store, concatenated
             "time/sample_s": max(p.info.get("sample_s", 0.0) for p in parts)}  # the slowest worker's sampling
        if rollout.term_scores is not None:  # reward.*: each term, as reward/<name>
            m.update(self.task.reward.metrics(rollout.term_scores))
        if scores is not None:
            m.update(self.algo.assign_scores(rollout, resolve(scores)))
        t1 = time.perf_counter()
        m.update(self.update(rollout, iteration))
        m["time/update_s"] = time.perf_counter() - t1  # the algorithm's update alone (time/learn_s: and the calls)
        return m

    def update_and_publish(self, shards: list, iteration: int, scores: list | None = None,
                           rows=None) -> tuple[dict, FlatWeights]:
        """:meth:`update_rollout`, and the updated weights (the Ray groups' two return objects: the metrics go to
        the driver, the weights by reference to the workers with their next call)."""
        m = self.update_rollout(shards, iteration, scores, rows)
        t0 = time.perf_counter()
        weights = self.get_flat_weights()
        m["time/publish_s"] = time.perf_counter() - t0
        return m, weights

    @torch.no_grad()
    def _kl_penalty(self, rollout: Rollout) -> dict:
        """r_t − β·(log π_old − log π_ref) on the rollout (rayseq.algos.regularizers); then β's controller step."""
        d = self.device
        ref = self.ref_policy.logprobs(to_torch(rollout.src, d), to_torch(rollout.src_len, d),
                                       to_torch(rollout.tokens, d)).logp.cpu().numpy()
        kl = sampled_kl(rollout.logp, ref, rollout.action_mask)
        coef = self.kl.coef
        apply_kl_penalty(rollout, kl, coef)
        per_reply = float(kl.sum(1).mean())
        self.kl.update(per_reply)
        return {"kl/per_reply": per_reply, "kl/per_token": float(kl.sum() / max(rollout.action_mask.sum(), 1.0)),
                "kl/coef": coef}

    def train_discriminator(self, positives: PromptBatch, negatives: Rollout | list, seed: int) -> dict:
        """One d-step of SeqGAN's Algorithm 1 (:func:`rayseq.algos.seqgan.d_step`); ``negatives``: a Rollout or the
        shard handles of one (fetched here)."""
        out = seqgan.d_step(self.disc, self.disc_opt, positives, as_rollout(negatives), self.cfg.disc,
                            self.task.specials.pad, self.device, seed, self.state.dp)
        self.disc_version += 1
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
        if self.ref_policy is not None:
            out |= {"ref_policy": self.ref_policy.state_dict(), "kl_coef": self.kl.coef}
        if s.critic is not None:
            out |= {"critic": s.critic.state_dict(), "critic_opt": s.critic_opt.state_dict()}
        algo_state = self.algo.state_dict()
        if algo_state:
            out["algo"] = algo_state
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
        if self.ref_policy is not None and "ref_policy" in d:
            self.ref_policy.load_state_dict(d["ref_policy"])
            self.kl.coef = float(d["kl_coef"])
        if s.critic is not None and "critic" in d:
            s.critic.load_state_dict(d["critic"])
            s.critic_opt.load_state_dict(d["critic_opt"])
        if "algo" in d:
            self.algo.load_state_dict(d["algo"])

    def apply_config_lrs(self) -> dict:
        """Set the optimizers' learning rates from the config: ``load_state_dict`` restores the saved ones,
        and a resumed run (a Tune PBT exploit: another trial's checkpoint, a mutated ``algo.lr``) must use
        its own. Returns the rates now in use."""
        c, s = self.cfg, self.state
        lrs = {"generator": c.algo.lr if self.stage == "train" else c.train.pretrain_lr,
               "baseline": baseline_lr(c.algo)}
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
        optimizers and stage start fresh. Returns what this run needs, and whether it was there."""
        self.state.generator.load_state_dict(d["generator"])
        self.state.baseline.load_state_dict(d["baseline"])
        loaded = {"generator": True}
        if self.disc is not None:  # a run that trains one needs it pretrained
            loaded["discriminator"] = "disc" in d
            if loaded["discriminator"]:
                self.disc.load_state_dict(d["disc"])
                self.disc_version = int(d.get("disc_version", 0))
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
