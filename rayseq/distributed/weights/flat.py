"""Weights as one buffer: the learner's state dicts packed into one object per version (:class:`FlatWeights`), and
what a worker receives unpacked (:func:`as_state_dicts`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayseq.distributed.handles import resolve

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
