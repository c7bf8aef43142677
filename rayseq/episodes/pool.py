"""Environments in the rollout worker's own process (the default): a set of instances reused from batch to batch,
each call guarded by a timeout.

Every call of an environment (``reset``, ``step``) goes through :meth:`LocalEnvs.call`: one that raises, returns
something that is not a step, or runs past ``step_timeout_s`` gives a :class:`Failure` for its episode and the
instance is replaced; the batch and the run go on. A timeout in-process can only abandon the call's thread (Python
cannot stop it): an environment that may hang, or is unsafe, belongs in actors (``env.num_actors``,
:mod:`rayseq.distributed.env_actors`), where a hung one is killed.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable
from typing import Any, NamedTuple

from rayseq.episodes.protocol import close_environment


class Failure(NamedTuple):
    """An environment call that failed: ``kind`` ``raised`` or ``timeout``, and what happened."""

    kind: str
    error: str


class LocalEnvs:
    """Instances of one environment in this process, one per episode slot of a batch.

    Args:
        factory: makes a new instance (``env.name`` with ``env.kwargs``).
        step_timeout_s: the limit of one call; None: none (calls run in the caller's thread).
        max_concurrent: calls in flight at once (threads); the rest wait their turn.
    """

    def __init__(self, factory: Callable[[], Any], step_timeout_s: float | None = None, max_concurrent: int = 64):
        self.factory, self.timeout, self.max_concurrent = factory, step_timeout_s, max(1, int(max_concurrent))
        self.instances: dict[int, Any] = {}
        self._pool: cf.ThreadPoolExecutor | None = None

    def _instance(self, slot: int):
        if slot not in self.instances:
            self.instances[slot] = self.factory()
        return self.instances[slot]

    def _drop(self, slot: int) -> None:
        env = self.instances.pop(slot, None)
        if env is not None:
            try:
                close_environment(env)
            except Exception:  # noqa: BLE001 (a broken instance may not close either)
                pass

    def call(self, calls: list[tuple[int, str, tuple, dict]]) -> list[Any]:
        """Run ``(slot, method, args, kwargs)`` calls, each on its slot's instance; results in order, a :class:`Failure`
        where one raised or timed out (that slot's instance is replaced before its next use)."""
        if self.timeout is None:
            out = []
            for slot, method, args, kwargs in calls:
                try:
                    out.append(getattr(self._instance(slot), method)(*args, **kwargs))
                except Exception as exc:  # noqa: BLE001 (an environment's error ends its episode, not the run)
                    self._drop(slot)
                    out.append(Failure("raised", f"{type(exc).__name__}: {exc}"))
            return out
        out: list[Any] = [None] * len(calls)
        for a in range(0, len(calls), self.max_concurrent):
            if self._pool is None:
                self._pool = cf.ThreadPoolExecutor(self.max_concurrent, thread_name_prefix="rayseq-env")
            chunk = list(enumerate(calls))[a : a + self.max_concurrent]
            futures = {}
            for i, (slot, method, args, kwargs) in chunk:
                try:
                    env = self._instance(slot)
                except Exception as exc:  # noqa: BLE001
                    out[i] = Failure("raised", f"{type(exc).__name__}: {exc}")
                    continue
                futures[self._pool.submit(getattr(env, method), *args, **kwargs)] = (i, slot)
            done, pending = cf.wait(futures, timeout=self.timeout)
            for fut in done:
                i, slot = futures[fut]
                exc = fut.exception()
                if exc is None:
                    out[i] = fut.result()
                else:
                    self._drop(slot)
                    out[i] = Failure("raised", f"{type(exc).__name__}: {exc}")
            for fut in pending:
                i, slot = futures[fut]
                self.instances.pop(slot, None)  # its thread may still run: the instance is abandoned, not closed
                out[i] = Failure("timeout", f"no answer within env.step_timeout_s={self.timeout:g}")
            if pending:  # the hung threads keep their workers: the next calls get a fresh pool
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
        return out

    def close(self) -> None:
        for slot in list(self.instances):
            self._drop(slot)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
