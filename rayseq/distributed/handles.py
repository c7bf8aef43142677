"""What the actor groups hand between the actors: shard handles, resolved where the data is used.

The groups' ``sample`` / ``mc_search`` / ``score_mc`` / ``score_sequences`` return a list of per-shard *handles*:
Ray ObjectRefs when the groups' members are Ray actors (the data stays in the object store, the driver never
fetches it), the objects themselves in-process (:mod:`rayseq.distributed.groups`). The actor that consumes them
(the learner, a scorer) calls :func:`resolve`. A leaf of ``distributed/`` like :mod:`.placement`: the actors and
the groups import it.
"""

from __future__ import annotations

import sys

from rayseq.types import Rollout


def _object_ref_type():
    if "ray" not in sys.modules:  # no ObjectRef can exist in a process that never imported Ray
        return None
    import ray

    return ray.ObjectRef


def resolve(handles: list) -> list:
    """The objects behind ``handles``: ObjectRefs fetched (one ``ray.get`` for all, in this process), anything
    else returned as it is."""
    ref_type = _object_ref_type()
    if ref_type is None:
        return list(handles)
    at = [i for i, h in enumerate(handles) if isinstance(h, ref_type)]
    if not at:
        return list(handles)
    import ray

    out = list(handles)
    for i, value in zip(at, ray.get([handles[i] for i in at])):
        out[i] = value
    return out


def as_rollout(batch) -> Rollout:
    """A Rollout, or the shard handles of one (concatenated along B in shard order)."""
    return batch if isinstance(batch, Rollout) else Rollout.concat(resolve(batch))
