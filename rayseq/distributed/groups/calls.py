"""The calls the groups send to their actors, and the seeds of a batch's shards.

A call is built as ``partial(builder, ...)``: ``send(actor) -> (data ref, info ref)``, which the actor manager calls
again on a restarted actor (:class:`Call`). Workers and scorers answer with two
return objects: the data goes on by reference to a scorer or the learner, the driver reads the small info.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rayseq.types import PromptBatch, PromptKeys, RolloutRequest


def shard_seed(seed: int | None, shard: int) -> int | None:
    return None if seed is None else seed * 1009 + shard


def shard_request(request: RolloutRequest, shard: int) -> RolloutRequest:
    return dataclasses.replace(request, seed=shard_seed(request.seed, shard))


def two(method):
    """A worker or scorer call with two return objects: (data, small info)."""
    return method.options(num_returns=2)


# -- the calls the groups send, as named builders: ``partial(builder, ...)`` is ``send(actor) -> (data ref, info ref)``,
# which the actor manager calls again on a restarted actor (:class:`Call`)
def send_sample(prompts: PromptBatch | PromptKeys, request: RolloutRequest, score_here: bool, weights: dict,
                report: dict, worker):
    """Sample a shard on ``worker`` (scored there when ``score_here``), with the weights ``weights`` carries;
    ``prompts``: a keyed batch's keys (the worker reads the rows), else the batch."""
    return two(worker.sample_shard).remote(prompts, request, score_here, **weights, **report)


def send_score(sampler, report: dict, rollout, scorer):
    """Score a sampled shard (its ref) on ``scorer``, with what the request's ``sampler`` scores of its extras."""
    return two(scorer.score_rollout_shard).remote(rollout, sampler, **report)


def send_run(fn, args: tuple, kwargs: dict, actor):
    """An algorithm's function on ``actor`` (a worker or a scorer): ``fn(actor, *args, **kwargs)``."""
    return two(actor.run_shard).remote(fn, *args, **kwargs)


@dataclass
class Call:
    """Shard ``index``'s call on actor ``worker`` of ``group`` (a rollout or scorer group; ``worker`` None: actor
    ``index``): its two return refs ``(data, info)``, and ``send(actor) -> (data, info)``, which sends it again to a
    restarted actor, or to another of the group's (a rollout group's lost worker's shard)."""

    group: Any
    index: int
    refs: tuple
    send: Callable
    worker: int | None = None

    @property
    def actor_index(self) -> int:
        return self.index if self.worker is None else self.worker


@dataclass
class PendingShard:
    """A shard of ``RolloutGroup.sample(wait=False)`` not confirmed yet: the worker's call ``sample`` and, when the
    scorers score the rollouts, the scorer call ``score`` chained on its result by reference; ``rescore(rollout ref)
    -> send`` builds that scorer call again for a re-sampled shard."""

    sample: Call
    score: Call | None = None
    rescore: Callable | None = None

    @property
    def result(self):
        """The ref of the shard as the learner takes it: the scored rollout, else the sampled one."""
        return (self.score or self.sample).refs[0]
