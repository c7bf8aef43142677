"""How a new weights version reaches the rollout workers (``rollout.weight_sync``): one transport per rollout group,
chosen once (:func:`make_transport`), the driver's side of it.

Every worker call carries the object-store reference of the version it samples with (the learner's update returns
the packed weights, :class:`~rayseq.distributed.weights.flat.FlatWeights`), which a worker reads the first time it
sees that version. A transport adds what goes out besides it when the rollout group publishes a new version
(:meth:`WeightTransport.broadcast`) and what it drops when the learner is rebuilt (:meth:`WeightTransport.forget`):

- :class:`ObjectStoreTransport` (``object_store``): nothing; the reference is the transport.
- :class:`CollectiveTransport` (``collective``): the learner broadcasts the generator's weights over a gloo group of
  its own (rank 0 sends; a sharded learner's ranks all take part in gathering each tensor) and the workers receive
  them (:mod:`.collective`), queued behind the learner's update and ahead of the workers' next calls; a worker reads
  the reference only where a broadcast failed.

The actors' ends of the collective transport: ``Learner.send_weights``, ``RolloutWorker.receive_weights`` and their
``leave_weight_group``.
"""

from __future__ import annotations

import uuid
from typing import Protocol

from rayseq.distributed.weights.collective import GroupSpec


class WeightTransport(Protocol):
    """What the rollout group calls on its transport (Ray actor handles in, nothing waited for)."""

    def broadcast(self, learners, workers: list, version: int, key) -> None:
        """Send weights ``version`` to the workers besides the reference their calls carry.

        Args:
            learners: the learner group: its rank 0 (``learners.actor``) sends the version, and every rank that
                reads the model (``learners.reading``: sharded learners' all) takes part in gathering it.
            workers: the live rollout worker actors, in shard order.
            version: the weights version (the learner's update count).
            key: what the set of workers is (the worker re-creations so far and the live workers): a transport
                whose members changed builds itself again.
        """

    def forget(self) -> None:
        """The learner was rebuilt: drop what was built with the old one."""

    def wait(self) -> None:
        """Wait for the last :meth:`broadcast` to arrive (tests, benchmarks); raise what it raised."""


class ObjectStoreTransport:
    """``rollout.weight_sync=object_store``: each worker pulls the packed version through the object store the first
    time one of its calls carries it; nothing else goes out."""

    def broadcast(self, learners, workers: list, version: int, key) -> None:
        """Nothing to send: the workers' next calls carry the version's reference."""

    def forget(self) -> None:
        """Nothing held."""

    def wait(self) -> None:
        """Nothing in flight."""


class CollectiveTransport:
    """``rollout.weight_sync=collective``: one weights group of the learner (rank 0) and the rollout workers (ranks
    1..n), rebuilt under a new name after a failed broadcast or a change of its workers; :meth:`broadcast` queues one
    version (:mod:`rayseq.distributed.weights.collective`).

    Args:
        ray: the ``ray`` module (its calls are the transport's).
        bucket_bytes: bytes per broadcast bucket (``rollout.weight_bucket_mb``).
        timeout_s: how long a member waits in a joining or a broadcast for the others
            (``rollout.weight_sync_timeout_s``).
    """

    def __init__(self, ray, bucket_bytes: int, timeout_s: float = 60.0):
        self.ray, self.bucket_bytes, self.timeout_s = ray, bucket_bytes, timeout_s
        self._run = uuid.uuid4().hex[:8]
        self.generation = 0  # groups built so far
        self.spec: GroupSpec | None = None
        self._members: list = []
        self._pending: list = []  # the last broadcast's calls
        self._key = None  # what the group was built for (the restarts so far, the live workers)
        self._first = True
        self.rebuilds = 0

    @property
    def group(self) -> str | None:
        return None if self.spec is None else self.spec.name

    def _healthy(self, key) -> bool:
        """Whether the current group can carry the next version: built for these workers (``key``), and the last
        broadcast did not fail."""
        if self.spec is None or key != self._key:
            return False
        ready, _ = self.ray.wait(self._pending, num_returns=len(self._pending), timeout=0)
        for ref in ready:
            try:
                self.ray.get(ref)  # None: nothing is fetched
            except Exception:  # noqa: BLE001 - a lost worker, a gloo timeout: the group is rebuilt
                return False
        return True

    def _rebuild(self, learner, workers: list, key) -> None:
        if self.spec is not None:  # free the old group where it lives
            for member in self._members:
                member.leave_weight_group.remote(self.spec.name)
        self.generation += 1
        self.rebuilds += self.spec is not None
        address, port = self.ray.get(learner.rendezvous.remote())  # a free port on the learner's node
        self.spec = GroupSpec(f"rayseq-weights-{self._run}-{self.generation}", address, port, 1 + len(workers),
                              self.timeout_s)
        self._members = [learner, *workers]
        self._key = key
        self._first = True  # the next broadcast is the group's first: its members join

    def forget(self) -> None:
        """The learner was rebuilt: its group went with it. The workers leave it (each would otherwise keep one dead
        membership per rebuilt learner), and the next broadcast builds a new group."""
        if self.spec is not None:
            for worker in self._members[1:]:
                worker.leave_weight_group.remote(self.spec.name)
        self.spec, self._members = None, []

    def broadcast(self, learners, workers: list, version: int, key) -> None:
        """Queue weights ``version``: the learner's send (behind its update; on every reading rank, whose gathers it
        takes part in) and each worker's receive (ahead of its next call). ``key``: what the group must be built for
        (the worker re-creations so far and the live workers: a re-created or returning worker is not in the current
        group)."""
        if not self._healthy(key):
            self._rebuild(learners.actor, workers, key)  # rank 0: the group's root
        self._pending = [*(rank.send_weights.remote(self.spec, self.bucket_bytes) for rank in learners.reading),
                         *[w.receive_weights.remote(self.spec, rank, version, self.bucket_bytes, self._first)
                           for rank, w in enumerate(workers, start=1)]]
        self._first = False

    def wait(self) -> None:
        """Wait for the last broadcast (tests, benchmarks); raises what it raised."""
        self.ray.get(self._pending)


def make_transport(rollout_cfg, ray=None) -> WeightTransport:
    """The transport ``rollout.weight_sync`` names. ``rollout_cfg``: the run's ``rollout`` section
    (:class:`~rayseq.config.RolloutConfig`); ``ray``: the ``ray`` module under Ray (None in-process, where the weights
    are loaded directly and the config allows the object store alone)."""
    if rollout_cfg.weight_sync == "object_store":
        return ObjectStoreTransport()
    return CollectiveTransport(ray, int(rollout_cfg.weight_bucket_mb * (1 << 20)), rollout_cfg.weight_sync_timeout_s)
