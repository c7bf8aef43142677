"""Where the learner and the rollout workers run: Ray actors in one placement group, or in-process.

The driver loop (:mod:`rayseq.distributed.driver`) talks to a runtime through a few calls —
``learner(method, *args)``, ``sync_weights(version)``, ``sample(prompts, request)``, and for SeqGAN
``sync_disc(version)``, ``mc_q(shards, n, temperature, seed)`` and ``disc_scores(shards)``, then ``shutdown()`` —
so the distributed path and the in-process path (``rollout.num_workers=0``) run the same algorithm code.

Data flows by reference (DESIGN.md "Data flow"): ``sample``, ``mc_q`` and ``disc_scores`` return per-shard
handles (:mod:`rayseq.distributed.handles`: ObjectRefs under Ray, the objects in-process) and small info dicts;
the handles go on to the scorers and to the learner (``learner("update_rollout", shards, ...)``), which fetch the
data from the object store. The driver holds references and metric dicts only (``recv_bytes`` counts what it
fetches).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import pickle
import time

from rayseq.config import RunConfig, config_to_dict
from rayseq.distributed.handles import resolve
from rayseq.distributed.learner import Learner
from rayseq.distributed.nodes import Placement
from rayseq.distributed.scorer import ScorerActor
from rayseq.distributed.worker import RolloutWorker
from rayseq.types import PromptBatch, Rollout, RolloutRequest

log = logging.getLogger(__name__)


def _shard_seed(seed: int | None, shard: int) -> int | None:
    return None if seed is None else seed * 1009 + shard


def _shard_request(request: RolloutRequest, shard: int) -> RolloutRequest:
    return dataclasses.replace(request, seed=_shard_seed(request.seed, shard))


class LocalRuntime:
    """Everything in this process (debugging, unit tests, ``rollout.num_workers=0``)."""

    remote = False

    def __init__(self, cfg: RunConfig):
        d = config_to_dict(cfg)
        self._learner = Learner(d)
        self._worker = RolloutWorker(d, 0)
        self._scorer = ScorerActor(d, 0) if cfg.is_gan else None
        # one process: every constructor set the process-wide thread count; the learner's applies
        import torch

        torch.set_num_threads(cfg.learner.torch_threads)
        self.version = -1
        self.disc_version = -1
        self.restarts = 0
        self.recv_bytes = 0  # nothing crosses a process boundary here
        self._next_batch: tuple | None = None

    def learner(self, method: str, *args):
        return getattr(self._learner, method)(*args)

    def fetch(self, handles: list) -> list:
        """The objects behind shard handles (here: the handles themselves)."""
        return list(handles)

    def learner_version(self) -> int:
        """The learner's weights version (its update count)."""
        return self._learner.get_version()

    def update(self, shards: list, iteration: int, scores: dict | None = None, next_batch=None) -> dict:
        """The learner's rollout update on the shards (``Learner.update_rollout``); its metrics. ``next_batch``:
        ``() -> (prompts, request)``, drawn after the update and sampled by :meth:`take_next` (here: then, with the
        weights the driver publishes before it)."""
        m = self._learner.update_rollout(shards, iteration, scores)
        self._next_batch = None if next_batch is None else next_batch()
        return m

    def take_next(self) -> list:
        """The shards of the last update's ``next_batch``."""
        batch, self._next_batch = self._next_batch, None
        return self.sample(*batch)

    def sync_weights(self, version: int) -> None:
        if version != self.version:
            self._worker.set_weights(self._learner.get_weights(), version)
            self.version = version

    def sample(self, prompts: PromptBatch, request: RolloutRequest, wait: bool = True) -> list:
        """The rollout as one shard: ``[rollout]`` (sampled now, whatever ``wait`` says)."""
        return [self._worker.sample(prompts, _shard_request(request, 0))]

    def confirm(self, shards: list) -> list:
        return list(shards)

    def sync_disc(self, version: int) -> None:
        if version != self.disc_version:
            self._scorer.set_disc_weights(self._learner.get_disc_weights(), version)
            self.disc_version = version

    def mc_q(self, shards: list, n_rollouts: int, temperature: float, seed: int) -> tuple[list, dict]:
        """SeqGAN's Q (B, T) of the rollout ``shards`` (one shard in-process), as ``[q]``, and timings."""
        batch = self._worker.mc_search(Rollout.concat(shards), n_rollouts, temperature, _shard_seed(seed, 0))
        q, info = self._scorer.score_mc(batch)
        return [q], {"mc_s": batch.info["mc_s"], "score_s": info["score_s"]}

    def disc_scores(self, shards: list) -> tuple[list, dict]:
        """D(Y) (B,) of the rollout ``shards``' sequences, as ``[d]``, and timings."""
        d, info = self._scorer.score_sequences(Rollout.concat(shards))
        return [d], {"score_s": info["score_s"]}

    def worker_stats(self) -> list[dict]:
        return [self._worker.stats()]

    def shutdown(self) -> None:
        pass


def init_ray(min_cpus: float = 1.0, **kwargs) -> bool:
    """Join the cluster named by RAY_ADDRESS (``ray job submit`` sets it; ``auto`` = the local one),
    else start an embedded one.

    Returns True if this call started Ray.
    """
    import ray

    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **kwargs)
    else:
        # "local": always a new embedded instance, even if `ray start` left a cluster on this machine
        # (join that one with RAY_ADDRESS=auto)
        num_cpus = max(os.cpu_count() or 1, int(-(-min_cpus // 1)))
        # Ray 2.60's notice that a new local cluster has token authentication on: noise for the cluster rayseq
        # starts and stops itself (a cluster you start with `ray start` keeps it)
        with dropping_log_messages("ray._private.authentication.authentication_token_setup",
                                   "Token authentication is enabled for this Ray cluster"), agent_on_a_free_port():
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **kwargs)
    return True


@contextlib.contextmanager
def agent_on_a_free_port():
    """While inside, a Ray node started by ``ray.init`` gives its dashboard agent a free port, not Ray's fixed 52365:
    that is the port a ``ray start --head`` on the same machine needs for ``ray job submit`` ("No available agent to
    submit job" while an embedded instance holds it). ``ray.init`` has no argument for it; its node parameters do."""
    from ray._private import parameter

    init = parameter.RayParams.__init__
    if "dashboard_agent_listen_port" not in inspect.signature(init).parameters:  # another Ray: leave it as it is
        yield
        return

    @functools.wraps(init)
    def free_port(self, *args, **kwargs):
        kwargs.setdefault("dashboard_agent_listen_port", 0)  # 0: the agent binds a free port and reports it
        init(self, *args, **kwargs)

    parameter.RayParams.__init__ = free_port
    try:
        yield
    finally:
        parameter.RayParams.__init__ = init


@contextlib.contextmanager
def dropping_log_messages(logger_name: str, *prefixes: str):
    """While inside, records of logger ``logger_name`` whose message starts with one of ``prefixes`` are dropped
    (that logger's other records, and every other logger, untouched)."""

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(prefixes)

    logger = logging.getLogger(logger_name)
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


class RayRuntime:
    """One Learner actor, ``rollout.num_workers`` RolloutWorker actors and (SeqGAN) ``scorer.num_scorers``
    ScorerActors in one placement group (``rollout.placement_strategy``: PACK or SPREAD over the nodes).

    Weights go out once per version: the learner's ``get_weights`` result lives in the object store
    and every worker receives the same ObjectRef. A worker that crashes is restarted by Ray
    (``max_restarts``); its shard is re-sent after it has been given the current weights. A lost node's
    workers and scorers are re-created by Ray on the surviving nodes (:mod:`rayseq.distributed.nodes`); losing the
    learner's node ends the run with :class:`~rayseq.distributed.nodes.NodeLost` naming that node.

    ``placement_group``: reserve elsewhere (a Tune trial's ``tune.PlacementGroupFactory``, built by
    :func:`bundles`) and pass it in; its bundle 0 is the learner's, bundles 1..n the workers', then the
    scorers'. Otherwise one is created here.
    """

    remote = True

    def __init__(self, cfg: RunConfig, placement_group=None):
        import ray
        from ray.util.placement_group import placement_group as make_pg
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._ray = ray
        r, lc, sc = cfg.rollout, cfg.learner, cfg.scorer
        n, m = r.num_workers, cfg.num_scorers
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

        d = config_to_dict(cfg)
        self._learner = (
            ray.remote(Learner)
            .options(num_cpus=lc.num_cpus, num_gpus=lc.num_gpus, scheduling_strategy=strategy(0))
            .remote(d)
        )

        def stateless_actors(cls, count: int, first_bundle: int, cpus: float, gpus: float) -> list:
            """Workers / scorers: restarted by Ray after a crash, their calls re-sent by this runtime."""
            return [
                ray.remote(cls).options(num_cpus=cpus, num_gpus=gpus, max_restarts=r.max_restarts, max_task_retries=0,
                                        scheduling_strategy=strategy(first_bundle + i)).remote(d, i)
                for i in range(count)
            ]

        self._learner_id = self._learner.actor_id.remote()  # its Ray actor id (hex), to tell its failures apart
        self._workers = stateless_actors(RolloutWorker, n, 1, r.num_cpus_per_worker, r.num_gpus_per_worker)
        self._scorers = stateless_actors(ScorerActor, m, 1 + n, sc.num_cpus_per_scorer, sc.num_gpus_per_scorer)
        self.version = -1
        self._weights_ref = None
        self._learner_version: int | None = None  # known from the last update; None: ask the learner
        self._published: tuple | None = None  # (version, FlatWeights ref) returned by the last update
        self._unconfirmed: dict = {}  # shard ref -> (worker, (ref, info ref), resubmit) of sample(wait=False)
        self._next_shards: list | None = None  # the next batch's refs, sent with the last update (take_next)
        self.disc_version = -1
        self._disc_ref = None
        self.restarts = 0
        self.recv_bytes = 0  # pickled size of everything the driver fetched (ray.get) through this runtime
        self._score_remotely = cfg.rollouts_scored_remotely and m > 0

    # learner methods that leave the weights version as it is (any other call makes it unknown until asked again)
    _KEEPS_VERSION = frozenset({"get_version", "get_disc_version", "get_weights", "get_flat_weights",
                                "get_disc_weights", "evaluate", "placement", "state_dict", "rollout_request",
                                "apply_config_lrs"})

    def learner(self, method: str, *args):
        if method not in self._KEEPS_VERSION:
            self._learner_version = None
        try:
            return self._received(self._ray.get(getattr(self._learner, method).remote(*args)))
        except self._ray.exceptions.RayActorError:
            self.placement.check_learner(wait_s=20)  # its node lost: NodeLost names it
            raise

    def learner_version(self) -> int:
        """The learner's weights version: known from its last update (no round trip), else asked."""
        if self._learner_version is None:
            self._learner_version = self.learner("get_version")
        return self._learner_version

    def update(self, shards: list, iteration: int, scores: dict | None = None, next_batch=None) -> dict:
        """The learner's rollout update on the shard refs (it fetches them); returns its metrics (with
        ``time/sample_s``, the slowest worker's sampling, read from the shards). The updated weights come back as a
        second object, kept in the object store for the workers' next calls.

        Shards of ``sample(wait=False)`` may still be sampling: the learner starts on them as they arrive. If the
        update fails because a worker died, its shard is re-sampled (``confirm``) and the update sent again (it
        failed fetching its input, before it changed anything).

        ``next_batch``: ``() -> (prompts, request)`` of the next iteration, drawn once the update is on its way (the
        driver's work overlaps the update, not the sampling) and sent to the workers with the update's weights ref
        (the version it will make): each worker waits in the object store for the learner's weights and samples at
        once, with no round trip through the driver; :meth:`take_next` hands its shards over."""
        ray = self._ray
        before = (self._weights_ref, self.version)
        after = self.learner_version() + 1 if next_batch is not None else None  # the version this update makes
        self._learner_version = None
        drawn: list = []

        def submit(shards):
            metrics_ref, weights_ref = self._two(self._learner.update_and_publish).remote(shards, iteration, scores)
            if next_batch is not None:
                drawn[:] = drawn or [next_batch()]  # drawn once (a retried update sends the same batch)
                self._weights_ref, self.version = weights_ref, after
                self._next_shards = self.sample(*drawn[0], wait=False)
            return metrics_ref, weights_ref

        metrics_ref, weights_ref = submit(shards)
        try:
            metrics = ray.get(metrics_ref)
        except ray.exceptions.RayError as exc:
            with contextlib.suppress(ray.exceptions.RayError):  # its second object holds the same error: seen
                ray.get(weights_ref)
            if next_batch is not None:  # sent with weights that never came: dropped (sent again with the retry)
                self._drop_next()
                self._weights_ref, self.version = before
            if self._learner_died(exc):  # NodeLost if its node went with it
                self.placement.check_learner(wait_s=20)
            restarts = self.restarts
            if not any(ref in self._unconfirmed for ref in shards):
                raise
            shards = self.confirm(shards)
            if self.restarts == restarts:  # every shard was sampled: the learner's own failure
                raise
            metrics_ref, weights_ref = submit(shards)
            try:
                metrics = ray.get(metrics_ref)
            except ray.exceptions.RayError as exc2:
                if self._learner_died(exc2):
                    self.placement.check_learner(wait_s=20)
                raise
        for ref in shards:  # sampled (the learner has them; it read their timings)
            self._unconfirmed.pop(ref, None)
        self._received(metrics)
        self._learner_version = int(metrics["learner/version"])
        self._published = (self._learner_version, weights_ref)
        if after is not None and after != self._learner_version:  # the next batch's rollouts carry that version
            raise RuntimeError(f"the learner's update made weights version {self._learner_version}, not {after}")
        return metrics

    def take_next(self) -> list:
        """The shard refs of the last update's ``next_batch`` (sampling, or sampled)."""
        shards, self._next_shards = self._next_shards, None
        return shards

    def _drop_next(self) -> None:
        """Forget the ``next_batch`` calls sent with an update that failed (their weights never came)."""
        for ref in self._next_shards or ():
            self._unconfirmed.pop(ref, None)
        self._next_shards = None

    def confirm(self, shards: list) -> list:
        """``shards`` once sampled: waits for the calls of ``sample(wait=False)`` among them, a crashed worker's
        re-sent (its new ref in its place)."""
        ray = self._ray
        out = list(shards)
        for k, ref in enumerate(shards):
            call = self._unconfirmed.pop(ref, None)
            if call is None:
                continue
            i, pair, submit, scored, score = call
            rollout, _ = self._get_pair(i, pair, submit)
            if scored is None:
                out[k] = rollout
                continue
            j = i % len(self._scorers)
            if rollout is not pair[0]:  # re-sampled: the chained scorer call failed with the worker; score anew
                with contextlib.suppress(ray.exceptions.RayError):
                    ray.get(list(scored))
                scored = score(rollout)(self._scorers[j])
            out[k], _ = self._get_pair(j, scored, score(rollout), kind="scorer")
        return out

    def fetch(self, handles: list) -> list:
        """The objects behind shard handles, fetched to the driver (tests, benchmarks; the loop never does)."""
        return self._received(resolve(handles))

    def _received(self, value):
        """Count ``value``'s pickled size in ``recv_bytes`` (what the driver fetched); returns it."""
        self.recv_bytes += len(pickle.dumps(value, protocol=5))
        return value

    def _get_pair(self, i: int, pair: tuple, submit, kind: str = "worker") -> tuple:
        """A call ``submit(actor) -> (data ref, info ref)`` on actor ``i`` (its two return objects): waits for the
        small info only (``_get_with_recovery``: a crashed actor's call is re-sent); returns (data ref, info)."""
        box = [pair[0]]

        def resubmit(actor):
            data, info = submit(actor)
            box[0] = data
            return info

        info = self._received(self._get_with_recovery(i, pair[1], resubmit, kind=kind))
        return box[0], info

    def _two(self, method):
        return method.options(num_returns=2)

    def sync_weights(self, version: int) -> None:
        """Publish the learner's weights ``version`` (one FlatWeights object: the one its last update returned, or
        fetched now); the workers load it with their next call, which carries it (no call of its own)."""
        if version == self.version:
            return
        published = self._published
        self._weights_ref = (published[1] if published is not None and published[0] == version
                             else self._learner.get_flat_weights.remote())
        self.version = version

    def _weights(self) -> dict:
        """The keyword arguments that send the current weights with a worker call."""
        return {"weights": [self._weights_ref], "version": self.version} if self._weights_ref is not None else {}

    def sync_disc(self, version: int) -> None:
        """Publish the learner's discriminator (one object per d-step version) to every scorer."""
        if version == self.disc_version:
            return
        self._disc_ref = self._learner.get_disc_weights.remote()
        self.disc_version = version
        refs = [s.set_disc_weights.remote(self._disc_ref, version) for s in self._scorers]
        for i, ref in enumerate(refs):
            self._get_with_recovery(i, ref, lambda a: a.set_disc_weights.remote(self._disc_ref, self.disc_version),
                                    kind="scorer")

    def mc_q(self, shards: list, n_rollouts: int, temperature: float, seed: int) -> tuple[list, dict]:
        """SeqGAN's Q: per rollout shard (B_i, T_i) refs, shard i searched on worker i (where it was sampled) and
        scored on scorer i mod m as soon as its continuations exist; and timings (the slowest worker and scorer)."""
        seeds = [_shard_seed(seed, i) for i in range(len(shards))]
        m = len(self._scorers)

        def search(i):
            return lambda w: self._two(w.mc_search_shard).remote(shards[i], n_rollouts, temperature, seeds[i],
                                                                  **self._weights())

        def score(batch):
            return lambda a: self._two(a.score_mc).remote(batch)

        pending = {}
        for i, w in enumerate(self._workers[: len(shards)]):
            pair = search(i)(w)
            pending[pair[1]] = (i, pair)
        scoring: list = [None] * len(shards)
        t_mc = []
        while pending:  # each shard goes to its scorer as soon as its continuations exist
            (ready,), _ = self._ray.wait(list(pending), num_returns=1)
            i, pair = pending.pop(ready)
            batch, info = self._get_pair(i, pair, search(i))
            t_mc.append(info["mc_s"])
            scoring[i] = (score(batch)(self._scorers[i % m]), score(batch))
        q_refs, t_score = [], []
        for i, (pair, submit) in enumerate(scoring):
            q, info = self._get_pair(i % m, pair, submit, kind="scorer")
            q_refs.append(q)
            t_score.append(info["score_s"])
        return q_refs, {"mc_s": max(t_mc), "score_s": max(t_score)}

    def disc_scores(self, shards: list) -> tuple[list, dict]:
        """D(Y) of the rollout's sequences: per shard (B_i,) refs, shard i scored on scorer i mod m (SeqGAN-critic's
        reward); and timings."""
        m = len(self._scorers)

        def score(i):
            return lambda a: self._two(a.score_sequences).remote(shards[i])

        pairs = [score(i)(self._scorers[i % m]) for i in range(len(shards))]
        out = [self._get_pair(i % m, pair, score(i), kind="scorer") for i, pair in enumerate(pairs)]
        return [d for d, _ in out], {"score_s": max(info["score_s"] for _, info in out)}

    def sample(self, prompts: PromptBatch, request: RolloutRequest, wait: bool = True) -> list:
        """Shards to the workers; with scorer actors (expensive rewards), each shard is scored on scorer
        i mod m as soon as it is sampled. Returns the scored shards' refs (shard i sampled on worker i).

        ``wait=False``: returns the refs at once, while the workers sample (and the scorers score, each call chained
        on its worker's result by reference); the learner's ``update`` (or ``confirm``) waits for them and re-sends
        a crashed worker's shard (and its scoring) or a crashed scorer's call."""
        shards = prompts.split(len(self._workers))
        requests = [_shard_request(request, i) for i in range(len(shards))]
        m = len(self._scorers) if self._score_remotely else 0

        def sample(i):
            return lambda w: self._two(w.sample_shard).remote(shards[i], requests[i], m == 0, **self._weights())

        def score(rollout):
            return lambda a: self._two(a.score_rollout_shard).remote(rollout)

        if not wait:  # each scorer call (if any) is chained on its worker's result by reference, no wait here
            refs = []
            for i, w in enumerate(self._workers[: len(shards)]):
                pair = sample(i)(w)
                scored = self._two(self._scorers[i % m].score_rollout_shard).remote(pair[0]) if m else None
                final = scored[0] if m else pair[0]
                self._unconfirmed[final] = (i, pair, sample(i), scored, score)
                refs.append(final)
            return refs
        pending = {}
        for i, w in enumerate(self._workers[: len(shards)]):
            pair = sample(i)(w)
            pending[pair[1]] = (i, pair)
        out: list = [None] * len(shards)
        while pending:  # a shard goes to its scorer as soon as it is sampled
            (ready,), _ = self._ray.wait(list(pending), num_returns=1)
            i, pair = pending.pop(ready)
            rollout, _ = self._get_pair(i, pair, sample(i))
            out[i] = rollout if m == 0 else (score(rollout)(self._scorers[i % m]), score(rollout))
        if m:
            out = [self._get_pair(i % m, pair, submit, kind="scorer")[0] for i, (pair, submit) in enumerate(out)]
        return out

    def _get_with_recovery(self, i: int, ref, resubmit, max_attempts: int = 6, kind: str = "worker"):
        """``ray.get(ref)``; if actor ``i`` (a rollout worker, or a scorer with ``kind="scorer"``) died,
        wait for Ray to restart it, give it the current weights and ``resubmit(actor)`` its work (workers
        and scorers hold no other state)."""
        ray = self._ray
        for _ in range(max_attempts):
            try:
                return ray.get(ref)
            except ray.exceptions.ObjectLostError:
                # the call's input is gone: the weights it carries lived on the learner's node (NodeLost if so)
                self.placement.check_learner(wait_s=20)
                raise
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                named = self._check_node_loss(exc, kind, i)
                self.restarts += 1
                log.warning("%s %d failed (%s); re-dispatching its work", kind, i, type(exc).__name__)
                a = self._scorers[i] if kind == "scorer" else self._workers[i]
                self._wait_alive(a)
                if not named:  # the GCS may mark the node dead after the actor's error reached us: by now it has
                    self._warn_node_lost(kind, i, "Ray re-created it on a surviving node")
                if kind == "scorer":
                    ray.get(a.set_disc_weights.remote(self._disc_ref, self.disc_version))
                else:
                    ray.get(a.set_weights.remote(self._weights_ref, self.version))
                ref = resubmit(a)
        raise RuntimeError(f"{kind} {i} failed {max_attempts} times in a row; giving up")

    def _learner_died(self, exc) -> bool:
        """``exc`` (from a Ray call) is the learner actor's death, not a worker's or a scorer's that reached the
        driver through the learner's fetch of its shard."""
        ray = self._ray
        try:  # answered while it was alive (the driver holds that answer)
            learner_id = ray.get(self._learner_id, timeout=30)
        except ray.exceptions.RayError:  # it died before it could say: the failure is the learner's
            return True
        return getattr(exc, "actor_id", None) == learner_id

    def _check_node_loss(self, exc, kind: str, i: int) -> bool:
        """After actor ``i``'s call failed: :class:`NodeLost` if the learner went with its node (the failure is the
        learner's own, or its weights' a worker waited for); a warning naming the node if the actor's node is
        lost (Ray re-creates the actor on a surviving node once its bundle is re-placed there). True if it warned."""
        learner_failed = self._learner_died(exc)
        self.placement.check_learner(wait_s=20 if learner_failed else 0)
        if learner_failed:
            raise exc
        return self._warn_node_lost(kind, i, "waiting for Ray to re-create it on a surviving node")

    def _warn_node_lost(self, kind: str, i: int, then: str) -> bool:
        """Warn (naming the node) if the node that held actor ``i``'s bundle is dead; True if so."""
        bundle = 1 + i if kind == "worker" else 1 + len(self._workers) + i
        if node := self.placement.lost_node(bundle):
            log.warning("%s %d was on %s and is lost with it; %s", kind, i, self.placement.describe(node), then)
            return True
        return False

    def _wait_alive(self, worker, timeout: float = 120.0) -> None:
        """Until Ray has restarted ``worker`` (a worker or scorer); after a node loss that waits for its bundle
        to be re-placed on a surviving node, which needs room there."""
        ray = self._ray
        deadline = time.monotonic() + timeout
        while True:
            try:
                ray.get(worker.pid.remote(), timeout=10)
                return
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                    ray.exceptions.GetTimeoutError) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"a failed actor was not back within {timeout:.0f} s ({type(exc).__name__}): if its node was "
                        "lost, the surviving nodes have no room for its bundle (available: "
                        f"{ray.available_resources()}); --resume continues the run once the cluster has room, or "
                        "with fewer rollout.num_workers / scorer.num_scorers"
                    ) from exc
                time.sleep(0.5)

    def worker_stats(self) -> list[dict]:
        """Each worker's stats, after it has loaded the published weights (it may not have needed them yet)."""
        if self._weights_ref is not None:
            self._ray.get([w.set_weights.remote([self._weights_ref], self.version) for w in self._workers])
        return self._received(self._ray.get([w.stats.remote() for w in self._workers]))

    def scorer_stats(self) -> list[dict]:
        return self._received(self._ray.get([s.stats.remote() for s in self._scorers]))

    def shutdown(self) -> None:
        ray = self._ray
        for a in [self._learner, *self._workers, *self._scorers]:
            ray.kill(a)
        if self._own_pg:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.pg)
        if self._started_ray:
            ray.shutdown()


def bundles(cfg: RunConfig) -> list[dict]:
    """Resource bundles of a run: [learner, worker × n, scorer × m] (a Tune trial's PlacementGroupFactory)."""
    r, lc, sc = cfg.rollout, cfg.learner, cfg.scorer
    learner = _bundle(lc.num_cpus, lc.num_gpus, lc.resources)
    if r.num_workers == 0:
        return [learner]
    worker = _bundle(r.num_cpus_per_worker, r.num_gpus_per_worker, r.resources_per_worker)
    scorer = _bundle(sc.num_cpus_per_scorer, sc.num_gpus_per_scorer, sc.resources_per_scorer)
    return [learner] + [worker] * r.num_workers + [scorer] * cfg.num_scorers


def _bundle(cpus: float, gpus: float, custom: dict[str, float]) -> dict:
    """One actor's bundle: CPUs, GPUs if any, and its custom resources (those > 0) that pick its node."""
    return {"CPU": cpus} | ({"GPU": gpus} if gpus else {}) | {k: v for k, v in custom.items() if v}


def make_runtime(cfg: RunConfig, placement_group=None):
    if cfg.rollout.num_workers == 0:
        return LocalRuntime(cfg)
    return RayRuntime(cfg, placement_group)
