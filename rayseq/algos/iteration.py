"""What an algorithm's iteration (``Algorithm.training_step(groups, step)``) is written against, and its building
blocks (math layer: no Ray here).

``groups`` has three typed actor groups (:mod:`rayseq.distributed.groups` implements them, in-process or on Ray
actors, with one interface); the protocols below say what an algorithm may call:

- ``groups.rollout`` (:class:`RolloutGroupLike`): publish the learner's weights, sample, run an algorithm's function
  on the sampled shards (SeqGAN's Monte-Carlo continuations);
- ``groups.scorer`` (:class:`ScorerGroupLike`): publish what the algorithm has the scorers hold, run its function on
  the shards or on what the workers computed (SeqGAN's Q from D, D(Y));
- ``groups.learner`` (:class:`LearnerGroupLike`): updates, the algorithm's other updates (SeqGAN's d-steps),
  validation, requests built on the learner.

``step`` (:class:`Step`) is the driver's side: the task, the data RNG, the stage's position, the seeds, and the
batches sampling ahead of the learner (:class:`Carry`: one queue, ``rollout.max_staleness`` long, filled by
:func:`ahead_step`), which the driver keeps between iterations and checkpoints. :func:`rollout_step` is the plain
sample → score → update of an iteration that samples nothing ahead.

Every handle these calls return (shards, scores) is opaque here: a Ray ObjectRef or the object itself; it goes on to
another group, never into the algorithm's own hands.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from rayseq.algos.reward_refresh import refresh_due
from rayseq.types import PromptBatch, RolloutRequest


class RolloutGroupLike(Protocol):
    """The rollout workers, as an algorithm's iteration calls them (:class:`rayseq.distributed.groups.RolloutGroup`)."""

    live: list  # the workers taking shards (under Ray: fewer while a lost one is not back)

    def sync_weights(self) -> None:
        """Publish the learner's current weights (the generator's, and what the algorithm publishes with them); the
        next calls sample with them."""

    def sample(self, prompts: PromptBatch, request: RolloutRequest, wait: bool = True) -> list:
        """Sample one reply per prompt, scored with the task's reward where it was sampled or on the scorers.

        Args:
            prompts: the batch's inputs (B rows; split over the workers).
            request: max length, temperature, seed and the algorithm's sampling options.
            wait: False returns at once while the workers sample (the learner's update waits for the shards).

        Returns:
            Per-shard handles of the :class:`rayseq.types.Rollout` (pass them on to another group).
        """

    def sample_scored(self, prompts: PromptBatch, request: RolloutRequest) -> tuple[list, list, list]:
        """:meth:`sample`, waited for, and what an iteration that decides on the rewards reads on the driver
        (dynamic sampling).

        Returns:
            (shard handles, each shard's rewards (B_i,), each shard's reward terms (B_i, K) or None).
        """

    def run_on_shards(self, fn: Callable, shards: list, *args, seed: int) -> list:
        """Run ``fn`` on each shard where it was sampled, with the published weights.

        Args:
            fn: ``fn(worker, shard, *args, seed=...) -> (data, info)``, a module-level function; ``worker`` has
                ``generator``, ``modules`` (the algorithm's ``worker_modules`` that received weights), ``device``,
                ``task``, ``cfg`` and ``index``.
            shards: rollout shard handles (as :meth:`sample` returned them).
            seed: the call's seed; each shard's is derived from it.

        Returns:
            Pending calls, for :meth:`ScorerGroupLike.run_on_pending`.
        """


class ScorerGroupLike(Protocol):
    """The scorer actors, as an algorithm's iteration calls them (:class:`rayseq.distributed.groups.ScorerGroup`)."""

    def sync_weights(self) -> None:
        """Publish what the learner's algorithm has the scorers hold (``Algorithm.scorer_weights``), when its version
        is new to them."""

    def run_on_pending(self, fn: Callable, pending: list) -> tuple[list, list]:
        """Run ``fn`` on what each pending call of :meth:`RolloutGroupLike.run_on_shards` computed, as soon as it
        exists.

        Args:
            fn: ``fn(scorer, data) -> (result, info)``; ``scorer`` has ``modules`` (the algorithm's
                ``scorer_modules`` that received weights), ``device``, ``task``, ``cfg`` and ``index``.
            pending: what :meth:`RolloutGroupLike.run_on_shards` returned.

        Returns:
            (per-shard result handles, per-shard infos).
        """

    def run_on_shards(self, fn: Callable, shards: list) -> tuple[list, list]:
        """Run ``fn(scorer, shard) -> (result, info)`` on each rollout shard.

        Returns:
            (per-shard result handles, per-shard infos).
        """


class LearnerGroupLike(Protocol):
    """The learner ranks, as an algorithm's iteration calls them (:class:`rayseq.distributed.groups.LearnerGroup`)."""

    def update(self, shards: list, iteration: int, scores: list | None = None, rows: Any = None) -> dict:
        """The algorithm's update on a sampled rollout.

        Args:
            shards: rollout shard handles (the learner fetches them).
            iteration: the iteration within the stage.
            scores: per-shard handles the learner's algorithm gives the rollout (``Algorithm.assign_scores``).
            rows: the rows of the shards' concatenation to train on (None: all).

        Returns:
            The update's metrics.
        """

    def update_and_sample(self, shards: list, iteration: int, prompts: PromptBatch,
                          request: RolloutRequest) -> tuple[dict, list]:
        """:meth:`update`, and a batch sampled with the weights it makes, sent right behind it (no round trip
        through the driver between the update and the sampling).

        Args:
            shards: rollout shard handles (the learner fetches them), as :meth:`update`'s.
            iteration: the iteration within the stage.
            prompts: the batch to sample behind the update.
            request: how to sample it.

        Returns:
            (the update's metrics, the batch's shard handles).
        """

    def update_batch(self, batch: PromptBatch, iteration: int) -> dict:
        """A supervised update on reference targets (``batch`` with ``tgt``); its metrics."""

    def aux_update(self, positives: PromptBatch, negatives: list, seed: int) -> dict:
        """The algorithm's update of a model of its own (``Algorithm.aux_update``).

        Args:
            positives: real (input, target) pairs.
            negatives: shard handles of sampled replies.
            seed: the seed of its shuffling.

        Returns:
            Its metrics.
        """

    def validate(self) -> dict:
        """The validation reward handed to the learner's copy of the algorithm (``on_validation``); its metrics."""

    def rollout_request(self, iteration: int, max_len: int, temperature: float, seed: int) -> RolloutRequest:
        """The request the learner's copy of the algorithm builds (state that lives there)."""


class Groups(Protocol):
    rollout: RolloutGroupLike
    scorer: ScorerGroupLike
    learner: LearnerGroupLike
    remote: bool  # members are Ray actors (driver/recv_bytes is measured)
    restarts: int  # worker and scorer restarts so far
    recv_bytes: int  # what the driver fetched so far


ALGO_PRETRAIN = "algo_pretrain"  # the algorithm's own pretraining stage (Algorithm.pretrain_steps)
STAGES = ("mle", ALGO_PRETRAIN, "train")  # a run's stages, in order
_OLD_STAGE_NAMES = {"disc": ALGO_PRETRAIN}  # as checkpoints and metrics written before it had a neutral name say


def stage_name(stage: str) -> str:
    """A stage's name as this version calls it (an older checkpoint's ``disc`` is ``algo_pretrain``)."""
    return _OLD_STAGE_NAMES.get(stage, stage)


def rollout_seed(run_seed: int, k: int) -> int:
    """The sampling seed of draw ``k`` of a run seeded ``run_seed`` (workers derive their shards' from it)."""
    return (run_seed * 1_000_003 + k) % 2**62


@dataclass
class Ahead:
    """A batch sampling ahead of the learner: the driver's data RNGs from before it was drawn, and its shard
    handles."""

    rng: dict
    shards: list


@dataclass
class Carry:
    """What one iteration leaves for the next, kept by the driver: the batches sampling ahead (:func:`ahead_step`),
    oldest first."""

    ahead: list[Ahead] = field(default_factory=list)

    @property
    def rng_ahead(self) -> dict | None:
        """The data RNGs from before the oldest batch in flight (None: none is), which a checkpoint keeps in their
        place: a resumed run draws those batches again."""
        return self.ahead[0].rng if self.ahead else None


@dataclass
class Step:
    """One iteration as the driver hands it to ``training_step``: the run's config, the task, the data RNG
    (``rng``, numpy; prompts are drawn from it here, on the driver), ``stage_iter`` (0-based, within the stage) of
    ``n_iters``, ``iteration`` (global, before this one), ``batch_size``, and the :class:`Carry`."""

    cfg: Any
    task: Any
    rng: Any
    stage_iter: int
    n_iters: int
    iteration: int
    batch_size: int
    carry: Carry = field(default_factory=Carry)

    @property
    def last(self) -> bool:
        """The stage's last iteration: no batch is sampled ahead of it."""
        return self.stage_iter + 1 == self.n_iters

    def seed(self, k: int) -> int:
        return rollout_seed(self.cfg.seed, k)

    def rng_state(self) -> dict:
        """The driver's data RNGs (numpy's and Python's), as checkpoints keep them."""
        return {"numpy_rng": self.rng.bit_generator.state, "python_rng": random.getstate()}

    def prompts(self, algo, n: int | None = None) -> PromptBatch:
        """``n`` prompts (``batch_size``) for the algorithm's rollouts: ``n / algo.prompt_copies()`` inputs, each
        repeated that many times in consecutive rows (GRPO's and RLOO's groups of samples of one prompt)."""
        n = self.batch_size if n is None else n
        copies = algo.prompt_copies()
        if n % copies:
            raise ValueError(f"train.batch_size={n} is not a multiple of the {copies} samples per prompt")
        prompts = self.task.sample_prompts(self.rng, n // copies, with_targets=algo.needs_targets)
        return prompts if copies == 1 else prompts.repeat(copies)

    def request(self, algo, seed: int, stage_iter: int | None = None) -> RolloutRequest:
        """The algorithm's rollout request for ``stage_iter`` (this one), as its driver copy builds it."""
        return algo.rollout_request(self.stage_iter if stage_iter is None else stage_iter, self.task.max_tgt_len,
                                    self.cfg.rollout.temperature, seed)


@contextmanager
def counted(groups: Groups):
    """Around one iteration (on the driver, whatever the algorithm's ``training_step`` does): yields a dict that
    receives, when the iteration ends, ``time/iter_s``, ``rollout/worker_restarts`` (so far) and, under Ray,
    ``driver/recv_bytes`` (what the driver fetched meanwhile: metrics, not rollouts) and ``rollout/live_workers``
    (the workers taking shards: fewer while a lost one is not back)."""
    t0, received = time.perf_counter(), groups.recv_bytes
    counters: dict = {}
    yield counters
    counters["rollout/worker_restarts"] = float(groups.restarts)
    if groups.remote:
        counters["driver/recv_bytes"] = float(groups.recv_bytes - received)
        counters["rollout/live_workers"] = float(len(groups.rollout.live))
    counters["time/iter_s"] = time.perf_counter() - t0


def rollout_step(algo, groups: Groups, step: Step, *, request=None, score=None, g: int = 0, steps: int = 1) -> dict:
    """One sample → score → update step (policy step ``g`` of ``steps`` in this iteration), nothing sampled ahead:
    what an iteration uses when something between two of its batches changes them (rewards from a model it trains,
    several policy steps, a request built on the learner, a validation).

    1. publish the learner's weights to the rollout group;
    2. sample ``step.prompts(algo)`` with ``request(seed)`` (default: the algorithm's driver copy builds it);
    3. ``score(shards, seed) -> (per-shard score handles, timing metrics)`` (None: the task's reward, already
       computed where the rollout was sampled; the update is then sent right behind the sampling calls);
    4. the learner's update.
    """
    t0 = time.perf_counter()
    groups.rollout.sync_weights()
    t1 = time.perf_counter()
    seed = step.seed(step.iteration * steps + g)
    prompts = step.prompts(algo)
    req = step.request(algo, seed) if request is None else request(seed)
    shards = groups.rollout.sample(prompts, req, wait=score is not None)
    t2 = time.perf_counter()
    scores, timing = (None, {}) if score is None else score(shards, seed)
    t3 = time.perf_counter()
    m = groups.learner.update(shards, step.stage_iter, scores)
    t4 = time.perf_counter()
    m.update(timing)
    m.update({"time/sync_s": t1 - t0, "time/rollout_s": t2 - t1, "time/learn_s": t4 - t3})
    if score is not None:
        m["time/mc_total_s"] = t3 - t2
    return m


def ahead_step(algo, groups: Groups, step: Step) -> dict:
    """A rollout algorithm's default iteration: sample → update on the task's reward, with the batches sampled ahead
    of the learner in one queue (``step.carry.ahead``, oldest first), ``rollout.max_staleness`` = k of them.

    - k = 0: the next iteration's batch goes out right behind the update, its sampling calls carrying the update's
      weights by reference: each worker starts the moment the learner has published them, with no round trip
      through the driver, and samples with them (staleness 0: the same prompts, seeds and weights as one call after
      the other).
    - k ≥ 1: the learner updates on batch i while the workers sample batches i+1 … i+k, each with the weights
      published when it went out, so batch i was sampled with the weights of up to k updates before
      (``rollout/staleness``; ``rollout/in_flight``: the batches still out when the update goes). The algorithm's
      ratio π_θ / π_behaviour uses the log-probs recorded at sampling (``Rollout.logp``), which corrects for the
      older weights (``off_policy_ratio``; rayseq.config.check_pipeline refuses the others). Under Ray a worker's
      calls queue on it, so it samples the next batch the moment it has finished one; in-process the same happens
      one call after the other: the batches ahead are sampled before update i.

    The stage's first batch (and the first after a resume or a learner's loss, where nothing is in flight) is
    sampled with the current weights; prompts and seeds follow :func:`rollout_step`'s. What is in flight is not
    checkpointed: the data RNGs from before the oldest batch ahead are (``Carry.rng_ahead``), so a resumed run draws
    those batches again."""
    k, queue = step.cfg.rollout.max_staleness, step.carry.ahead
    t0 = time.perf_counter()
    groups.rollout.sync_weights()
    t1 = time.perf_counter()
    shards = queue.pop(0).shards if queue else groups.rollout.sample(*_draw(algo, step, 0), wait=False)
    for ahead in range(len(queue) + 1, k + 1):  # k batches out after this one, up to the stage's end
        if step.stage_iter + ahead >= step.n_iters:
            break
        rng = step.rng_state()
        queue.append(Ahead(rng, groups.rollout.sample(*_draw(algo, step, ahead), wait=False)))
    t2 = time.perf_counter()
    # the next batch behind the update, sampled with the weights it makes (not when a refreshed reward model changes
    # after this iteration: the batch is then drawn next iteration, scored by the new one)
    if k == 0 and not step.last and not refresh_due(step.cfg, step.stage_iter):
        rng = step.rng_state()
        m, after = groups.learner.update_and_sample(shards, step.stage_iter, *_draw(algo, step, 1))
        queue.append(Ahead(rng, after))
    else:
        m = groups.learner.update(shards, step.stage_iter)
    t3 = time.perf_counter()
    m.update({"time/sync_s": t1 - t0, "time/rollout_s": t2 - t1, "time/learn_s": t3 - t2})
    if k:
        m["rollout/in_flight"] = float(len(queue))
    return m


def _draw(algo, step: Step, ahead: int) -> tuple[PromptBatch, RolloutRequest]:
    """The prompts and request of the batch ``ahead`` iterations after this one, drawn now from the data RNG as the
    synchronous loop draws them."""
    seed = step.seed(step.iteration + ahead)
    return step.prompts(algo), step.request(algo, seed, step.stage_iter + ahead)
