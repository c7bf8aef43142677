"""Learner: holds the generator, the value baseline and their optimizers; applies the algorithm."""

from __future__ import annotations

import random

import numpy as np
import torch

from rayseq.algos import MLE, LearnerState, make_algo
from rayseq.config import RunConfig
from rayseq.models import ValueBaseline
from rayseq.models.generator import build_generator
from rayseq.tasks import make_task


class Learner:
    def __init__(self, cfg: dict):
        self.cfg = RunConfig.model_validate(cfg)
        c = self.cfg
        torch.set_num_threads(c.learner.torch_threads)
        torch.manual_seed(c.seed)
        random.seed(c.seed)
        np.random.seed(c.seed % 2**32)  # noqa: NPY002 -- seeds third-party code that uses the legacy RNG
        use_cuda = c.learner.device == "cuda" or (c.learner.device == "auto" and c.learner.num_gpus > 0)
        self.device = torch.device("cuda" if use_cuda and torch.cuda.is_available() else "cpu")
        self.task = make_task(c.task)
        generator = build_generator(len(self.task.vocab), c.model, self.task.specials).to(self.device)
        baseline = ValueBaseline(c.model.hidden_dim).to(self.device)
        self.state = LearnerState(
            generator=generator,
            baseline=baseline,
            gen_opt=torch.optim.Adam(generator.parameters(), lr=c.train.pretrain_lr),
            base_opt=torch.optim.Adam(baseline.parameters(), lr=c.algo.baseline_lr),
            device=self.device,
        )
        self.stage = "mle"
        self.algo = MLE(c.algo)
        self.version = 0

    def placement(self) -> dict:
        """Where the learner runs: pid, device, placement group id (diagnostics)."""
        import os

        from rayseq.distributed.worker import placement_group_id

        return {"pid": os.getpid(), "device": str(self.device), "placement_group": placement_group_id()}

    def start_stage(self, stage: str) -> None:
        """``mle`` (pretraining) or ``train`` (the configured algorithm, with a fresh Adam at algo.lr)."""
        if stage == self.stage:
            return
        if stage != "train":
            raise ValueError(f"unknown stage {stage!r}")
        self.stage = stage
        self.algo = make_algo(self.cfg.algo)
        self.state.gen_opt = torch.optim.Adam(self.state.generator.parameters(), lr=self.cfg.algo.lr)

    def get_weights(self) -> dict:
        """Generator state dict on CPU (published once per version through the object store)."""
        return {k: v.detach().cpu() for k, v in self.state.generator.state_dict().items()}

    def update(self, batch, iteration: int) -> dict:
        self.state.generator.train()
        metrics = self.algo.update(self.state, batch, iteration)
        if self.algo.kind == "rollout":
            metrics["rollout/staleness"] = float(self.version - batch.version)
        self.version += 1
        metrics["learner/version"] = float(self.version)
        return metrics

    def evaluate(self, seed: int = 0) -> tuple[dict, dict]:
        return self.task.evaluate(self.state.generator, self.device, seed=seed)

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        s = self.state
        return {
            "generator": s.generator.state_dict(),
            "baseline": s.baseline.state_dict(),
            "gen_opt": s.gen_opt.state_dict(),
            "base_opt": s.base_opt.state_dict(),
            "stage": self.stage,
            "version": self.version,
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, d: dict) -> None:
        s = self.state
        s.generator.load_state_dict(d["generator"])
        s.baseline.load_state_dict(d["baseline"])
        self.start_stage(d["stage"])
        s.gen_opt.load_state_dict(d["gen_opt"])
        s.base_opt.load_state_dict(d["base_opt"])
        self.version = int(d["version"])
        torch.set_rng_state(d["torch_rng"])
