"""The three actor groups an algorithm's iteration is written against (``Algorithm.training_step``), each one class
whether its members run in this process (``rollout.num_workers=0``: debugging, unit tests) or as Ray actors in one
placement group (``is_local``, as RLlib's ``LearnerGroup``):

- :class:`~.rollout.RolloutGroup`: sample replies with behaviour log-probs (scored on the scorers when the reward is
  expensive); what an algorithm runs on the shards (a function of its own, e.g. continuations of every prefix).
  Receives the learner's weights.
- :class:`~.scorer.ScorerGroup`: rewards, and what an algorithm scores with a model of its own. Receives that
  model's weights.
- :class:`~.learner.LearnerGroup`: updates, weights, state, evaluation, checkpoints.

:class:`ActorGroups` builds the three for a run (and its placement group) and is what ``training_step`` receives.
Methods are called in code, never by name strings. Fault recovery lives in :class:`~.manager.ActorManager`, shared
by the groups.

Data flows by reference: ``sample``, ``run_on_shards`` and ``run_on_pending`` return per-shard handles
(:mod:`rayseq.distributed.handles`: ObjectRefs under Ray, the objects in-process); the learner fetches them. The
driver holds references and metric dicts only (``recv_bytes`` counts what it fetches).
The protocols these classes meet, for the math layer's algorithms: :mod:`rayseq.algos.iteration`.
"""

from __future__ import annotations

import time

from rayseq.config import RunConfig
from rayseq.distributed.actors.scorer import ScorerActor
from rayseq.distributed.actors.worker import RolloutWorker
from rayseq.distributed.groups.learner import LearnerGroup
from rayseq.distributed.groups.rollout import RolloutGroup
from rayseq.distributed.groups.scorer import ScorerGroup
from rayseq.distributed.groups.startup import StartupFailed
from rayseq.distributed.handles import resolve


class ActorGroups:
    """A run's three groups (``learner``, ``rollout``, ``scorer``): in-process with ``rollout.num_workers=0``, else
    ``learner.num_learners`` Learner actors, ``rollout.num_workers`` RolloutWorker actors and ``scorer.num_scorers``
    ScorerActors (when the run has scorers: an algorithm with a reward of its own, expensive or configured rewards)
    in one placement group (``rollout.placement_strategy``: PACK or SPREAD over the nodes).

    ``placement_group``: reserve elsewhere (a Tune trial's ``tune.PlacementGroupFactory``, built by
    :func:`rayseq.distributed.runtime.bundles`) and pass it in; its bundle 0 is the learner's (rank 0), bundles
    1..n the workers', then the scorers', then the other learner ranks'. Otherwise one is created here. Workers and
    scorers are restarted by Ray after a crash (``max_restarts``) and their calls re-sent
    (:class:`~rayseq.distributed.groups.manager.ActorManager`); a lost node's workers and scorers are re-created on the
    surviving nodes (:mod:`rayseq.distributed.groups.placement`); a dead learner actor is rebuilt by the driver
    (:meth:`restart_learner`, ``learner.max_restarts``); losing the learner's node ends the run with
    :class:`~rayseq.distributed.groups.placement.NodeLost` naming it. A start that fails is not recovered: every actor
    is checked once as the groups start, and a constructor that raised, or a placement the cluster can never meet,
    ends the run with :class:`~rayseq.distributed.groups.startup.StartupFailed` (one line), nothing left behind.
    ``note(text)``: shows each step of the start on the run's progress display."""

    PLACEMENT_WAIT_S = 120.0  # how long a cluster that may grow (one rayseq joined) has to reserve the run's bundles

    def __init__(self, cfg: RunConfig, placement_group=None, note=None):
        self.is_local = cfg.rollout.num_workers == 0
        self.manager = None
        self._note = note or (lambda text: None)  # a line on the run's progress display
        if self.is_local:
            self.learner = LearnerGroup(cfg)
            self.rollout = RolloutGroup(cfg, self.learner)  # built before the scorer: the global RNG draws as before
            self.scorer = self.rollout.scorer = ScorerGroup(cfg, self.learner)
            # one process: every constructor set the process-wide thread count; the learner's applies
            import torch

            torch.set_num_threads(cfg.learner.torch_threads)
            if memory := getattr(self.rollout.local.engine, "memory_note", None):
                self._note(f"rollout worker 0's vLLM engine: {memory}")
        else:
            self._ray, self._started_ray, self._own_pg, self.pg, self._created = None, False, False, None, []
            try:
                self._start_ray_actors(cfg, placement_group)
            except BaseException:  # nothing of a start that failed is left behind (actors, placement group, Ray)
                self._release(self._created)
                raise
        self.learner.rollout = self.rollout

    def _start_ray_actors(self, cfg: RunConfig, placement_group) -> None:
        import ray
        from ray.util.placement_group import placement_group as make_pg
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from rayseq.distributed.groups.manager import ActorManager
        from rayseq.distributed.groups.placement import Placement, bundles
        from rayseq.distributed.runtime import init_ray

        self._ray = ray
        r, lc, sc = cfg.rollout, cfg.learner, cfg.scorer
        wanted = bundles(cfg)
        self._started_ray = init_ray(min_cpus=sum(b["CPU"] for b in wanted))
        self._own_pg = placement_group is None
        if placement_group is None:
            placement_group = self.pg = make_pg(wanted, strategy=r.placement_strategy)
            self._wait_placed(cfg, placement_group, wanted)
        self.pg = placement_group
        self.placement = Placement(placement_group)

        def strategy(i):
            return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=i)

        def stateless_actors(cls, count: int, first_bundle: int, cpus: float, gpus: float) -> list:
            """Workers / scorers: restarted by Ray after a crash, their calls re-sent by the manager."""
            actors = [
                ray.remote(cls).options(num_cpus=cpus, num_gpus=gpus, max_restarts=r.max_restarts, max_task_retries=0,
                                        scheduling_strategy=strategy(first_bundle + i)).remote(cfg, i)
                for i in range(count)
            ]
            self._created += actors
            return actors

        self.manager = manager = ActorManager(ray, self.placement, note=self._note)
        n, m = r.num_workers, cfg.num_scorers
        t0 = time.monotonic()
        self._note(f"starting {_count(lc.num_learners, 'learner')}, {_count(n, 'rollout worker')} and "
                   f"{_count(m, 'scorer')}")
        # the workers and scorers first, so that they build while the learners do; each is checked once below
        workers = stateless_actors(RolloutWorker, n, 1, r.num_cpus_per_worker, r.num_gpus_per_worker)
        scorers = stateless_actors(ScorerActor, m, 1 + n, sc.num_cpus_per_scorer, sc.num_gpus_per_scorer)
        for kind, actors, first in (("rollout worker", workers, 1), ("scorer", scorers, 1 + n)):
            for i, actor in enumerate(actors):
                manager.starting(f"{kind} {i}", first + i, actor, actor.pid.remote())
        # rank 0 in bundle 0, ranks 1.. after the scorers' bundles (bundles()); the learner group waits for every
        # actor created so far to start (a constructor that raised ends the run here) before its ranks join
        learner_bundles = [0, *range(1 + n + m, n + m + lc.num_learners)]
        self.learner = LearnerGroup(cfg, manager=manager, actor_options=[
            {"num_cpus": lc.num_cpus, "num_gpus": lc.num_gpus, "scheduling_strategy": strategy(i)}
            for i in learner_bundles])
        self._created += self.learner.actors
        self.scorer = ScorerGroup(cfg, self.learner, manager=manager, actors=scorers)
        self.rollout = RolloutGroup(cfg, self.learner, self.scorer, manager=manager, actors=workers)
        self._note(f"started in {time.monotonic() - t0:.1f} s")
        if r.engine == "vllm":  # what each engine took of its node's memory (rayseq.engines.vllm_engine)
            for i, stats in enumerate(ray.get([w.engine_stats.remote() for w in workers])):
                self._note(f"rollout worker {i}'s vLLM engine: {stats['engine_memory']}")

    def _wait_placed(self, cfg: RunConfig, pg, wanted: list[dict]) -> None:
        """Until the cluster has reserved the placement group ``pg`` of bundles ``wanted``. One that no node layout of
        the cluster can meet (:func:`~.placement.unmet`) ends the run at once where the cluster cannot grow (Ray
        started here), naming the keys that size the bundle no node can hold; a cluster joined may have an autoscaler
        that adds a node, so that waits ``PLACEMENT_WAIT_S``, as a placement that waits for room others hold does."""
        from rayseq.distributed.groups.placement import bundle_keys, unmet

        ray, strategy = self._ray, cfg.rollout.placement_strategy
        advice = ("lower rollout.num_workers, scorer.num_scorers or their num_cpus_per_* / learner.num_cpus (and GPUs "
                  "and custom resources: learner.resources, rollout.resources_per_worker, scorer.resources_per_scorer)")
        self._note(f"reserving {len(wanted)} bundles ({strategy}) for the run's actors")
        ready = pg.ready()
        deadline = time.monotonic() + self.PLACEMENT_WAIT_S
        said = False
        while not ray.wait([ready], timeout=1.0)[0]:
            found = unmet(wanted, strategy, [node["Resources"] for node in ray.nodes() if node["Alive"]])
            why = found.why if found else None
            if why and self._started_ray:
                if found.bundle is None:
                    raise StartupFailed(f"the cluster cannot reserve the run's bundles {wanted}: {why}; {advice}")
                key = bundle_keys(cfg, found.bundle, found.lacking)
                raise StartupFailed(f"the cluster cannot reserve the run's bundles {wanted}: {why} (the key to "
                                    f"change: {key})", config_key=key)
            if why and not said:
                said = True
                self._note(f"waiting up to {self.PLACEMENT_WAIT_S:.0f} s for the cluster to reserve the run's bundles: "
                           f"{why} (an autoscaler may add a node)")
            if time.monotonic() >= deadline:
                raise StartupFailed(f"cluster cannot reserve {wanted} within {self.PLACEMENT_WAIT_S:.0f} s"
                                    f"{': ' + why if why else ''} (available: {ray.available_resources()}); {advice}")

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
        """A learner actor died (:class:`~.manager.LearnerLost`): every learner actor is replaced
        by a fresh one and the other groups forget what went out with it (:meth:`ActorManager.recover_learner`); the
        caller loads the latest checkpoint."""
        self.manager.recover_learner(self)

    def evaluate(self, split: str, decodes: list | None = None) -> tuple[dict, dict]:
        """The ``split`` metrics and details of the learner's generator now. With ``decodes`` (the task's
        ``eval_decodes``, :mod:`rayseq.tasks.evaluation`) and Ray workers, the rollout workers decode them (each a
        share, through its engine, with the weights the learners published, or fresh ones where the generator has
        changed since without a new version: :meth:`LearnerGroup.eval_weights_handle`) and the learners compute the
        figures from them; else (in-process, or a task whose evaluation is one piece) the learners evaluate whole."""
        if decodes is None or self.rollout.is_local:
            return self.learner.evaluate(split)
        decoded, _ = self.rollout.decode_held_out(decodes, *self.learner.eval_weights_handle(self.learner.version()))
        return self.learner.evaluate(split, decoded)

    def fetch(self, handles: list) -> list:
        """The objects behind shard handles, fetched to the driver (tests, benchmarks; the loop never does)."""
        return list(handles) if self.is_local else self.manager.received(resolve(handles))

    def shutdown(self) -> None:
        if self.is_local:
            return
        self._release([*self.learner.actors, *self.rollout.actors, *self.scorer.actors])

    def _release(self, actors: list) -> None:
        """Kill ``actors``, remove the placement group created here and stop the Ray started here."""
        ray = self._ray
        if ray is None:
            return
        for a in actors:
            ray.kill(a)
        if self._own_pg and self.pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.pg)
        if self._started_ray:
            ray.shutdown()


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"
