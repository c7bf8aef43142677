"""What the actor groups hand between the actors: shard handles, resolved where the data is used.

The groups' ``sample`` / ``mc_search`` / ``score_mc`` / ``score_sequences`` return a list of per-shard *handles*:
Ray ObjectRefs when the groups' members are Ray actors (the data stays in the object store, the driver never
fetches it), the objects themselves in-process (:mod:`rayseq.distributed.groups`). The actor that consumes them
(the learner, a scorer) calls :func:`resolve`. A leaf of ``distributed/`` like :mod:`.placement`: the actors and
the groups import it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

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


_ALIGN = 64  # byte alignment of each tensor in a FlatWeights buffer


@dataclass
class FlatWeights:
    """State dicts of several modules as one contiguous byte buffer: one object in the object store per weights
    version, which every worker on a node maps without a copy (numpy out-of-band pickling), and one load.

    ``spec``: (module, tensor name, dtype name, shape, byte offset) of each tensor, in state-dict order."""

    data: np.ndarray  # (nbytes,) uint8
    spec: list

    @staticmethod
    def pack(modules: dict) -> FlatWeights:
        """``{module: state dict (name -> tensor) or None}`` -> one buffer (None modules are kept as None)."""
        import torch

        spec, chunks, offset = [], [], 0
        for module, state in modules.items():
            if state is None:
                spec.append((module, None, None, None, None))
                continue
            for name, t in state.items():
                t = t.detach().cpu().contiguous()
                raw = t.reshape(-1).view(torch.uint8).numpy()
                spec.append((module, name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset))
                pad = -raw.nbytes % _ALIGN
                chunks += [raw, np.zeros(pad, np.uint8)] if pad else [raw]
                offset += raw.nbytes + pad
        data = np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)
        return FlatWeights(data, spec)

    def unpack(self) -> dict:
        """The ``{module: state dict or None}`` again; the tensors are views of one writable copy of the buffer
        (the object store's is read-only)."""
        import torch

        buf = torch.from_numpy(self.data.copy())
        out: dict = {}
        for module, name, dtype, shape, offset in self.spec:
            if name is None:
                out[module] = None
                continue
            dt = getattr(torch, dtype)
            n = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dt).element_size()
            out.setdefault(module, {})[name] = buf[offset : offset + n].view(dt).reshape(shape)
        return out


def as_state_dicts(weights) -> dict:
    """Weights as a worker receives them: ``{module: state dict}`` in-process, a :class:`FlatWeights` (a call's
    top-level argument, resolved by Ray), or ``[ref]`` (a handle, fetched here) -> ``{module: state dict}``."""
    if isinstance(weights, list):
        (weights,) = resolve(weights)
    return weights.unpack() if isinstance(weights, FlatWeights) else weights
