"""Which cluster node holds which of a run's actors, and what to say when a node is lost.

A run's placement group has bundle 0 for the learner, 1..n for the rollout workers, then the scorers
(:func:`rayseq.distributed.runtime.bundles`). When a node dies, Ray re-places the bundles it held on the surviving
nodes (the group goes through ``RESCHEDULING``) if they have room, and restarts the workers and scorers there (their
``max_restarts``); the runtime re-sends their shards. The learner is not restarted — its weights and optimizer state
since the last checkpoint were on that node — so losing its node ends the run with :class:`NodeLost`, which names
the node; ``--resume`` continues from the last checkpoint.

Only the GCS's tables are read (``ray.nodes()``, ``ray.util.placement_group_table``): no dashboard needed.
"""

from __future__ import annotations

import time

# resources every node has; what is left of a node's resources are the custom ones it advertises
_BUILTIN = ("CPU", "GPU", "memory", "object_store_memory", "accelerator_type")


class NodeLost(RuntimeError):
    """The node holding the learner died: the run cannot go on (``--resume`` continues it)."""

    def __init__(self, message: str, node_id: str):
        super().__init__(message)
        self.node_id = node_id


def describe_node(node: dict) -> str:
    """``node 3f2a…c1 (10.0.0.7, node_w1)``: id, address and the custom resources it advertises (how its
    ``ray start --resources`` told it apart)."""
    custom = sorted(k for k in node.get("Resources", {}) if not k.startswith(("node:", *_BUILTIN)))
    where = ", ".join([node.get("NodeManagerAddress") or "?", *custom])
    return f"node {node['NodeID']} ({where})"


class Placement:
    """Where a run's bundles lie: a snapshot of the placement group's bundle -> node map and of those nodes, taken
    when the group is ready (a lost node's resources are gone from the GCS table afterwards, so it is described
    from this snapshot)."""

    def __init__(self, pg):
        import ray
        from ray.util.placement_group import placement_group_table

        self._ray = ray
        self._pg = pg
        self.bundle_nodes: dict[int, str] = dict(placement_group_table(pg)["bundles_to_node_id"])
        self._described = {n["NodeID"]: describe_node(n) for n in ray.nodes()}

    def alive(self, node_id: str) -> bool:
        return any(n["NodeID"] == node_id and n["Alive"] for n in self._ray.nodes())

    def describe(self, node_id: str) -> str:
        return self._described.get(node_id, f"node {node_id}")

    @property
    def nodes(self) -> set[str]:
        """Ids of the nodes the run's bundles were placed on."""
        return set(self.bundle_nodes.values())

    def lost_node(self, bundle: int) -> str | None:
        """The node bundle ``bundle`` was placed on, if the GCS now has it dead (else None)."""
        node = self.bundle_nodes.get(bundle)
        return node if node and not self.alive(node) else None

    def check_learner(self, iteration: str = "", wait_s: float = 0.0) -> None:
        """Raises :class:`NodeLost` if the learner's node (bundle 0) is dead. ``wait_s``: give the GCS that long
        to notice (an actor error can arrive before the node's missed health checks have marked it dead)."""
        deadline = time.monotonic() + wait_s
        while (node := self.lost_node(0)) is None:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.5)
        others = sorted(i for i, n in self.bundle_nodes.items() if n == node and i)
        also = f" (and placement-group bundles {others})" if others else ""
        raise NodeLost(
            f"lost {self.describe(node)}{iteration}: it held the learner{also}, whose weights and optimizer state "
            "since the last checkpoint went with it, so the run stops; resume it once the cluster can place the "
            "learner again (a replacement node with the resources it needs, or other learner.resources on --resume)",
            node,
        )

    def refresh(self) -> None:
        """Re-reads the bundle -> node map (after Ray re-placed a lost node's bundles) and the node descriptions."""
        from ray.util.placement_group import placement_group_table

        self.bundle_nodes = dict(placement_group_table(self._pg)["bundles_to_node_id"])
        self._described |= {n["NodeID"]: describe_node(n) for n in self._ray.nodes() if n["Alive"]}
