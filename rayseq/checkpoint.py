"""Checkpoints: one ``torch.save`` dict of plain tensors/containers, loadable with ``weights_only=True``.

Layout: ``<run_dir>/checkpoints/ckpt_<iteration:08d>.pt``; the run directory may be a local path or
any pyarrow.fs URI (:class:`rayseq.storage.RunStore`). Written atomically (temporary name, then a
move), so a crash never leaves a half-written checkpoint; the last ``keep`` are kept.
"""

from __future__ import annotations

import io
import os
import re

import torch

from rayseq.storage import RunStore

_NAME = re.compile(r"^ckpt_(\d{8})\.pt$")
CKPT_DIR = "checkpoints"


def _store(run_dir: str | os.PathLike | RunStore) -> RunStore:
    return run_dir if isinstance(run_dir, RunStore) else RunStore(run_dir)


def save_checkpoint(run_dir, iteration: int, payload: dict, keep: int = 2) -> str:
    """Write ``payload`` as the checkpoint of ``iteration``; returns its location."""
    store = _store(run_dir)
    buf = io.BytesIO()
    torch.save(payload, buf)
    name = f"ckpt_{iteration:08d}.pt"
    store.write_bytes(f"{CKPT_DIR}/{name}", buf.getvalue())
    for old in list_checkpoints(store)[:-keep]:
        store.delete(f"{CKPT_DIR}/{old.rsplit('/', 1)[-1]}")
    return store.display(CKPT_DIR, name)


def list_checkpoints(run_dir) -> list[str]:
    """Locations of a run's checkpoints, oldest first."""
    store = _store(run_dir)
    return [store.display(CKPT_DIR, n) for n in store.listdir(CKPT_DIR) if _NAME.match(n)]


def resolve_checkpoint(location: str | os.PathLike) -> str:
    """A checkpoint file, a run directory (its latest checkpoint) or a run's ``checkpoints/`` folder."""
    loc = str(location).rstrip("/")
    parent, _, name = loc.rpartition("/")
    if name.endswith(".pt"):
        if not RunStore(parent or ".").exists(name):
            raise FileNotFoundError(f"checkpoint not found: {loc}")
        return loc
    run_dir = parent if name == CKPT_DIR else loc
    store = RunStore(run_dir)
    if not store.exists():
        raise FileNotFoundError(f"checkpoint not found: {loc}")
    found = list_checkpoints(store)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {loc} (expected {store.display(CKPT_DIR)}/ckpt_*.pt)")
    return found[-1]


def load_checkpoint(location: str | os.PathLike, map_location="cpu") -> dict:
    """Load a checkpoint (file, run directory or URI) with ``weights_only=True``."""
    path = resolve_checkpoint(location)
    parent, _, name = path.rpartition("/")
    data = RunStore(parent or ".").read_bytes(name)
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
