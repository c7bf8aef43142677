"""Which cluster node holds which of a run's actors, and what to say when a node is lost.

A run's placement group has bundle 0 for the learner, 1..n for the rollout workers, then the scorers
(:func:`rayseq.distributed.runtime.bundles`). When a node dies, Ray re-places the bundles it held on the surviving
nodes (the group goes through ``RESCHEDULING``) if they have room, and restarts the workers and scorers there (their
``max_restarts``); the actor manager re-sends shards. The learner is not restarted — its weights and optimizer state
since the last checkpoint were on that node — so losing its node ends the run with :class:`NodeLost`, which names
the node; ``--resume`` continues from the last checkpoint.

Only the GCS's tables are read (``ray.nodes()``, ``ray.util.placement_group_table``): no dashboard needed.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from rayseq.config import RunConfig

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
    """Where a run's bundles lie: the placement group's bundle -> node map and descriptions of those nodes, kept
    as first placed and updated when Ray re-places a bundle on a live node (a lost node's resources are gone from
    the GCS table afterwards, so it is described from what was kept)."""

    def __init__(self, pg):
        import ray

        self._ray = ray
        self._pg = pg
        self.bundle_nodes: dict[int, str] = {}
        self._described: dict[str, str] = {}
        self._update()

    def _update(self, bundles=None) -> set[str]:
        """Takes in ``bundles`` (default all) that Ray placed on a live node other than the one recorded (a first
        placement, or again after their node was lost); returns the ids of the live nodes."""
        from ray.util.placement_group import placement_group_table

        table = placement_group_table(self._pg)["bundles_to_node_id"]
        live = {n["NodeID"]: n for n in self._ray.nodes() if n["Alive"]}
        for bundle, node in table.items():
            if (bundles is None or bundle in bundles) and node in live and node != self.bundle_nodes.get(bundle):
                self.bundle_nodes[bundle] = node
                self._described[node] = describe_node(live[node])
        return set(live)

    def describe(self, node_id: str) -> str:
        return self._described.get(node_id, f"node {node_id}")

    def describe_bundle(self, bundle: int) -> str | None:
        """The node bundle ``bundle`` is placed on now (re-read: Ray may have re-placed it), described; None if the
        bundle is not placed."""
        self._update({bundle})
        node = self.bundle_nodes.get(bundle)
        return self.describe(node) if node else None

    @property
    def nodes(self) -> set[str]:
        """Ids of the nodes the run's bundles are (or were last) placed on."""
        return set(self.bundle_nodes.values())

    def lost_node(self, bundle: int) -> str | None:
        """The node bundle ``bundle`` was last placed on, if the GCS now has it dead (else None). Then the bundle's
        new node is recorded if Ray has re-placed it already (a later loss is named right)."""
        node = self.bundle_nodes.get(bundle)
        live = self._update({bundle})
        return node if node and node not in live else None

    def check_learner(self, wait_s: float = 0.0) -> None:
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
            f"lost {self.describe(node)}: it held the learner{also}, whose weights and optimizer state "
            "since the last checkpoint went with it, so the run stops; resume it once the cluster can place the "
            "learner again (a replacement node with the resources it needs, or other learner.resources on --resume)",
            node,
        )


def bundles(cfg: RunConfig) -> list[dict]:
    """Resource bundles of a run: [learner rank 0, worker × n, scorer × m, learner ranks 1..N−1] (a Tune trial's
    PlacementGroupFactory; ``learner.num_learners`` = N)."""
    r, lc, sc = cfg.rollout, cfg.learner, cfg.scorer
    learner = _bundle(lc.num_cpus, lc.num_gpus, lc.resources)
    if r.num_workers == 0:
        return [learner]
    worker = _bundle(r.num_cpus_per_worker, r.num_gpus_per_worker, r.resources_per_worker)
    scorer = _bundle(sc.num_cpus_per_scorer, sc.num_gpus_per_scorer, sc.resources_per_scorer)
    return [learner] + [worker] * r.num_workers + [scorer] * cfg.num_scorers + [learner] * (lc.num_learners - 1)


def _bundle(cpus: float, gpus: float, custom: dict[str, float]) -> dict:
    """One actor's bundle: CPUs, GPUs if any, and its custom resources (those > 0) that pick its node."""
    return {"CPU": cpus} | ({"GPU": gpus} if gpus else {}) | {k: v for k, v in custom.items() if v}


class Unmet(NamedTuple):
    """Why a placement can never be met (:func:`unmet`); ``bundle``: the index of the bundle that fits on no node
    (None: they fit one by one, not together), ``lacking``: its resources no node has enough of (all of them when
    only their combination is missing)."""

    why: str
    bundle: int | None = None
    lacking: dict | None = None


def unmet(wanted: list[dict], strategy: str, nodes: list[dict]) -> Unmet | None:
    """Why a cluster of ``nodes`` (each node's total resources) can never hold the bundles ``wanted`` placed with
    ``strategy``, however idle it is; None if it can (or might: a bundle may have to wait for others to free room).
    Checked: each bundle fits on some node, each resource's sum fits in the cluster's, STRICT_PACK's sum on one node,
    STRICT_SPREAD's bundles on as many nodes."""

    def fits(bundle: dict, node: dict) -> bool:
        return all(node.get(k, 0.0) >= v for k, v in bundle.items())

    def shown(resources: dict, keys) -> str:
        return "{" + ", ".join(f"{k}: {resources.get(k, 0):g}" for k in keys) + "}"

    for i, bundle in enumerate(wanted):
        if not any(fits(bundle, node) for node in nodes):
            lacking = {k: v for k, v in bundle.items() if all(node.get(k, 0.0) < v for node in nodes)} or bundle
            return Unmet(f"no node can hold the bundle {shown(bundle, bundle)} (the nodes have "
                         f"{', '.join(shown(node, bundle) for node in nodes) or 'none'})", i, lacking)
    total = {k: sum(b.get(k, 0.0) for b in wanted) for b in wanted for k in b}
    cluster = {k: sum(node.get(k, 0.0) for node in nodes) for k in total}
    over = [k for k in total if total[k] > cluster[k] + 1e-9]
    if over:
        return Unmet(f"the bundles want {shown(total, over)} in all, the cluster has {shown(cluster, over)}")
    if strategy == "STRICT_PACK" and not any(fits(total, node) for node in nodes):
        return Unmet(f"STRICT_PACK puts {shown(total, total)} on one node, and no node has that much")
    if strategy == "STRICT_SPREAD" and len(wanted) > len(nodes):
        return Unmet(f"STRICT_SPREAD puts each of the {len(wanted)} bundles on a node of its own; the cluster has "
                     f"{len(nodes)}")
    return None


def bundle_keys(cfg: RunConfig, index: int, resources: dict) -> str:
    """The config keys that size ``resources`` of bundle ``index`` of :func:`bundles`, e.g. ``learner.resources`` for
    a learner's custom resource."""
    n, m = cfg.rollout.num_workers, cfg.num_scorers
    if 1 <= index <= n:
        section, cpus, gpus, custom = "rollout", "num_cpus_per_worker", "num_gpus_per_worker", "resources_per_worker"
    elif n < index <= n + m:
        section, cpus, gpus, custom = "scorer", "num_cpus_per_scorer", "num_gpus_per_scorer", "resources_per_scorer"
    else:
        section, cpus, gpus, custom = "learner", "num_cpus", "num_gpus", "resources"
    keys = [cpus if "CPU" in resources else None, gpus if "GPU" in resources else None,
            custom if set(resources) - {"CPU", "GPU"} else None]
    return " / ".join(f"{section}.{k}" for k in keys if k)
