"""Checkpoints: one ``torch.save`` dict of plain tensors/containers, loadable with ``weights_only=True``.

Layout: ``<run_dir>/checkpoints/ckpt_<iteration:08d>.pt``; the run directory may be a local path or
any pyarrow.fs URI (:class:`rayseq.storage.RunStore`). Written atomically (temporary name, then a
move), so a crash never leaves a half-written checkpoint; the last ``keep`` are kept.

A payload with ``weights_format: safetensors`` (a policy class that declares it: ``model.arch=hf``) has the trained
generator weights (``learner.generator``: all of them, or the LoRA adapters) written beside it as
``ckpt_<iteration:08d>.safetensors`` — the format Hugging Face tools read — and the ``.pt`` holds the rest with
``learner.generator = {"safetensors": <file name>}``; :func:`load_checkpoint` puts the weights back. The
``.safetensors`` is written first, so a ``.pt`` never exists without its weights.

An exported built-in generator (``python -m rayseq.export``: ``config.json`` with ``format`` :data:`EXPORT_FORMAT`,
``vocab.json``, ``model.safetensors``) loads as a checkpoint too: :func:`resolve_checkpoint` of its folder names its
``config.json`` and :func:`load_checkpoint` assembles what serving reads (task spec, model config, weights, what
produced them).
"""

from __future__ import annotations

import io
import os
import re

import torch

from rayseq.storage import RunStore

_NAME = re.compile(r"^ckpt_(\d{8})\.pt$")
CKPT_DIR = "checkpoints"
EXPORT_FORMAT = "rayseq-export-v1"  # config.json of an exported built-in generator (rayseq.export)


def _store(run_dir: str | os.PathLike | RunStore) -> RunStore:
    return run_dir if isinstance(run_dir, RunStore) else RunStore(run_dir)


def save_checkpoint(run_dir, iteration: int, payload: dict, keep: int = 2) -> str:
    """Write ``payload`` as the checkpoint of ``iteration``; returns its location."""
    store = _store(run_dir)
    name = f"ckpt_{iteration:08d}.pt"
    if payload.get("weights_format") == "safetensors":
        from safetensors.torch import save

        weights = name.removesuffix(".pt") + ".safetensors"
        tensors = {k: v.detach().cpu().contiguous() for k, v in payload["learner"]["generator"].items()}
        store.write_bytes(f"{CKPT_DIR}/{weights}", save(tensors, metadata={"format": "pt"}))
        payload = {**payload, "learner": {**payload["learner"], "generator": {"safetensors": weights}}}
    buf = io.BytesIO()
    torch.save(payload, buf)
    store.write_bytes(f"{CKPT_DIR}/{name}", buf.getvalue())
    for old in list_checkpoints(store)[:-keep]:
        old_name = old.rsplit("/", 1)[-1]
        store.delete(f"{CKPT_DIR}/{old_name}")
        store.delete(f"{CKPT_DIR}/{old_name.removesuffix('.pt')}.safetensors")  # nothing there unless it has one
    return store.display(CKPT_DIR, name)


def list_checkpoints(run_dir) -> list[str]:
    """Locations of a run's checkpoints, oldest first."""
    store = _store(run_dir)
    return [store.display(CKPT_DIR, n) for n in store.listdir(CKPT_DIR) if _NAME.match(n)]


def resolve_checkpoint(location: str | os.PathLike) -> str:
    """A checkpoint file, a run directory (its latest checkpoint) or a run's ``checkpoints/`` folder."""
    loc = str(location).rstrip("/")
    parent, _, name = loc.rpartition("/")
    if name == "config.json" and _is_export(RunStore(parent or ".")):
        return loc
    if name.endswith(".pt"):
        if not RunStore(parent or ".").exists(name):
            raise FileNotFoundError(f"checkpoint not found: {loc}")
        return loc
    run_dir = parent if name == CKPT_DIR else loc
    store = RunStore(run_dir)
    if not store.exists():
        raise FileNotFoundError(f"checkpoint not found: {loc}")
    if _is_export(store):
        return store.display("config.json")
    found = list_checkpoints(store)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {loc} (expected {store.display(CKPT_DIR)}/ckpt_*.pt)")
    return found[-1]


def load_checkpoint(location: str | os.PathLike, map_location="cpu") -> dict:
    """Load a checkpoint (file, run directory or URI) with ``weights_only=True``."""
    path = resolve_checkpoint(location)
    parent, _, name = path.rpartition("/")
    store = RunStore(parent or ".")
    if name == "config.json":
        return _load_export(store, map_location)
    ck = torch.load(io.BytesIO(store.read_bytes(name)), map_location=map_location, weights_only=True)
    generator = ck.get("learner", {}).get("generator") if isinstance(ck.get("learner"), dict) else None
    if isinstance(generator, dict) and set(generator) == {"safetensors"}:
        from safetensors.torch import load

        weights = load(store.read_bytes(generator["safetensors"]))
        device = torch.device(map_location) if isinstance(map_location, (str, torch.device)) else None
        ck["learner"]["generator"] = {k: v.to(device) for k, v in weights.items()} if device else weights
    return ck


def _is_export(store: RunStore) -> bool:
    """Whether a folder holds an exported built-in generator (its config.json names :data:`EXPORT_FORMAT`)."""
    import json

    if not store.exists("config.json"):
        return False
    try:
        return json.loads(store.read_bytes("config.json")).get("format") == EXPORT_FORMAT
    except (ValueError, AttributeError):
        return False


def _load_export(store: RunStore, map_location) -> dict:
    """An exported generator as the parts of a checkpoint serving reads."""
    import json

    from safetensors.torch import load

    config = json.loads(store.read_bytes("config.json"))
    task = {**config["task"], "vocab": json.loads(store.read_bytes("vocab.json"))}
    weights = load(store.read_bytes("model.safetensors"))
    if isinstance(map_location, (str, torch.device)):
        weights = {k: v.to(torch.device(map_location)) for k, v in weights.items()}
    return {"task": task, "config": {"model": config["model"], "algo": {"name": config["algo"]},
                                     "train": {"pretrain_iters": config["pretrain_iters"]}},
            "driver": config["driver"], "learner": {"generator": weights}}
