"""ScorerActor: scores rollouts with the task reward when it is expensive (chitchat's BLEU-2 against all
references) or configured (``reward.*``: functions on text, user code, maybe a model on the scorer's GPU), and runs
what an algorithm scores with a model of its own (:meth:`ScorerActor.run_shard`) on the copies the algorithm
declared (``Algorithm.scorer_modules``).

Their weights arrive through the object store when the algorithm's version of them changes (one object per
version, like the generator's). Scoring is large batched forward passes (``scorer.batch_size``).
"""

from __future__ import annotations

import os
import time

import torch

from rayseq.config import RunConfig
from rayseq.distributed.actors.worker import score_rollout
from rayseq.distributed.runtime import placement_group_id
from rayseq.rewards.trained import REFRESHED, load_refreshed
from rayseq.seeding import set_deterministic
from rayseq.tasks import make_task
from rayseq.types import Rollout


class ScorerActor:
    """One scorer (``index`` of the group); ``cfg``: the run's config. What an algorithm runs here
    (:meth:`run_shard`) reads ``cfg``, ``task``, ``device``, ``index`` and ``modules`` (the copies of the algorithm's
    that have received weights)."""

    def __init__(self, cfg: RunConfig, index: int = 0):
        self.cfg = cfg
        self.index = index
        torch.set_num_threads(self.cfg.scorer.torch_threads)
        set_deterministic(self.cfg.deterministic)
        self.device = torch.device("cuda" if self.cfg.scorer.num_gpus_per_scorer > 0 else "cpu")
        self.task = make_task(self.cfg.task, self.cfg.reward)  # with a configured reward: its functions run here
        self._held = self.cfg.algorithm.scorer_modules(self.cfg, self.task, self.device)
        self.modules: dict = {}  # what received weights
        self.weights_version = -1
        self.loads = 0

    def pid(self) -> int:
        return os.getpid()

    def stats(self) -> dict:
        return {"pid": os.getpid(), "weights_version": self.weights_version, "loads": self.loads,
                "placement_group": placement_group_id()}

    def set_weights(self, weights: dict, version: int) -> int:
        """``weights``: ``{name: state dict}`` of the algorithm's copies here (``Learner.get_scorer_weights``), loaded
        when ``version`` is new to this scorer."""
        if version != self.weights_version:
            for name, state in weights.items():
                if name == REFRESHED:  # a refreshed reward model's: into the one this process scores with
                    load_refreshed(self.cfg.reward.refreshed.kwargs["path"], state)
                    continue
                self._held[name].load_state_dict(state)
                self.modules[name] = self._held[name]
            self.weights_version = version
            self.loads += 1
        return self.weights_version

    def score_rollout(self, rollout: Rollout, sampler=None) -> Rollout:
        """The reward (the task's, e.g. BLEU-2 against the input's references, or the configured one) of sampled
        rollouts, and what their ``sampler`` (the request's, :class:`rayseq.algos.sampling.Sampler`; None: π_θ's)
        scores of the extras it added."""
        t0 = time.perf_counter()
        out = score_rollout(self.task, rollout, sampler)
        out.info = {**out.info, "score_s": time.perf_counter() - t0}
        return out

    def score_rollout_shard(self, rollout: Rollout, sampler=None, report_score: bool = False) -> tuple[Rollout, dict]:
        """:meth:`score_rollout`, and its info (the Ray groups' two return objects: data by reference, info to the
        driver; with ``report_score`` the rewards ``score`` (B,) and ``term_scores`` (B, K) too)."""
        out = self.score_rollout(rollout, sampler)
        report = {"score": out.score, "term_scores": out.term_scores} if report_score else {}
        return out, {"score_s": out.info["score_s"], "rows": len(out), **report}

    def reward_model_weights(self) -> dict:
        """The weights of the refreshed reward model this scorer scores with (``reward.refresh``; tests, checks)."""
        from rayseq.rewards.trained import scorer_device, scorer_of

        return scorer_of(self.cfg.reward.refreshed.kwargs["path"], scorer_device()).weights()

    def run_shard(self, fn, *args, **kwargs) -> tuple:
        """``fn(self, *args, **kwargs) -> (data, info)``: what an algorithm scores here with a model of its own (a
        module-level function of the algorithm's, e.g. action values of a worker's continuations)."""
        return fn(self, *args, **kwargs)
