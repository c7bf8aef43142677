"""Joining or starting Ray, and the resources a run reserves (its placement group's bundles).

The actor groups themselves (learner, rollout workers, scorers; in-process or Ray actors) are
:mod:`rayseq.distributed.groups`; their fault recovery :mod:`rayseq.distributed.groups.manager`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import sys


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


def placement_group_id() -> str | None:
    """Hex id of the placement group this process's actor runs in (None in-process or outside one)."""
    if "ray" not in sys.modules:
        return None
    import ray

    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_placement_group_id()


def bundles_on_this_node(bundles: range) -> int:
    """How many of the placement group's ``bundles`` (indices) are placed on the node this process's actor runs on,
    as the placement group says now (after a node loss Ray may have re-placed them); 1 in-process or outside a
    placement group."""
    if "ray" not in sys.modules:
        return 1
    import ray

    if not ray.is_initialized():
        return 1
    from ray.util.placement_group import get_current_placement_group, placement_group_table

    pg = get_current_placement_group()
    if pg is None:
        return 1
    node = ray.get_runtime_context().get_node_id()
    placed = placement_group_table(pg)["bundles_to_node_id"]
    return max(1, sum(1 for b in bundles if placed.get(b) == node))
