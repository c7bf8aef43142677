"""The calls the groups send to their actors, and the seeds of a batch's shards.

A call is built as ``partial(builder, ...)``: ``send(actor) -> (data ref, info ref)``, which the actor manager calls
again on a restarted actor (:class:`~rayseq.distributed.groups.manager.Call`). Workers and scorers answer with two
return objects: the data goes on by reference to a scorer or the learner, the driver reads the small info.
"""

from __future__ import annotations

import dataclasses

from rayseq.types import PromptBatch, PromptKeys, RolloutRequest


def shard_seed(seed: int | None, shard: int) -> int | None:
    return None if seed is None else seed * 1009 + shard


def shard_request(request: RolloutRequest, shard: int) -> RolloutRequest:
    return dataclasses.replace(request, seed=shard_seed(request.seed, shard))


def two(method):
    """A worker or scorer call with two return objects: (data, small info)."""
    return method.options(num_returns=2)


# -- the calls the groups send, as named builders: ``partial(builder, ...)`` is ``send(actor) -> (data ref, info ref)``,
# which the actor manager calls again on a restarted actor (rayseq.distributed.groups.manager.Call)
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
