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
batch that went out ahead of this iteration (chained and pipelined modes, :func:`rollout_step` and
:func:`pipelined_step`), which the driver keeps between iterations and checkpoints.

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

    def take_ahead(self) -> list:
        """The shard handles of the batch that went out with the last update (``LearnerGroupLike.update``'s
        ``next_batch``)."""

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

    def update(self, shards: list, iteration: int, scores: list | None = None, next_batch: Callable | None = None,
               rows: Any = None) -> dict:
        """The algorithm's update on a sampled rollout.

        Args:
            shards: rollout shard handles (the learner fetches them).
            iteration: the iteration within the stage.
            scores: per-shard handles the learner's algorithm gives the rollout (``Algorithm.assign_scores``).
            next_batch: ``() -> (prompts, request)`` of the next iteration, sent with the update's weights (chained
                mode: no round trip through the driver).
            rows: the rows of the shards' concatenation to train on (None: all).

        Returns:
            The update's metrics.
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
class Carry:
    """What one iteration leaves for the next, kept by the driver: the batch sent ahead (with the last update,
    ``ahead``; or the batches in flight with ``rollout.max_staleness``, ``next``: (data RNGs before it was drawn,
    shard handles) each, oldest first) and the data RNGs from before the first of them was drawn (``rng_ahead``,
    checkpointed in their place: a resumed run draws those batches again)."""

    ahead: bool = False
    next: list | None = None
    rng_ahead: dict | None = None


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


def rollout_step(algo, groups: Groups, step: Step, *, request=None, score=None, chain: bool = False, g: int = 0,
                 steps: int = 1) -> dict:
    """One sample → score → update step (policy step ``g`` of ``steps`` in this iteration):

    1. publish the learner's weights to the rollout group;
    2. sample ``step.prompts(algo)`` with ``request(seed)`` (default: the algorithm's driver copy builds it), or
       take the batch that went out with the last update;
    3. ``score(shards, seed) -> (per-shard score handles, timing metrics)`` (None: the task's reward, already
       computed where the rollout was sampled; the update is then sent right behind the sampling calls);
    4. the learner's update; with ``chain`` (and not the stage's last iteration) the next iteration's batch goes out
       with it, sampled with its weights by reference (no driver round trip; the same prompts, seeds and weights
       as one call after the other: staleness 0). Chain only where nothing between two iterations changes them
       (task rewards, one policy step, a request the driver copy builds, no validation).
    """
    t0 = time.perf_counter()
    groups.rollout.sync_weights()
    t1 = time.perf_counter()
    seed = step.seed(step.iteration * steps + g)
    if step.carry.ahead:  # sent with the last update, sampled with its weights
        shards = groups.rollout.take_ahead()
        step.carry.ahead, step.carry.rng_ahead = False, None
    else:
        prompts = step.prompts(algo)
        req = step.request(algo, seed) if request is None else request(seed)
        shards = groups.rollout.sample(prompts, req, wait=score is not None)
    t2 = time.perf_counter()
    scores, timing = (None, {}) if score is None else score(shards, seed)
    t3 = time.perf_counter()
    next_batch = _next_batch(algo, step) if chain and not step.last else None
    m = groups.learner.update(shards, step.stage_iter, scores, next_batch=next_batch)
    step.carry.ahead = next_batch is not None
    t4 = time.perf_counter()
    m.update(timing)
    m.update({"time/sync_s": t1 - t0, "time/rollout_s": t2 - t1, "time/learn_s": t4 - t3})
    if score is not None:
        m["time/mc_total_s"] = t3 - t2
    return m


def _next_batch(algo, step: Step):
    """``() -> (prompts, request)`` of the next iteration (drawn when the update is on its way)."""
    stage_iter, iteration = step.stage_iter + 1, step.iteration + 1

    def draw() -> tuple:
        step.carry.rng_ahead = step.rng_state()
        return step.prompts(algo), step.request(algo, step.seed(iteration), stage_iter)

    return draw


def pipelined_step(algo, groups: Groups, step: Step) -> dict:
    """``rollout.max_staleness`` = k ≥ 1: the learner updates on batch i while the workers sample batches i+1 … i+k,
    each with the weights published when it went out, so batch i was sampled with the weights of up to k updates
    before (``rollout/staleness``; ``rollout/in_flight``: the batches still out when the update goes). The
    algorithm's ratio π_θ / π_behaviour uses the log-probs recorded at sampling (``Rollout.logp``), which corrects
    for the older weights (``off_policy_ratio``; rayseq.config.check_pipeline refuses the others). Under Ray a
    worker's calls queue on it, so it samples the next batch the moment it has finished one; in-process the same
    happens one call after the other: the batches ahead are sampled before update i.

    The stage's first batches (and the first after a resume or a learner's loss, where nothing is in flight) are
    sampled with the current weights; prompts and seeds follow the synchronous loop's. What is in flight is not
    checkpointed: the data RNGs from before the oldest batch ahead are (``Carry.rng_ahead``), so a resumed run draws
    those batches again."""
    carry, k = step.carry, step.cfg.rollout.max_staleness
    t0 = time.perf_counter()
    groups.rollout.sync_weights()
    t1 = time.perf_counter()
    queue = carry.next or []  # (the data RNGs before it was drawn, its shard handles) of each batch in flight
    if not queue:
        queue = [(step.rng_state(), _submit(algo, groups, step, step.stage_iter, step.iteration))]
    (_, shards), queue = queue[0], queue[1:]
    carry.rng_ahead = queue[0][0] if queue else None
    for ahead in range(len(queue) + 1, k + 1):  # keep k batches out after this one, up to the stage's end
        if step.stage_iter + ahead >= step.n_iters:
            break
        rng = step.rng_state()
        carry.rng_ahead = carry.rng_ahead or rng
        queue.append((rng, _submit(algo, groups, step, step.stage_iter + ahead, step.iteration + ahead)))
    carry.next = queue or None
    t2 = time.perf_counter()
    m = groups.learner.update(shards, step.stage_iter)
    t3 = time.perf_counter()
    m.update({"time/sync_s": t1 - t0, "time/rollout_s": t2 - t1, "time/learn_s": t3 - t2,
              "rollout/in_flight": float(len(queue))})
    return m


def _submit(algo, groups: Groups, step: Step, stage_iter: int, iteration: int) -> list:
    """Start sampling the batch of ``iteration`` (``stage_iter`` of the stage): prompts, request and seed as the
    synchronous loop draws them; its shard handles at once (under Ray, while it samples)."""
    prompts = step.prompts(algo)
    return groups.rollout.sample(prompts, step.request(algo, step.seed(iteration), stage_iter), wait=False)
