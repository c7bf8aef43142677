"""The rollout group: ``rollout.num_workers`` RolloutWorker actors, or one in-process (:class:`RolloutGroup`)."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import numpy as np

from rayseq.config import RunConfig
from rayseq.distributed.actors.worker import RolloutWorker
from rayseq.distributed.groups.calls import send_run, send_sample, send_score, shard_request, shard_seed
from rayseq.distributed.groups.learner import LearnerGroup
from rayseq.distributed.groups.scorer import ScorerGroup
from rayseq.distributed.weights.transport import make_transport
from rayseq.types import PromptBatch, Rollout, RolloutRequest

log = logging.getLogger(__name__)


class RolloutGroup:
    """``rollout.num_workers`` RolloutWorkers (placement bundles 1..n), or one in-process: sample with the learner's
    published weights (each call carries them), and run an algorithm's functions on the sampled shards.

    Elastic under Ray: a batch is split over the live workers (``live``), shard j on the j-th of them with shard j's
    seed, so a run's batches do not depend on which worker samples them. A worker whose call failed and that Ray has
    not re-created within ``rollout.worker_grace_s`` (its node lost, no room elsewhere) is left out, its shard taken
    by another at once (:meth:`take_over`); it takes shards again from the first sampling after Ray re-created it."""

    kind = "worker"
    elastic = True  # a failed worker not back within grace_s is left out, its shard taken by another (take_over)

    def __init__(self, cfg: RunConfig, learner: LearnerGroup, scorer: ScorerGroup | None = None, *, manager=None,
                 actors=None):
        self.is_local = manager is None
        self._manager = manager
        self._learner = learner
        self.scorer = scorer  # where sampled rollouts are scored when the reward is expensive
        self.first_bundle = 1
        if self.is_local:
            self.local = RolloutWorker(cfg, 0)
            self.actors = []
        else:
            self.actors = actors
        self.live = list(range(len(self.actors)))  # the workers that take shards, in shard order
        self._out: dict[int, Any] = {}  # a worker left out -> its ping (answered once Ray has re-created it)
        self.grace_s = cfg.rollout.worker_grace_s
        self.version = -1
        self._weights_ref = None  # Ray: the FlatWeights ref of ``version``, carried by the next calls
        # what carries a new version to the workers besides the reference their calls carry (rollout.weight_sync)
        self.transport = make_transport(cfg.rollout, None if self.is_local else self._manager.ray)

    # -- weights ----------------------------------------------------------------------------------
    def sync_weights(self) -> None:
        """Publish the learner's weights, tagged with its update count (what ``rollout/staleness`` compares
        against): in-process loaded now; under Ray one object per version, which the workers' next calls carry
        (no call of its own)."""
        version = self._learner.version()
        if version == self.version:
            return
        if self.is_local:
            self.local.set_weights(self._learner.weights_handle(version), version)
        else:
            self._weights_ref = self._learner.weights_handle(version)
            self._broadcast(version)
        self.version = version

    def publish(self, ref, version: int) -> None:
        """Ray: the workers' next calls carry the weights ``ref`` of ``version`` (one the learner is still making:
        the calls wait for it in the object store)."""
        if version > self.version:
            self._broadcast(version)
        self._weights_ref, self.version = ref, version

    def _broadcast(self, version: int) -> None:
        """Hand a new ``version`` to the transport (rollout.weight_sync=collective: the learner's broadcast queued
        behind its update, the workers' receive ahead of their next calls, which still carry the object-store ref:
        read only where the broadcast failed)."""
        if version > self.version:
            self.transport.broadcast(self._learner, self.live_actors, version,
                                     (self._manager.restarts, tuple(self.live)))

    def published(self) -> tuple:
        """(ref, version) the next calls carry (what :meth:`publish` may restore)."""
        return self._weights_ref, self.version

    def forget_weights(self) -> None:
        """The published weights are gone (a rebuilt learner): the next :meth:`sync_weights` publishes anew."""
        self._weights_ref, self.version = None, -1
        self.transport.forget()

    def _weights(self) -> dict:
        """The keyword arguments that send the current weights with a worker call."""
        return {"weights": [self._weights_ref], "version": self.version} if self._weights_ref is not None else {}

    def restore(self, actor) -> None:
        """A restarted worker gets the current weights (ActorManager)."""
        self._manager.ray.get(actor.set_weights.remote(self._weights_ref, self.version))

    # -- the live workers ---------------------------------------------------------------------------
    @property
    def live_actors(self) -> list:
        return [self.actors[i] for i in self.live]

    def _call(self, shard: int, worker: int, send):
        """Shard ``shard``'s call, sent to worker ``worker`` (:class:`~rayseq.distributed.groups.calls.Call`)."""
        from rayseq.distributed.groups.calls import Call

        return Call(self, shard, send(self.actors[worker]), send, worker)

    def take_over(self, i: int, ping) -> int | None:
        """Worker ``i`` failed and is not back (``ping``: a call answered once Ray has re-created it): it is left
        out, and the live worker after it takes its work; None if no worker is left (the caller waits for Ray)."""
        others = [w for w in self.live if w != i]
        if not others:
            return None
        self.live, self._out[i] = others, ping
        j = next((w for w in self.live if w > i), self.live[0])
        log.warning("rollout worker %d is not back after %.0f s; worker %d takes its shard, and the batches are split "
                    "over %d of %d workers until it is back", i, self.grace_s, j, len(self.live), len(self.actors))
        return j

    def _refresh(self) -> None:
        """Workers left out that Ray has re-created since take shards again (with the current weights)."""
        if not self._out:
            return
        ray = self._manager.ray
        ready, _ = ray.wait(list(self._out.values()), num_returns=len(self._out), timeout=0)
        ready = set(ready)
        for i, ping in list(self._out.items()):
            if ping not in ready:
                continue
            try:
                ray.get(ping)
                self.restore(self.actors[i])
            except ray.exceptions.RayActorError as exc:  # ActorUnavailableError among them
                # re-created, and its constructor raised: it will not come back (StartupFailed ends the run)
                self._manager.check_started(exc, f"rollout worker {i}", self.first_bundle + i, again=True)
                self._out[i] = self.actors[i].pid.remote()  # not back (or gone for good): asked again next time
                continue
            del self._out[i]
            self.live = sorted([*self.live, i])
            log.warning("rollout worker %d is back: the batches are split over %d of %d workers", i, len(self.live),
                        len(self.actors))

    # -- sampling ---------------------------------------------------------------------------------
    def sample(self, prompts: PromptBatch, request: RolloutRequest, wait: bool = True) -> list:
        """Shard handles of one reply per prompt (shard i sampled on worker i; in-process one shard, sampled now,
        whatever ``wait`` says). With scorer actors (expensive rewards) each shard is scored on scorer i mod m as
        soon as it is sampled.

        ``wait=False`` (Ray): returns the refs at once, while the workers sample (and the scorers score, each call
        chained on its worker's result by reference); the learner's update (or ``confirm``) waits for them and
        re-sends a crashed worker's shard (and its scoring) or a crashed scorer's call."""
        if self.is_local:
            return [self.local.sample(prompts, shard_request(request, 0))]
        if wait:
            return self._sample_waited(prompts, request)[0]
        from rayseq.distributed.groups.calls import Call, PendingShard

        samples, rescore, scorers = self._calls(prompts, request)
        n_scorers = len(scorers)
        refs = []  # each scorer call (if any) is chained on its worker's result by reference, no wait here
        for i, (w, send) in enumerate(zip(self.live, samples)):
            pending = PendingShard(self._call(i, w, send), rescore=rescore)
            if n_scorers:
                score = rescore(pending.sample.refs[0])
                pending.score = Call(self.scorer, i % n_scorers, score(scorers[i % n_scorers]), score)
            self._manager.track(pending.result, pending)
            refs.append(pending.result)
        return refs

    def sample_scored(self, prompts: PromptBatch, request: RolloutRequest) -> tuple[list, list, list]:
        """:meth:`sample`, waited for, with each shard's rewards (B_i,) float32 (``Rollout.score``, the task's or the
        configured reward) and its reward terms (B_i, K) (``Rollout.term_scores``; None without ``reward.*``): under
        Ray in the calls' small info (the replies stay in the object store)."""
        if self.is_local:
            shards = self.sample(prompts, request)
            return shards, [np.array(shards[0].score)], [shards[0].term_scores]
        shards, infos = self._sample_waited(prompts, request, report_score=True)
        return shards, [np.asarray(i["score"]) for i in infos], [i["term_scores"] for i in infos]

    def _calls(self, prompts: PromptBatch, request: RolloutRequest, report_score: bool = False) -> tuple:
        """The Ray calls of one sampling: (worker i's ``send`` per shard, ``rescore(rollout) -> send`` of a scorer's
        call on a sampled shard, the scorers that score rollouts (none: the workers do))."""
        self._refresh()
        shards = prompts.split(len(self.live))
        scorers = self.scorer.actors if self.scorer.scores_rollouts else []
        report = {"report_score": True} if report_score else {}
        weights = self._weights()
        samples = [partial(send_sample, shard.compact(), shard_request(request, i), not scorers, weights,
                           {} if scorers else report) for i, shard in enumerate(shards)]
        return samples, partial(partial, send_score, request.sampler, report), scorers

    def _sample_waited(self, prompts: PromptBatch, request: RolloutRequest, report_score: bool = False) -> tuple:
        """Ray: (shard refs, each shard's final info), every call waited for (a crashed actor's re-sent); a shard goes
        to its scorer as soon as it is sampled."""
        from rayseq.distributed.groups.calls import Call

        manager = self._manager
        samples, rescore, scorers = self._calls(prompts, request, report_score)
        n_scorers = len(scorers)
        calls = [self._call(i, w, send) for i, (w, send) in enumerate(zip(self.live, samples))]
        out: list = [None] * len(calls)
        infos: list = [None] * len(calls)
        for call, (rollout, info) in manager.as_completed(calls):  # a shard goes on to its scorer once sampled
            out[call.index], infos[call.index] = rollout, info
            if n_scorers:
                score, j = rescore(rollout), call.index % n_scorers
                out[call.index] = Call(self.scorer, j, score(scorers[j]), score)
        if n_scorers:
            scored = manager.wait_all(out)
            out, infos = [r for r, _ in scored], [info for _, info in scored]
        return out, infos

    def confirm(self, shards: list) -> list:
        """``shards`` once sampled (the calls of ``sample(wait=False)`` waited for, a crashed worker's re-sent)."""
        return list(shards) if self.is_local else self._manager.confirm(shards)

    def run_on_shards(self, fn, shards: list, *args, seed: int) -> list:
        """``fn(worker, shard, *args, seed=shard seed) -> (data, info)`` on each of the rollout ``shards``: shard i on
        the i-th live worker (where it was sampled, if none was lost since; in-process the rollout as one shard), with
        the published weights. Returns pending calls for :meth:`ScorerGroup.run_on_pending`, which takes each one's
        result as soon as it exists."""
        if self.is_local:
            return [self.local.run_shard(fn, Rollout.concat(shards), *args, seed=shard_seed(seed, 0))]
        weights = self._weights()
        sends = [partial(send_run, fn, (shard, *args), {"seed": shard_seed(seed, i), **weights})
                 for i, shard in enumerate(shards)]
        return [self._call(i, self.live[i % len(self.live)], send) for i, send in enumerate(sends)]

    def decode_held_out(self, decodes: list, weights, version: int) -> list:
        """An evaluation's decodes (:class:`~rayseq.tasks.evaluation.EvalDecode`) on the live workers, decode k on
        the (k mod live)-th, each with the weights ``weights`` (a ref) of ``version`` (the learners' last published:
        the calls carry them, and the group's own published weights, which the next samplings carry, are left as
        they are). Returns the refs of each decode's (tokens, mask) and each one's info (``worker``, ``pid``, ``rows``,
        ``decode_s``), in the order of ``decodes``, once all are done.
        Elastic as sampling: a worker that fails is waited for (``rollout.worker_grace_s``) or left out, its decodes
        sent to another (:meth:`ActorManager.get`); the decodes do not depend on which worker runs them."""
        if self.is_local:
            raise RuntimeError("in-process runs evaluate on the learner (RolloutGroup.decode_held_out: Ray workers)")
        from rayseq.distributed.actors.worker import decode_held_out

        self._refresh()
        carry = {"weights": [weights], "version": version}
        calls = [self._call(k, self.live[k % len(self.live)], partial(send_run, decode_held_out, (d,), carry))
                 for k, d in enumerate(decodes)]
        done = self._manager.wait_all(calls)
        return [ref for ref, _ in done], [info for _, info in done]

    def stats(self) -> list[dict]:
        """Each worker's stats, after it has loaded the published weights (it may not have needed them yet)."""
        if self.is_local:
            return [self.local.stats()]
        ray = self._manager.ray
        if self._weights_ref is not None:
            ray.get([w.set_weights.remote([self._weights_ref], self.version) for w in self.live_actors])
        return self._manager.received(ray.get([w.stats.remote() for w in self.live_actors]))
