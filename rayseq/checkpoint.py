"""Checkpoints: one ``torch.save`` dict of plain tensors/containers, loadable with ``weights_only=True``.

Written atomically (temp file + rename) so a crash never leaves a half-written checkpoint; the last
``keep`` checkpoints are kept. Layout: ``<run_dir>/checkpoints/ckpt_<iteration:08d>.pt``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

_NAME = re.compile(r"^ckpt_(\d{8})\.pt$")


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: str | Path, iteration: int, payload: dict, keep: int = 2) -> Path:
    d = checkpoint_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"ckpt_{iteration:08d}.pt"
    tmp = d / f".{path.name}.tmp-{os.getpid()}"
    torch.save(payload, tmp)
    os.replace(tmp, path)
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if _NAME.match(p.name))


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or a run directory (its latest checkpoint)."""
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir():
        found = list_checkpoints(p.parent if p.name == "checkpoints" else p)
        if found:
            return found[-1]
        raise FileNotFoundError(f"no checkpoint in {p} (expected {checkpoint_dir(p)}/ckpt_*.pt)")
    raise FileNotFoundError(f"checkpoint not found: {p}")


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    return torch.load(resolve_checkpoint(path), map_location=map_location, weights_only=True)
