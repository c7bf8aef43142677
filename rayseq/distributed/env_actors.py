"""Environments as Ray actors (``env.num_actors`` > 0), for heavy or unsafe ones: a pool of actors, each holding up to
``env.max_concurrent`` environments (one per episode slot, calls on threads of the actor), every call bounded by
``env.step_timeout_s``.

A call that raises ends its episode as a failure; one that does not answer in time ends it as a timeout, and its
actor is killed and replaced (a hung environment cannot be stopped any other way). The other episodes whose
environments lived on that actor lose them with it: their next call is answered with a failure, never with a fresh
environment that would silently restart their game. The run goes on either way (``episode/failures``,
``episode/timeouts``).
"""

from __future__ import annotations

import ray

from rayseq.episodes.pool import Failure
from rayseq.episodes.protocol import close_environment, make_environment

STARTUP_TIMEOUT_S = 300.0  # an environment actor's start-up, at most (a new process on a busy node)


class EnvHost:
    """One environment actor: environments by slot, made on their first call."""

    def __init__(self, name: str, kwargs: dict):
        self.name, self.kwargs, self.envs = name, dict(kwargs), {}

    def call(self, slot: int, method: str, args: tuple, kwargs: dict):
        if slot not in self.envs:
            self.envs[slot] = make_environment(self.name, self.kwargs)
        try:
            return getattr(self.envs[slot], method)(*args, **kwargs)
        except Exception:
            self.envs.pop(slot, None)
            raise

    def ping(self) -> bool:
        return True

    def close(self) -> None:
        for env in self.envs.values():
            close_environment(env)
        self.envs = {}


class ActorEnvs:
    """The pool: slot b lives on actor b mod ``num_actors`` (module docstring); the interface of
    :class:`rayseq.episodes.pool.LocalEnvs`."""

    def __init__(self, name: str, kwargs: dict, num_actors: int, max_concurrent: int, step_timeout_s: float | None,
                 num_cpus: float = 0.0):
        self.name, self.kwargs, self.timeout = name, dict(kwargs), step_timeout_s
        self._remote = ray.remote(EnvHost).options(max_concurrency=max_concurrent, num_cpus=num_cpus)
        self.actors = self._started([self._remote.remote(self.name, self.kwargs) for _ in range(num_actors)])
        self.lost: set[int] = set()  # slots whose environment died with a replaced actor
        self.replaced = 0

    def _started(self, actors: list) -> list:
        """``actors`` once each answers: an actor's start-up (a process, imports) is not a step, and is not held to
        ``env.step_timeout_s``."""
        ray.get([a.ping.remote() for a in actors], timeout=STARTUP_TIMEOUT_S)
        return actors

    def call(self, calls: list[tuple[int, str, tuple, dict]]) -> list:
        out: list = [None] * len(calls)
        refs, where = [], {}
        for i, (slot, method, args, kwargs) in enumerate(calls):
            if slot in self.lost:
                if method == "reset":  # a new episode in this slot: a new environment on the new actor
                    self.lost.discard(slot)
                else:
                    out[i] = Failure("raised", "its environment actor was replaced (another episode's environment "
                                               "hung)")
                    continue
            ref = self.actors[slot % len(self.actors)].call.remote(slot, method, args, kwargs)
            refs.append(ref)
            where[ref] = (i, slot)
        if not refs:
            return out
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=self.timeout)
        for ref in ready:
            i, slot = where[ref]
            try:
                out[i] = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 (an environment's error ends its episode, not the run)
                cause = getattr(exc, "cause", None) or exc
                out[i] = Failure("raised", f"{type(cause).__name__}: {cause}")
        hung = set()
        for ref in pending:
            i, slot = where[ref]
            out[i] = Failure("timeout", f"no answer within env.step_timeout_s={self.timeout:g}")
            hung.add(slot % len(self.actors))
        for a in hung:  # killed and replaced; the episodes it held lose their environments
            ray.kill(self.actors[a], no_restart=True)
            self.actors[a] = self._remote.remote(self.name, self.kwargs)
            self.replaced += 1
            self.lost |= {slot for _, slot in where.values() if slot % len(self.actors) == a}
        self._started([self.actors[a] for a in hung])
        return out

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []


def environments(cfg, task):
    """The environments of a rollout worker: in its process (``env.num_actors`` = 0) or a pool of actors."""
    env = cfg.env
    if env.num_actors == 0:
        return task.local_envs()
    return ActorEnvs(env.name, env.kwargs, env.num_actors, env.max_concurrent, env.step_timeout_s,
                     env.num_cpus_per_actor)
