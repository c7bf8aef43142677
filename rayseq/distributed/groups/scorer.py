"""The scorer group: ``scorer.num_scorers`` ScorerActors, or one in-process (:class:`ScorerGroup`)."""

from __future__ import annotations

from functools import partial

from rayseq.config import RunConfig
from rayseq.distributed.actors.scorer import ScorerActor
from rayseq.distributed.groups.calls import send_run
from rayseq.distributed.groups.learner import LearnerGroup
from rayseq.types import Rollout


class ScorerGroup:
    """``scorer.num_scorers`` ScorerActors (bundles after the workers'), or one in-process (an algorithm that scores
    with a model of its own): rewards that are expensive or configured, and what the algorithm scores with the
    weights the learner publishes for them."""

    kind = "scorer"
    elastic = False  # a failed scorer's call waits for Ray to re-create it

    def __init__(self, cfg: RunConfig, learner: LearnerGroup, *, manager=None, actors=None):
        self.is_local = manager is None
        self._manager = manager
        self._learner = learner
        self.first_bundle = 1 + cfg.rollout.num_workers
        self.local = ScorerActor(cfg, 0) if self.is_local and cfg.algorithm.own_reward else None
        self.actors = [] if self.is_local else actors
        # sampled rollouts go to the scorers for their reward (else the workers score them)
        self.scores_rollouts = cfg.rollouts_scored_remotely and len(self.actors) > 0
        self.weights_version = -1
        self._weights_ref = None

    def sync_weights(self) -> None:
        """Publish what the learner's algorithm has the scorers hold (one object per version) to every scorer."""
        version = self._learner.scorer_version()
        if version == self.weights_version:
            return
        if self.is_local:  # without a local scorer, the in-process learner loaded them where the replies are scored
            if self.local is not None:
                self.local.set_weights(self._learner.scorer_weights_handle(), version)
            self.weights_version = version
            return
        self._weights_ref = self._learner.scorer_weights_handle()
        self.weights_version = version
        refs = [s.set_weights.remote(self._weights_ref, version) for s in self.actors]
        for i, ref in enumerate(refs):
            self._manager.get(self, i, ref,
                              lambda j: self.actors[j].set_weights.remote(self._weights_ref, self.weights_version))

    def restore(self, actor) -> None:
        """A restarted scorer gets the current weights (ActorManager)."""
        if self._weights_ref is not None:
            self._manager.ray.get(actor.set_weights.remote(self._weights_ref, self.weights_version))

    def forget_weights(self) -> None:
        """The published weights are gone (a rebuilt learner): the next :meth:`sync_weights` publishes anew."""
        self.weights_version, self._weights_ref = -1, None

    def run_on_pending(self, fn, pending: list) -> tuple[list, list]:
        """``fn(scorer, data) -> (result, info)`` on the data of each pending call of
        :meth:`RolloutGroup.run_on_shards`: shard i's on scorer i mod m as soon as it exists. Returns the per-shard
        result handles and infos."""
        if self.is_local:
            ((data, _),) = pending  # run_on_shards' one in-process (data, info)
            result, info = self.local.run_shard(fn, data)
            return [result], [info]
        from rayseq.distributed.groups.calls import Call

        n_scorers = len(self.actors)
        running: list = [None] * len(pending)
        for call, (data, _) in self._manager.as_completed(pending):  # each goes to its scorer once computed
            send = partial(send_run, fn, (data,), {})
            running[call.index] = Call(self, call.index, send(self.actors[call.index % n_scorers]), send,
                                       call.index % n_scorers)
        out = self._manager.wait_all(running)
        return [r for r, _ in out], [info for _, info in out]

    def run_on_shards(self, fn, shards: list) -> tuple[list, list]:
        """``fn(scorer, shard) -> (result, info)`` on each rollout shard (shard i on scorer i mod m; in-process the
        rollout as one shard). Returns the per-shard result handles and infos."""
        if self.is_local:
            result, info = self.local.run_shard(fn, Rollout.concat(shards))
            return [result], [info]
        from rayseq.distributed.groups.calls import Call

        n_scorers = len(self.actors)
        sends = [partial(send_run, fn, (shard,), {}) for shard in shards]
        calls = [Call(self, i, send(self.actors[i % n_scorers]), send, i % n_scorers) for i, send in enumerate(sends)]
        out = self._manager.wait_all(calls)
        return [r for r, _ in out], [info for _, info in out]

    def stats(self) -> list[dict]:
        if self.is_local:
            return [self.local.stats()] if self.local is not None else []
        ray = self._manager.ray
        return self._manager.received(ray.get([s.stats.remote() for s in self.actors]))
