"""Where the learner and the rollout workers run: Ray actors in one placement group, or in-process.

The driver loop (:mod:`rayseq.distributed.driver`) talks to a runtime through a few calls —
``learner(method, *args)``, ``sync_weights(version)``, ``sample(prompts, request)``, and for SeqGAN
``sync_disc(version)`` and ``mc_q(rollout, n, temperature, seed)``, then ``shutdown()`` — so the
distributed path and the in-process path (``rollout.num_workers=0``) run the same algorithm code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time

import numpy as np

from rayseq.config import RunConfig, config_to_dict
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

    def learner(self, method: str, *args):
        return getattr(self._learner, method)(*args)

    def sync_weights(self, version: int) -> None:
        if version != self.version:
            self._worker.set_weights(self._learner.get_weights(), version)
            self.version = version

    def sample(self, prompts: PromptBatch, request: RolloutRequest) -> Rollout:
        return self._worker.sample(prompts, _shard_request(request, 0))

    def sync_disc(self, version: int) -> None:
        if version != self.disc_version:
            self._scorer.set_disc_weights(self._learner.get_disc_weights(), version)
            self.disc_version = version

    def mc_q(self, rollout: Rollout, n_rollouts: int, temperature: float, seed: int) -> tuple[np.ndarray, dict]:
        batch = self._worker.mc_search(rollout, n_rollouts, temperature, _shard_seed(seed, 0))
        q, info = self._scorer.score_mc(batch)
        return q, {"mc_s": batch.info["mc_s"], "score_s": info["score_s"]}

    def disc_scores(self, rollout: Rollout) -> tuple[np.ndarray, dict]:
        return self._scorer.score_sequences(rollout)

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
                                   "Token authentication is enabled for this Ray cluster"):
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **kwargs)
    return True


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

        self._workers = stateless_actors(RolloutWorker, n, 1, r.num_cpus_per_worker, r.num_gpus_per_worker)
        self._scorers = stateless_actors(ScorerActor, m, 1 + n, sc.num_cpus_per_scorer, sc.num_gpus_per_scorer)
        self.version = -1
        self._weights_ref = None
        self.disc_version = -1
        self._disc_ref = None
        self.restarts = 0
        self._score_remotely = cfg.rollouts_scored_remotely and m > 0

    def learner(self, method: str, *args):
        try:
            return self._ray.get(getattr(self._learner, method).remote(*args))
        except self._ray.exceptions.RayActorError:
            self.placement.check_learner(wait_s=20)  # its node lost: NodeLost names it
            raise

    def sync_weights(self, version: int) -> None:
        if version == self.version:
            return
        self._weights_ref = self._learner.get_weights.remote()
        refs = [w.set_weights.remote(self._weights_ref, version) for w in self._workers]
        self.version = version
        for i, ref in enumerate(refs):
            self._get_with_recovery(i, ref, lambda w: w.set_weights.remote(self._weights_ref, self.version))

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

    def mc_q(self, rollout: Rollout, n_rollouts: int, temperature: float, seed: int) -> tuple[np.ndarray, dict]:
        """SeqGAN's Q (B, T): continuations split across the workers, each shard scored on a scorer
        (shard i -> scorer i mod m) as soon as its continuations exist."""
        shards = rollout.split(len(self._workers))
        seeds = [_shard_seed(seed, i) for i in range(len(shards))]
        refs = {w.mc_search.remote(s, n_rollouts, temperature, q): i
                for i, (w, s, q) in enumerate(zip(self._workers, shards, seeds))}
        m = len(self._scorers)
        q_refs: list = [None] * len(shards)
        t_mc = []
        while refs:  # each shard goes to its scorer as soon as its continuations exist
            (ready,), _ = self._ray.wait(list(refs), num_returns=1)
            i = refs.pop(ready)
            batch = self._get_with_recovery(
                i, ready, lambda w, i=i: w.mc_search.remote(shards[i], n_rollouts, temperature, seeds[i])
            )
            t_mc.append(batch.info["mc_s"])
            q_refs[i] = (batch, self._scorers[i % m].score_mc.remote(batch))
        parts, t_score = [], []
        for i, (batch, ref) in enumerate(q_refs):
            q, info = self._get_with_recovery(i % m, ref, lambda a, b=batch: a.score_mc.remote(b), kind="scorer")
            parts.append(q)
            t_score.append(info["score_s"])
        width = max(p.shape[1] for p in parts)
        q = np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1]))) for p in parts])
        return q, {"mc_s": max(t_mc), "score_s": max(t_score)}

    def disc_scores(self, rollout: Rollout) -> tuple[np.ndarray, dict]:
        """D(Y) (B,) of the rollout's sequences, shards across the scorers (SeqGAN-critic's reward)."""
        shards = rollout.split(len(self._scorers))
        refs = [s.score_sequences.remote(part) for s, part in zip(self._scorers, shards)]
        out = [self._get_with_recovery(i, ref, lambda a, p=shards[i]: a.score_sequences.remote(p), kind="scorer")
               for i, ref in enumerate(refs)]
        return np.concatenate([d for d, _ in out]), {"score_s": max(info["score_s"] for _, info in out)}

    def sample(self, prompts: PromptBatch, request: RolloutRequest) -> Rollout:
        """Shards to the workers; with scorer actors (expensive rewards), each shard is scored on scorer
        i mod m as soon as it is sampled."""
        shards = prompts.split(len(self._workers))
        requests = [_shard_request(request, i) for i in range(len(shards))]
        m = len(self._scorers) if self._score_remotely else 0
        refs = [w.sample.remote(s, q, m == 0) for w, s, q in zip(self._workers, shards, requests)]
        results = []
        for i, ref in enumerate(refs):
            r = self._get_with_recovery(i, ref, lambda w, i=i: w.sample.remote(shards[i], requests[i], m == 0))
            results.append(r if m == 0 else (r, self._scorers[i % m].score_rollout.remote(r)))
        if m:
            results = [self._get_with_recovery(i % m, ref, lambda a, r=r: a.score_rollout.remote(r), kind="scorer")
                       for i, (r, ref) in enumerate(results)]
        return Rollout.concat(results)

    def _get_with_recovery(self, i: int, ref, resubmit, max_attempts: int = 6, kind: str = "worker"):
        """``ray.get(ref)``; if actor ``i`` (a rollout worker, or a scorer with ``kind="scorer"``) died,
        wait for Ray to restart it, give it the current weights and ``resubmit(actor)`` its work (workers
        and scorers hold no other state)."""
        ray = self._ray
        for _ in range(max_attempts):
            try:
                return ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                self._check_node_loss(exc, kind, i)
                self.restarts += 1
                log.warning("%s %d failed (%s); re-dispatching its work", kind, i, type(exc).__name__)
                if kind == "scorer":
                    a = self._scorers[i]
                    self._wait_alive(a)
                    ray.get(a.set_disc_weights.remote(self._disc_ref, self.disc_version))
                else:
                    a = self._workers[i]
                    self._wait_alive(a)
                    ray.get(a.set_weights.remote(self._weights_ref, self.version))
                ref = resubmit(a)
        raise RuntimeError(f"{kind} {i} failed {max_attempts} times in a row; giving up")

    def _check_node_loss(self, exc, kind: str, i: int) -> None:
        """After actor ``i``'s call failed: :class:`NodeLost` if the learner went with its node (the failure is the
        learner's own, or its weights' a worker waited for); a warning naming the node if the actor's node is
        lost (Ray re-creates the actor on a surviving node once its bundle is re-placed there)."""
        learner_failed = getattr(exc, "actor_id", None) == self._learner._actor_id.hex()
        self.placement.check_learner(wait_s=20 if learner_failed else 0)
        if learner_failed:
            raise exc
        bundle = 1 + i if kind == "worker" else 1 + len(self._workers) + i
        if node := self.placement.lost_node(bundle):
            log.warning("%s %d was on %s and is lost with it; waiting for Ray to re-create it on a surviving node",
                        kind, i, self.placement.describe(node))

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
        return self._ray.get([w.stats.remote() for w in self._workers])

    def scorer_stats(self) -> list[dict]:
        return self._ray.get([s.stats.remote() for s in self._scorers])

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
