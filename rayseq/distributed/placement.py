"""Where this process runs: the placement group of its actor (diagnostics the actors report).

A leaf of ``distributed/``: the actors (learner, rollout workers, scorers) import it, and the groups import the
actors, so it lives neither in an actor's module nor in :mod:`rayseq.distributed.groups`.
"""

from __future__ import annotations

import sys


def placement_group_id() -> str | None:
    """Hex id of the placement group this process's actor runs in (None in-process or outside one)."""
    if "ray" not in sys.modules:
        return None
    import ray

    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_placement_group_id()
