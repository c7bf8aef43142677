"""The three actor groups an algorithm's iteration is written against (``Algorithm.training_step``), each one class
whether its members run in this process (``rollout.num_workers=0``: debugging, unit tests) or as Ray actors in one
placement group (``is_local``, as RLlib's ``LearnerGroup``):

- :class:`RolloutGroup`: sample replies with behaviour log-probs (scored on the scorers when the reward is
  expensive); what an algorithm runs on the shards (SeqGAN's Monte-Carlo continuations). Receives the learner's
  weights.
- :class:`ScorerGroup`: rewards, and what an algorithm scores with a model of its own (SeqGAN's Q, D(Y)). Receives
  that model's weights.
- :class:`LearnerGroup`: updates, weights, state, evaluation, checkpoints.

:class:`ActorGroups` builds the three for a run (and its placement group) and is what ``training_step`` receives.
Methods are called in code, never by name strings. Fault recovery lives in :class:`~rayseq.distributed.manager.
ActorManager`, shared by the groups.

Data flows by reference (DESIGN.md "Data flow"): ``sample``, ``run_on_shards`` and ``run_on_pending`` return
per-shard handles (:mod:`rayseq.distributed.handles`: ObjectRefs under Ray, the objects in-process); the
learner fetches them. The driver holds references and metric dicts only (``recv_bytes`` counts what it fetches).
The protocols these classes meet, for the math layer's algorithms: :mod:`rayseq.algos.iteration`.
"""

from __future__ import annotations

import dataclasses
import logging
from functools import partial
from typing import Any

import numpy as np

from rayseq.config import RunConfig, config_to_dict
from rayseq.distributed.handles import resolve
from rayseq.distributed.learner import Learner
from rayseq.distributed.scorer import ScorerActor
from rayseq.distributed.worker import RolloutWorker
from rayseq.types import PromptBatch, PromptKeys, Rollout, RolloutRequest

log = logging.getLogger(__name__)


def _shard_seed(seed: int | None, shard: int) -> int | None:
    return None if seed is None else seed * 1009 + shard


def _shard_request(request: RolloutRequest, shard: int) -> RolloutRequest:
    return dataclasses.replace(request, seed=_shard_seed(request.seed, shard))


def _two(method):
    """A worker or scorer call with two return objects: (data, small info)."""
    return method.options(num_returns=2)


# -- the calls the groups send, as named builders: ``partial(builder, ...)`` is ``send(actor) -> (data ref, info ref)``,
# which the actor manager calls again on a restarted actor (rayseq.distributed.manager.Call)
def send_sample(prompts: PromptBatch | PromptKeys, request: RolloutRequest, score_here: bool, weights: dict,
                report: dict, worker):
    """Sample a shard on ``worker`` (scored there when ``score_here``), with the weights ``weights`` carries;
    ``prompts``: a keyed batch's keys (the worker reads the rows), else the batch."""
    return _two(worker.sample_shard).remote(prompts, request, score_here, **weights, **report)


def send_score(report: dict, rollout, scorer):
    """Score a sampled shard (its ref) on ``scorer``."""
    return _two(scorer.score_rollout_shard).remote(rollout, **report)


def send_run(fn, args: tuple, kwargs: dict, actor):
    """An algorithm's function on ``actor`` (a worker or a scorer): ``fn(actor, *args, **kwargs)``."""
    return _two(actor.run_shard).remote(fn, *args, **kwargs)


class LearnerGroup:
    """The learner: generator, baseline, optimizers, the frozen KL reference, the algorithm's own modules. One Learner
    in-process, or ``learner.num_learners`` Ray actors (rank 0 in placement bundle 0, ranks 1.. in the bundles after
    the scorers') in one torch.distributed process group, which each take their rows of every minibatch and sum
    their gradients (:mod:`rayseq.algos.parallel`): calls that change the training state go to every rank, calls
    that read it (weights, state, evaluation) to rank 0, which publishes the weights. Every method waits for its
    answer; a dead learner raises :class:`~rayseq.distributed.manager.LearnerLost` (the driver rebuilds the group,
    :meth:`restart`)."""

    kind = "learner"
    COLLECTIVE_TIMEOUT_S = 300.0  # how long a rank waits in a collective for the others (then its call fails)

    def __init__(self, cfg_dict: dict, *, manager=None, actor_options: list[dict] | None = None):
        self.is_local = manager is None
        self._manager = manager
        self.rollout: RolloutGroup | None = None  # set by ActorGroups: the group a chained update samples on
        self.actors: list = []
        self.sharded, self._peer_refs = False, []
        if self.is_local:
            self.local = Learner(cfg_dict)
        else:
            self._cfg_dict, self._actor_options = cfg_dict, actor_options
            self._start()

    def _start(self, wait_s: float | None = None) -> None:
        """Start the learner actors (and, with more than one, their process group: rank 0's address, then every
        rank joins). ``wait_s``: how long they may take to be placed and started (a bundle on a lost node waits
        for Ray to re-place it); None: as long as it takes (the placement group is ready)."""
        import ray

        self.actors = [ray.remote(Learner).options(**opts).remote(self._cfg_dict) for opts in self._actor_options]
        if wait_s is not None:
            try:
                ray.get([a.get_version.remote() for a in self.actors], timeout=wait_s)
            except ray.exceptions.GetTimeoutError:
                raise RuntimeError(f"the rebuilt learner actors did not start within {wait_s:.0f} s (available: "
                                   f"{ray.available_resources()}); --resume continues the run once the cluster can "
                                   "place them") from None
        self.actor = self.actors[0]
        self._manager.learner_ids = [a.actor_id.remote() for a in self.actors]  # tells their failures apart
        # sharded (learner.strategy=fsdp, several ranks): whatever reads the model is a collective, so every call goes
        # to every rank (rank 0's answer is the group's)
        self.sharded = len(self.actors) > 1 and self._cfg_dict["learner"]["strategy"] == "fsdp"
        self._peer_refs: list = []  # peers' parts of collectives whose answers only rank 0's counts (waited for later)
        self._version: int | None = None  # known from the last update (Ray); None: ask the learner
        self._published: tuple | None = None  # (version, FlatWeights ref) returned by the last update (Ray)
        world = len(self.actors)
        if world > 1:
            address, port = self._manager.get_learner([self.actor.rendezvous.remote()], self)[0]
            self._manager.get_learner([a.join_data_parallel.remote(rank, world, address, port,
                                                                   self.COLLECTIVE_TIMEOUT_S)
                                       for rank, a in enumerate(self.actors)], self)

    def _wait_peers(self) -> None:
        """Wait for the peers' parts of earlier collectives (a lost rank raises LearnerLost here)."""
        refs, self._peer_refs = self._peer_refs, []
        if refs:
            self._manager.get_learner(refs, self)

    def _rank0_ref(self, method):
        """A ref to rank 0's answer to ``method(actor)()`` (sharded: every rank takes part, the peers' answers waited
        for with the next call)."""
        refs = [method(a).remote() for a in (self.actors if self.sharded else self.actors[:1])]
        self._peer_refs.extend(refs[1:])
        return refs[0]

    def restart(self) -> None:
        """Replace every learner actor by a fresh one in its bundle (its state: the caller loads a checkpoint)."""
        ray = self._manager.ray
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self._start(wait_s=180.0)

    def _call(self, method, *args, keeps_version: bool = False, every_rank: bool = False):
        """``method(learner)`` (the Learner's bound method, or the actor's) with ``args``, waited for: on rank 0, or
        ``every_rank`` (what changes the training state; the arguments put in the object store once); rank 0's
        answer. A call that may change the weights version forgets the known one (asked again when needed)."""
        if self.is_local:
            return method(self.local)(*args)
        if not keeps_version:
            self._version = None
        self._wait_peers()
        actors = self.actors if every_rank or self.sharded else self.actors[:1]
        if len(actors) > 1:
            args = tuple(self._manager.ray.put(a) for a in args)
        return self._manager.get_learner([method(a).remote(*args) for a in actors], self)[0]

    # -- stages, state, checkpoints -----------------------------------------------------------------
    def start_stage(self, stage: str) -> None:
        return self._call(lambda a: a.start_stage, stage, every_rank=True)

    def state_dict(self) -> dict:
        """Rank 0's training state, fetched (tests, diagnostics; checkpoints are written by :meth:`save`)."""
        return self._call(lambda a: a.state_dict, keeps_version=True)

    def save(self, location: str, stem: str) -> dict:
        """The learners write their state into the run's checkpoints (``Learner.save``: rank 0, or with
        ``learner.strategy=fsdp`` every rank its shards); returns the files written and their SHA-256, the only thing
        that comes back."""
        if self.is_local or not self.sharded:
            return self._call(lambda a: a.save, location, stem, keeps_version=True)
        self._wait_peers()
        first, *others = self._manager.get_learner([a.save.remote(location, stem) for a in self.actors], self)
        return {**first, "files": {**first["files"], **{k: v for o in others for k, v in o["files"].items()}}}

    def whole_state(self) -> dict:
        """``Learner.whole_state`` (tests, diagnostics)."""
        return self._call(lambda a: a.whole_state, keeps_version=True)

    def restore(self, path: str) -> None:
        """Every rank loads its state from checkpoint ``path`` itself (``Learner.restore``)."""
        return self._call(lambda a: a.restore, path, every_rank=True)

    def load_state_dict(self, state: dict) -> None:
        return self._call(lambda a: a.load_state_dict, state, every_rank=True)

    def apply_config_lrs(self) -> dict:
        return self._call(lambda a: a.apply_config_lrs, keeps_version=True, every_rank=True)

    def init_from(self, path: str) -> dict:
        """Every rank starts from another run's checkpoint ``path`` (``Learner.init_from``); what was there."""
        return self._call(lambda a: a.init_from, path, every_rank=True)

    def evaluate(self, split: str = "val") -> tuple[dict, dict]:
        return self._call(lambda a: a.evaluate, split, keeps_version=True)

    def placement(self) -> dict:
        return self._call(lambda a: a.placement, keeps_version=True)

    # -- weights ----------------------------------------------------------------------------------
    def version(self) -> int:
        """The generator's weights version (its update count): known from the last update, else asked."""
        if self.is_local:
            return self.local.get_version()
        if self._version is None:
            self._version = self._call(lambda a: a.get_version, keeps_version=True)
        return self._version

    def scorer_version(self) -> int:
        """The version of what the scorers hold of the algorithm's (0: nothing)."""
        return self._call(lambda a: a.scorer_version, keeps_version=True)

    def get_weights(self) -> dict:
        """The published state dicts (the generator's and what the algorithm publishes with it), fetched (tests,
        diagnostics)."""
        return self._call(lambda a: a.get_weights, keeps_version=True)

    def weights_handle(self, version: int):
        """What the rollout group sends its workers for weights ``version``: the state dicts in-process; under Ray
        a FlatWeights ref, the one the last update returned when it is that version (no call), else fetched now."""
        if self.is_local:
            return self.local.get_weights()
        published = self._published
        if published is not None and published[0] == version:
            return published[1]
        self._wait_peers()
        return self._rank0_ref(lambda a: a.get_flat_weights)

    def scorer_weights_handle(self):
        """What the scorers load of the algorithm's (``{name: state dict}``; under Ray a ref to it)."""
        if self.is_local:
            return self.local.get_scorer_weights()
        self._wait_peers()
        return self._rank0_ref(lambda a: a.get_scorer_weights)

    # -- the algorithm's calls ----------------------------------------------------------------------
    def rollout_request(self, iteration: int, max_len: int, temperature: float, seed: int) -> RolloutRequest:
        """The request the learner's copy of the algorithm builds (state lives there: interpolation's λ)."""
        return self._call(lambda a: a.rollout_request, iteration, max_len, temperature, seed, keeps_version=True)

    def validate(self) -> dict:
        """The validation reward handed to the learner's algorithm (interpolation: keep or undo, anneal λ)."""
        return self._call(lambda a: a.validate, every_rank=True)

    def _sent(self, prompts: PromptBatch) -> PromptBatch | PromptKeys:
        """What the ranks get of ``prompts``: a keyed batch's keys when they are actors (their task reads the rows)."""
        return prompts if self.is_local else prompts.compact()

    def update_batch(self, batch: PromptBatch, iteration: int) -> dict:
        """A supervised update on ``batch`` (MLE pretraining, RAML, ...); its metrics."""
        return self._call(lambda a: a.update, self._sent(batch), iteration, every_rank=True)

    def aux_update(self, positives: PromptBatch, negatives: list, seed: int) -> dict:
        """The algorithm's update of a model of its own on real ``positives`` against sampled ``negatives`` (shard
        handles): ``Algorithm.aux_update``."""
        return self._call(lambda a: a.aux_update, self._sent(positives), negatives, seed, every_rank=True)

    def update(self, shards: list, iteration: int, scores: list | None = None, next_batch=None,
               rows=None) -> dict:
        """The rollout algorithm's update on the shard handles (the learner fetches them), with ``scores`` (per-shard
        handles the learner's algorithm gives the rollout, ``Algorithm.assign_scores``); returns its metrics (with
        ``time/sample_s``, the slowest worker's sampling, read from the shards). ``rows``: (N,) int64, the rows of
        the shards' concatenation to train on (dynamic sampling's kept groups); None: all.

        Under Ray the updated weights come back as a second object, kept in the object store for the workers' next
        calls; shards of ``sample(wait=False)`` may still be sampling (the learner starts on them as they arrive;
        a crashed worker's shard is sampled again and the update re-sent: :meth:`ActorManager.retry_update`).

        ``next_batch``: ``() -> (prompts, request)`` of the next iteration (the chained mode), drawn once the update
        is on its way and sent to the workers with the update's weights ref (the version it will make): each worker
        waits in the object store for the learner's weights and samples at once, with no round trip through the
        driver; ``RolloutGroup.take_ahead`` hands its shards over. In-process: drawn after the update and sampled by
        ``take_ahead`` with the weights published then."""
        rollout = self.rollout
        if self.is_local:
            metrics = self.local.update_rollout(shards, iteration, scores, rows)
            if next_batch is not None:
                rollout.sample_ahead(*next_batch())
            return metrics
        self._wait_peers()
        before = rollout.published() if next_batch is not None else None
        after = self.version() + 1 if next_batch is not None else None  # the version this update makes
        self._version = None
        drawn: list = []
        peers: list = []  # ranks 1..: the same update on their rows (their metrics are rank 0's)

        def submit(shards):
            metrics_ref, weights_ref = _two(self.actor.update_and_publish).remote(shards, iteration, scores, rows)
            peers[:] = [a.update_rollout.remote(shards, iteration, scores, rows) if not self.sharded else
                        _two(a.update_and_publish).remote(shards, iteration, scores, rows)[0]  # and the gathering
                        for a in self.actors[1:]]
            if next_batch is not None:
                drawn[:] = drawn or [next_batch()]  # drawn once (a retried update sends the same batch)
                rollout.publish(weights_ref, after)
                rollout.sample_ahead(*drawn[0])
            return metrics_ref, weights_ref

        def on_failure():  # the next batch went out with weights that never came: dropped (sent again on retry)
            if next_batch is not None:
                rollout.drop_ahead()
                rollout.publish(*before)

        metrics, weights_ref, shards = self._manager.retry_update(submit, shards, on_failure, self)
        self._manager.get_learner(peers, self)
        self._manager.forget(shards)  # sampled (the learner has them; it read their timings)
        self._manager.received(metrics)
        self._version = int(metrics["learner/version"])
        self._published = (self._version, weights_ref)
        if after is not None and after != self._version:  # the next batch's rollouts carry that version
            raise RuntimeError(f"the learner's update made weights version {self._version}, not {after}")
        return metrics


class RolloutGroup:
    """``rollout.num_workers`` RolloutWorkers (placement bundles 1..n), or one in-process: sample with the learner's
    published weights (each call carries them), and run an algorithm's functions on the sampled shards.

    Elastic under Ray: a batch is split over the live workers (``live``), shard j on the j-th of them with shard j's
    seed, so a run's batches do not depend on which worker samples them. A worker whose call failed and that Ray has
    not re-created within ``rollout.worker_grace_s`` (its node lost, no room elsewhere) is left out, its shard taken
    by another at once (:meth:`take_over`); it takes shards again from the first sampling after Ray re-created it."""

    kind = "worker"

    def __init__(self, cfg_dict: dict, learner: LearnerGroup, scorer: ScorerGroup | None = None, *, manager=None,
                 actors=None):
        self.is_local = manager is None
        self._manager = manager
        self._learner = learner
        self.scorer = scorer  # where sampled rollouts are scored when the reward is expensive
        self.first_bundle = 1
        if self.is_local:
            self.local = RolloutWorker(cfg_dict, 0)
            self.actors = []
        else:
            self.actors = actors
        self.live = list(range(len(self.actors)))  # the workers that take shards, in shard order
        self._out: dict[int, Any] = {}  # a worker left out -> its ping (answered once Ray has re-created it)
        self.grace_s = float(cfg_dict.get("rollout", {}).get("worker_grace_s", 30.0))
        self.version = -1
        self._weights_ref = None  # Ray: the FlatWeights ref of ``version``, carried by the next calls
        self._ahead: list | tuple | None = None  # the batch sent ahead: its refs (Ray) or (prompts, request)
        self.collective = None  # rollout.weight_sync=collective: the learner → workers group (Ray)
        rollout_cfg = cfg_dict.get("rollout", {})
        if not self.is_local and rollout_cfg.get("weight_sync") == "collective":
            from rayseq.distributed.weight_sync import CollectiveWeights

            self.collective = CollectiveWeights(self._manager.ray,
                                                int(float(rollout_cfg.get("weight_bucket_mb", 64.0)) * (1 << 20)),
                                                float(rollout_cfg.get("weight_sync_timeout_s", 60.0)))

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
        """rollout.weight_sync=collective: queue the learner's broadcast of ``version`` (behind its update) and the
        workers' receive (ahead of their next calls, which still carry the object-store ref: read only where the
        broadcast failed)."""
        if self.collective is not None and version > self.version:
            self.collective.broadcast(self._learner.actor, self.live_actors, version,
                                      (self._manager.restarts, tuple(self.live)))

    def published(self) -> tuple:
        """(ref, version) the next calls carry (what :meth:`publish` may restore)."""
        return self._weights_ref, self.version

    def forget_weights(self) -> None:
        """The published weights are gone (a rebuilt learner): the next :meth:`sync_weights` publishes anew."""
        self._weights_ref, self.version = None, -1
        if self.collective is not None:
            self.collective.forget()

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
        """Shard ``shard``'s call, sent to worker ``worker`` (:class:`~rayseq.distributed.manager.Call`)."""
        from rayseq.distributed.manager import Call

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
            except ray.exceptions.RayActorError:  # ActorUnavailableError among them
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
            return [self.local.sample(prompts, _shard_request(request, 0))]
        if wait:
            return self._sample_waited(prompts, request)[0]
        from rayseq.distributed.manager import Call, PendingShard

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

    def sample_ahead(self, prompts: PromptBatch, request: RolloutRequest) -> None:
        """The next iteration's batch, sent ahead: under Ray its calls go out now (with the weights last
        :meth:`publish`-ed); in-process it is kept and sampled by :meth:`take_ahead` with the weights then."""
        self._ahead = (prompts, request) if self.is_local else self.sample(prompts, request, wait=False)

    def take_ahead(self) -> list:
        """The shard handles of the batch sent ahead (:meth:`sample_ahead`): under Ray sampling or sampled;
        in-process sampled now."""
        ahead, self._ahead = self._ahead, None
        return self.sample(*ahead) if self.is_local else ahead

    def drop_ahead(self) -> None:
        """Forget the batch sent ahead (its weights never came: the update it went out with failed)."""
        if not self.is_local:
            self._manager.forget(self._ahead)
        self._ahead = None

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
        samples = [partial(send_sample, shard.compact(), _shard_request(request, i), not scorers, weights,
                           {} if scorers else report) for i, shard in enumerate(shards)]
        return samples, partial(partial, send_score, report), scorers

    def _sample_waited(self, prompts: PromptBatch, request: RolloutRequest, report_score: bool = False) -> tuple:
        """Ray: (shard refs, each shard's final info), every call waited for (a crashed actor's re-sent); a shard goes
        to its scorer as soon as it is sampled."""
        from rayseq.distributed.manager import Call

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
            return [self.local.run_shard(fn, Rollout.concat(shards), *args, seed=_shard_seed(seed, 0))]
        weights = self._weights()
        sends = [partial(send_run, fn, (shard, *args), {"seed": _shard_seed(seed, i), **weights})
                 for i, shard in enumerate(shards)]
        return [self._call(i, self.live[i % len(self.live)], send) for i, send in enumerate(sends)]

    def stats(self) -> list[dict]:
        """Each worker's stats, after it has loaded the published weights (it may not have needed them yet)."""
        if self.is_local:
            return [self.local.stats()]
        ray = self._manager.ray
        if self._weights_ref is not None:
            ray.get([w.set_weights.remote([self._weights_ref], self.version) for w in self.live_actors])
        return self._manager.received(ray.get([w.stats.remote() for w in self.live_actors]))


class ScorerGroup:
    """``scorer.num_scorers`` ScorerActors (bundles after the workers'), or one in-process (an algorithm that scores
    with a model of its own): rewards that are expensive or configured, and what the algorithm scores with the
    weights the learner publishes for them."""

    kind = "scorer"

    def __init__(self, cfg: RunConfig, cfg_dict: dict, learner: LearnerGroup, *, manager=None, actors=None):
        self.is_local = manager is None
        self._manager = manager
        self._learner = learner
        self.first_bundle = 1 + cfg.rollout.num_workers
        self.local = ScorerActor(cfg_dict, 0) if self.is_local and cfg.algorithm.own_reward else None
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
        if self.is_local:
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
        from rayseq.distributed.manager import Call

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
        from rayseq.distributed.manager import Call

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


class ActorGroups:
    """A run's three groups (``learner``, ``rollout``, ``scorer``): in-process with ``rollout.num_workers=0``, else
    ``learner.num_learners`` Learner actors, ``rollout.num_workers`` RolloutWorker actors and ``scorer.num_scorers``
    ScorerActors (when the run has scorers: an algorithm with a reward of its own, expensive or configured rewards)
    in one placement group (``rollout.placement_strategy``: PACK or SPREAD over the nodes).

    ``placement_group``: reserve elsewhere (a Tune trial's ``tune.PlacementGroupFactory``, built by
    :func:`rayseq.distributed.runtime.bundles`) and pass it in; its bundle 0 is the learner's (rank 0), bundles
    1..n the workers', then the scorers', then the other learner ranks'. Otherwise one is created here. Workers and
    scorers are restarted by Ray after a crash (``max_restarts``) and their calls re-sent
    (:class:`~rayseq.distributed.manager.ActorManager`); a lost node's workers and scorers are re-created on the
    surviving nodes (:mod:`rayseq.distributed.nodes`); a dead learner actor is rebuilt by the driver
    (:meth:`restart_learner`, ``learner.max_restarts``); losing the learner's node ends the run with
    :class:`~rayseq.distributed.nodes.NodeLost` naming it."""

    def __init__(self, cfg: RunConfig, placement_group=None):
        d = config_to_dict(cfg)
        self.is_local = cfg.rollout.num_workers == 0
        self.manager = None
        if self.is_local:
            self.learner = LearnerGroup(d)
            self.rollout = RolloutGroup(d, self.learner)  # built before the scorer: the global RNG draws as before
            self.scorer = self.rollout.scorer = ScorerGroup(cfg, d, self.learner)
            # one process: every constructor set the process-wide thread count; the learner's applies
            import torch

            torch.set_num_threads(cfg.learner.torch_threads)
        else:
            self._start_ray_actors(cfg, d, placement_group)
        self.learner.rollout = self.rollout

    def _start_ray_actors(self, cfg: RunConfig, d: dict, placement_group) -> None:
        import ray
        from ray.util.placement_group import placement_group as make_pg
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from rayseq.distributed.manager import ActorManager
        from rayseq.distributed.nodes import Placement
        from rayseq.distributed.runtime import bundles, init_ray

        self._ray = ray
        r, lc, sc = cfg.rollout, cfg.learner, cfg.scorer
        wanted = bundles(cfg)
        self._started_ray = init_ray(min_cpus=sum(b["CPU"] for b in wanted))
        self._own_pg = placement_group is None
        if placement_group is None:
            placement_group = make_pg(wanted, strategy=r.placement_strategy)
            try:
                ray.get(placement_group.ready(), timeout=120)
            except ray.exceptions.GetTimeoutError:
                raise RuntimeError(
                    f"cluster cannot reserve {wanted} "
                    f"(available: {ray.available_resources()}); lower rollout.num_workers, scorer.num_scorers "
                    "or their num_cpus_per_* / learner.num_cpus (and custom resources: learner.resources, "
                    "rollout.resources_per_worker, scorer.resources_per_scorer)"
                ) from None
        self.pg = placement_group
        self.placement = Placement(placement_group)

        def strategy(i):
            return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=i)

        def stateless_actors(cls, count: int, first_bundle: int, cpus: float, gpus: float) -> list:
            """Workers / scorers: restarted by Ray after a crash, their calls re-sent by the manager."""
            return [
                ray.remote(cls).options(num_cpus=cpus, num_gpus=gpus, max_restarts=r.max_restarts, max_task_retries=0,
                                        scheduling_strategy=strategy(first_bundle + i)).remote(d, i)
                for i in range(count)
            ]

        self.manager = manager = ActorManager(ray, self.placement)
        n, m = r.num_workers, cfg.num_scorers
        # rank 0 in bundle 0, ranks 1.. after the scorers' bundles (bundles())
        learner_bundles = [0, *range(1 + n + m, n + m + lc.num_learners)]
        self.learner = LearnerGroup(d, manager=manager, actor_options=[
            {"num_cpus": lc.num_cpus, "num_gpus": lc.num_gpus, "scheduling_strategy": strategy(i)}
            for i in learner_bundles])
        workers = stateless_actors(RolloutWorker, n, 1, r.num_cpus_per_worker, r.num_gpus_per_worker)
        scorers = stateless_actors(ScorerActor, m, 1 + n, sc.num_cpus_per_scorer, sc.num_gpus_per_scorer)
        self.scorer = ScorerGroup(cfg, d, self.learner, manager=manager, actors=scorers)
        self.rollout = RolloutGroup(d, self.learner, self.scorer, manager=manager, actors=workers)

    @property
    def remote(self) -> bool:
        return not self.is_local

    @property
    def restarts(self) -> int:
        """Worker and scorer restarts so far (0 in-process)."""
        return 0 if self.manager is None else self.manager.restarts

    @property
    def recv_bytes(self) -> int:
        """Pickled size of everything the driver fetched from the actors (0 in-process: nothing crosses)."""
        return 0 if self.manager is None else self.manager.recv_bytes

    def restart_learner(self) -> None:
        """A learner actor died (:class:`~rayseq.distributed.manager.LearnerLost`): every learner actor is replaced
        by a fresh one and the other groups forget what went out with it (:meth:`ActorManager.recover_learner`); the
        caller loads the latest checkpoint."""
        self.manager.recover_learner(self)

    def fetch(self, handles: list) -> list:
        """The objects behind shard handles, fetched to the driver (tests, benchmarks; the loop never does)."""
        return list(handles) if self.is_local else self.manager.received(resolve(handles))

    def shutdown(self) -> None:
        if self.is_local:
            return
        ray = self._ray
        for a in [*self.learner.actors, *self.rollout.actors, *self.scorer.actors]:
            ray.kill(a)
        if self._own_pg:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.pg)
        if self._started_ray:
            ray.shutdown()
