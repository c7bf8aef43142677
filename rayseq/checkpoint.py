"""Checkpoints: ``torch.save`` dicts of plain tensors/containers, loadable with ``weights_only=True``.

Layout: ``<run_dir>/checkpoints/ckpt_<iteration:08d>.pt`` and the files beside it that belong to it; the run directory
may be a local path or any pyarrow.fs URI (:class:`rayseq.storage.RunStore`). Every file is written atomically
(a temporary name then a rename; an object store's upload is atomic by itself), so a crash never leaves a half-written
file; the last ``keep`` checkpoints are kept.

A checkpoint is written by the processes that hold its parts (:data:`FORMAT`): the learner writes its own state —
the trained generator weights in ``ckpt_N.learner/generator.pt`` (beside the head as ``ckpt_N.safetensors``, the format
Hugging Face tools read, for a policy class that declares ``weights_format = "safetensors"``: ``model.arch=hf``) and
the rest of the learner's state (baseline, optimizers, the algorithm's modules, RNG) in ``ckpt_N.learner/state.pt``
(:func:`write_learner_state`; a sharded learner's modules and optimizers in ``ckpt_N.learner/dcp/``) —
then the driver writes the head ``ckpt_N.pt``: the config, the task, its own state and the names of the learner's
files (:func:`save_checkpoint`). No model or optimizer byte passes through the driver. :func:`load_checkpoint`
assembles the parts into one dict (``learner``: the learner's state dict); ``training_state=False`` reads the
weights alone (serving, export). A checkpoint written before learners wrote their own state (one ``.pt`` holding the
learner's state, weights maybe in ``.safetensors``) loads the same way, and so does a learner state written before
algorithms owned their modules (the algorithm's entries at its top level: :func:`algorithm_entries`).

Atomic writes do not protect a file damaged later (a truncated copy between machines, bit rot on shared storage):
each file's SHA-256 is recorded in ``ckpt_<iteration:08d>.sha256`` (the format of ``sha256sum``, so ``sha256sum -c``
checks it too), written before the head, and verified before a file is unpickled. The head is written last: a
checkpoint exists once its head does. Loading a run directory takes its newest checkpoint that loads: a damaged one is
named in a warning and the previous one is tried (:func:`load_latest`); when none loads, one line names every file
tried.

An exported built-in generator (``python -m rayseq.export``: ``config.json`` with ``format`` :data:`EXPORT_FORMAT`,
``vocab.json``, ``model.safetensors``) loads as a checkpoint too: :func:`resolve_checkpoint` of its folder names its
``config.json`` and :func:`load_checkpoint` assembles what serving reads (task spec, model config, weights, what
produced them).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import sys
from pathlib import Path

import torch

from rayseq.storage import RunStore

_NAME = re.compile(r"^ckpt_(\d{8})\.pt$")
CKPT_DIR = "checkpoints"
EXPORT_FORMAT = "rayseq-export-v1"  # config.json of an exported built-in generator (rayseq.export)
FORMAT = "rayseq-checkpoint-v2"  # a head whose learner state is in files the learner wrote (module docstring)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be loaded: damaged (its SHA-256 differs from the recorded one), truncated or
    not a rayseq checkpoint. The message names the file."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _digest_name(pt_name: str) -> str:
    return pt_name.removesuffix(".pt") + ".sha256"


def _store(run_dir: str | os.PathLike | RunStore) -> RunStore:
    return run_dir if isinstance(run_dir, RunStore) else RunStore(run_dir)


def checkpoint_stem(iteration: int) -> str:
    """``ckpt_<iteration:08d>``: what every file of the checkpoint of ``iteration`` is named after."""
    return f"ckpt_{iteration:08d}"


def learner_folder(stem: str) -> str:
    """``<stem>.learner``: the folder of a checkpoint's learner files (beside its head, which alone matches
    ``ckpt_*.pt``)."""
    return f"{stem}.learner"


def _to_cpu(value):
    """``value`` (nested dicts/lists of tensors) with every tensor detached and on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


# the learner's own entries of its state (``Learner.state_dict``). Any other top-level entry is the algorithm's: a
# checkpoint written before algorithms owned their modules keeps them there (its modules, their optimizers and
# counters, the value baseline, the KL reference and β), where the current layout keeps them under ``algo``
_LEARNER_KEYS = {"generator", "gen_opt", "stage", "version", "torch_rng", "cuda_rng", "algo", "dcp"}


def algorithm_entries(learner_state: dict) -> dict:
    """The algorithm's entries of a learner's state (``Algorithm.state_dict``), wherever the checkpoint keeps them:
    under ``algo``, or at the top level in a checkpoint written before algorithms owned their modules."""
    return {**{k: v for k, v in learner_state.items() if k not in _LEARNER_KEYS}, **learner_state.get("algo", {})}


def write_learner_state(run_dir, stem: str, state: dict, weights_format: str = "torch") -> dict:
    """Write a learner's state (``Learner.state_dict``) into the run's checkpoints,
    on the CPU: the generator's weights (``<stem>.safetensors`` or ``<stem>.learner/generator.pt``) and the rest
    (``<stem>.learner/state.pt``; a sharded learner's modules and optimizers are in ``<stem>.learner/dcp/``, written
    by every rank: :func:`write_directory`). Returns what the head records: ``{"generator": file, "state": file,
    "files": {file: SHA-256}}``."""
    store = _store(run_dir)
    state = dict(state)
    weights = _to_cpu(state.pop("generator"))
    files = {}
    if weights_format == "safetensors":
        from safetensors.torch import save

        gen_name = f"{stem}.safetensors"
        data = save({k: v.contiguous() for k, v in weights.items()}, metadata={"format": "pt"})
        files[gen_name] = store.write_file(f"{CKPT_DIR}/{gen_name}", lambda f: f.write(data))[0]
    else:
        gen_name = f"{learner_folder(stem)}/generator.pt"
        files[gen_name] = store.write_file(f"{CKPT_DIR}/{gen_name}", lambda f: torch.save(weights, f))[0]
    state_name = f"{learner_folder(stem)}/state.pt"
    state = _to_cpu(state)
    files[state_name] = store.write_file(f"{CKPT_DIR}/{state_name}", lambda f: torch.save(state, f))[0]
    return {"generator": gen_name, "state": state_name, "files": files}


def write_directory(run_dir, rel: str, local: str | os.PathLike) -> dict:
    """Copy the files of a local directory (a rank's shards of ``torch.distributed.checkpoint``) to ``<checkpoints>/
    <rel>/`` in the run directory, as streams; returns ``{"<rel>/<file>": SHA-256}``."""
    from rayseq.storage import copy_file

    store, folder = _store(run_dir), RunStore(local)
    return {f"{rel}/{name}": copy_file(folder, name, store, f"{CKPT_DIR}/{rel}/{name}") for name in folder.listdir()
            if (Path(local) / name).is_file()}


def read_directory(location: str, local: str | os.PathLike) -> None:
    """The files of a checkpoint's directory (``location``: its path or URI) into the local directory ``local``, as
    streams."""
    from rayseq.storage import copy_file

    store, folder = RunStore(location), RunStore(local)
    for name in store.listdir():
        copy_file(store, name, folder, name)


def save_checkpoint(run_dir, iteration: int, payload: dict, keep: int = 2, files: dict | None = None) -> str:
    """Write the head ``payload`` as the checkpoint of ``iteration`` and keep the last ``keep``; returns its
    location. ``files``: ``{file: SHA-256}`` of the files the learner wrote for it (:func:`write_learner_state`),
    recorded with the head's digest; without them, ``payload["learner"]`` holds the learner's state itself (its
    weights then written beside it as safetensors when ``payload["weights_format"]`` says so)."""
    store = _store(run_dir)
    name = f"{checkpoint_stem(iteration)}.pt"
    digests = [f"{digest}  {file}" for file, digest in (files or {}).items()]  # lines of ckpt_N.sha256
    if files is None and payload.get("weights_format") == "safetensors":
        from safetensors.torch import save

        weights = name.removesuffix(".pt") + ".safetensors"
        tensors = {k: v.detach().cpu().contiguous() for k, v in payload["learner"]["generator"].items()}
        data = save(tensors, metadata={"format": "pt"})
        store.write_bytes(f"{CKPT_DIR}/{weights}", data)
        digests.append(f"{_sha256(data)}  {weights}")
        payload = {**payload, "learner": {**payload["learner"], "generator": {"safetensors": weights}}}
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    digests.append(f"{_sha256(data)}  {name}")
    store.write_text(f"{CKPT_DIR}/{_digest_name(name)}", "\n".join(digests) + "\n")  # before the head it checks
    store.write_bytes(f"{CKPT_DIR}/{name}", data)
    for old in list_checkpoints(store)[:-keep]:
        old_name = old.rsplit("/", 1)[-1]
        for file in checkpoint_files(store.display(CKPT_DIR), old_name):
            store.delete(f"{CKPT_DIR}/{file}")
        store.delete_dir(f"{CKPT_DIR}/{learner_folder(old_name.removesuffix('.pt'))}")
    return store.display(CKPT_DIR, name)


def checkpoint_files(folder, name: str) -> list[str]:
    """The files of checkpoint ``name`` (``ckpt_N.pt``) in ``folder`` (the one that holds it: a run's
    ``checkpoints/``): those its ``.sha256`` lists, the ``.sha256`` and the head (a checkpoint written before digests
    were recorded: the head and its weights)."""
    store = _store(folder)
    stem = name.removesuffix(".pt")
    listed = [f for f in _recorded_digests(store, name) if f != name]
    if not listed and store.exists(f"{stem}.safetensors"):
        listed = [f"{stem}.safetensors"]
    return [*listed, _digest_name(name), name]


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


def _recorded_digests(store: RunStore, name: str) -> dict[str, str]:
    """{file name: SHA-256} recorded beside checkpoint ``name`` ({} for a checkpoint written before they were)."""
    if not store.exists(_digest_name(name)):
        return {}
    out = {}
    for line in store.read_text(_digest_name(name)).splitlines():
        digest, _, file = line.strip().partition("  ")
        if file:
            out[file.lstrip("*")] = digest
    return out


def _check_stream(store: RunStore, name: str, recorded: dict[str, str]) -> None:
    """``name``'s SHA-256 against the recorded one, read in blocks (a large file is never held whole)."""
    digest = hashlib.sha256()
    try:
        with store.fs.open_input_stream(store.path(name)) as f:
            while block := f.read(1 << 24):
                digest.update(block)
    except OSError as exc:
        raise CheckpointError(f"{store.display(name)}: cannot be read ({exc})") from None
    if digest.hexdigest() != recorded[name]:
        raise CheckpointError(f"{store.display(name)} is damaged: its SHA-256 differs from the one recorded when it "
                              "was written (the .sha256 beside it)")


def _read_verified(store: RunStore, name: str, recorded: dict[str, str]) -> bytes:
    try:
        data = store.read_bytes(name)
    except OSError as exc:
        raise CheckpointError(f"{store.display(name)}: cannot be read ({exc})") from None
    if name in recorded and _sha256(data) != recorded[name]:
        raise CheckpointError(f"{store.display(name)} is damaged: its SHA-256 differs from the one recorded when it "
                              f"was written ({_digest_name(name) if name.endswith('.pt') else 'the .sha256 beside it'}"
                              f"; {len(data)} bytes now)")
    return data


def _torch_load(store: RunStore, name: str, recorded: dict, map_location):
    """A torch file of a checkpoint, its recorded SHA-256 checked before it is unpickled."""
    data = _read_verified(store, name, recorded)
    try:
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as exc:  # a damaged file written before digests were recorded: torch's own error
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{store.display(name)} does not load: {first}") from None


def _load_weights(store: RunStore, name: str, recorded: dict, map_location) -> dict:
    """The generator's weights: a ``.safetensors`` or a torch file."""
    if not name.endswith(".safetensors"):
        return _torch_load(store, name, recorded, map_location)
    from safetensors.torch import load

    try:
        weights = load(_read_verified(store, name, recorded))
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{store.display(name)} does not load: {exc}") from None
    device = torch.device(map_location) if isinstance(map_location, (str, torch.device)) else None
    return {k: v.to(device) for k, v in weights.items()} if device else weights


def _load_file(path: str, map_location="cpu", training_state: bool = True) -> dict:
    """One checkpoint (its head ``path``) with its learner's files, each file's recorded SHA-256 checked before it is
    unpickled: ``learner`` is the learner's state dict (``training_state=False``: the generator's weights alone).
    Raises CheckpointError."""
    parent, _, name = path.rpartition("/")
    store = RunStore(parent or ".")
    if name == "config.json":
        return _load_export(store, map_location)
    recorded = _recorded_digests(store, name)
    ck = _torch_load(store, name, recorded, map_location)
    if not isinstance(ck, dict) or "config" not in ck:
        raise CheckpointError(f"{store.display(name)} is not a rayseq checkpoint")
    learner = ck.get("learner")
    if isinstance(learner, dict) and isinstance(learner.get("state"), str):  # the learner's own files
        ck["learner"] = _torch_load(store, learner["state"], recorded, map_location) if training_state else {}
        if "dcp" in ck["learner"]:  # a sharded learner's modules and optimizers: where they are
            ck["learner"]["dcp"] = store.display(ck["learner"]["dcp"])
        ck["learner"]["generator"] = _load_weights(store, learner["generator"], recorded, map_location)
        return ck
    generator = learner.get("generator") if isinstance(learner, dict) else None
    if isinstance(generator, dict) and set(generator) == {"safetensors"}:
        ck["learner"]["generator"] = _load_weights(store, generator["safetensors"], recorded, map_location)
    return ck


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:  # a run directory read twice in one process (the CLI, then the driver) warns once
        _WARNED.add(message)
        print(f"warning: {message}", file=sys.stderr, flush=True)


def _newest_that(location, check, verb: str):
    """(file, check(file)) for the newest checkpoint of ``location`` that passes ``check`` (a file is checked as it
    is); each damaged newer one is named in a warning. Raises FileNotFoundError or CheckpointError (one line)."""
    newest = resolve_checkpoint(location)
    loc = str(location).rstrip("/")
    if loc.endswith(".pt") or newest.endswith("/config.json"):  # a file as it is; an exported generator
        return newest, check(newest)
    tried = []
    for path in reversed(list_checkpoints(newest.rsplit("/", 2)[0])):
        try:
            result = check(path)
        except CheckpointError as exc:
            tried.append(str(exc))
            continue
        for reason in tried:
            _warn_once(f"{reason}; {verb} the previous checkpoint, {path.rsplit('/', 1)[-1]}")
        return path, result
    raise CheckpointError(f"no checkpoint of {loc} loads; tried: " + "; ".join(tried))


def _head(path: str) -> dict:
    """A checkpoint's head, every file of the checkpoint checked against its recorded SHA-256 first (read in
    blocks; none but the head unpickled)."""
    parent, _, name = path.rpartition("/")
    store = RunStore(parent or ".")
    if name == "config.json":
        return _load_export(store, "cpu")
    recorded = _recorded_digests(store, name)
    for file in recorded:
        if file != name:
            _check_stream(store, file, recorded)
    ck = _torch_load(store, name, recorded, "cpu")
    if not isinstance(ck, dict) or "config" not in ck:
        raise CheckpointError(f"{store.display(name)} is not a rayseq checkpoint")
    return ck


def select_checkpoint(location: str | os.PathLike) -> tuple[str, dict]:
    """(file, head) of the newest checkpoint of ``location`` whose files all check out (each damaged newer one named
    in a warning, as :func:`load_latest`): what the driver reads to resume a run, its learners reading their own
    state (``Learner.restore``). The head of a checkpoint written before learners wrote their own state holds
    that state too."""
    return _newest_that(location, _head, "loading")


def load_latest(location: str | os.PathLike, map_location="cpu", training_state: bool = True) -> tuple[str, dict]:
    """(file, checkpoint) of ``location``: a checkpoint file is loaded as it is; a run directory (or its
    ``checkpoints/`` folder) gives its newest checkpoint that loads, each damaged newer one named in a warning.
    ``training_state=False``: the learner's weights without its training state (optimizers, the algorithm's modules).
    Raises FileNotFoundError (no checkpoint) or CheckpointError (one line: every file tried, and why)."""
    return _newest_that(location, lambda path: _load_file(path, map_location, training_state), "loading")


def load_checkpoint(location: str | os.PathLike, map_location="cpu", training_state: bool = True) -> dict:
    """Load a checkpoint (file, run directory or URI) with ``weights_only=True``: :func:`load_latest`'s."""
    return load_latest(location, map_location, training_state)[1]


def verify_checkpoint(path: str) -> None:
    """Check a checkpoint's files against their recorded SHA-256 without unpickling them, each read in blocks (a
    sharded learner's shards are never whole in memory); a file written before digests were recorded is loaded
    instead. Raises CheckpointError."""
    parent, _, name = path.rpartition("/")
    store = RunStore(parent or ".")
    recorded = _recorded_digests(store, name)
    if name not in recorded:
        _load_file(path)
        return
    for file in recorded:
        _check_stream(store, file, recorded)


def check_base_model(ck: dict, where: str) -> None:
    """The folders outside the run that a checkpoint's policy is rebuilt from — a Hugging Face policy's base model
    (``model.path``: its config, and the weights LoRA adapters go on) and its tokenizer — are there from here:
    FileNotFoundError naming the key and the path otherwise, before a server or an export starts. A run keeps them as
    absolute paths (:mod:`rayseq.config.paths`); one written by an older rayseq kept them as given, relative to the
    folder it ran in."""
    model = (ck.get("config") or {}).get("model") or {}
    vocab = (ck.get("task") or {}).get("vocab") or {}
    needed = [("model.path", model.get("path"))] if model.get("arch") == "hf" else []
    needed += [("task.hf_tokenizer", vocab.get("hf_tokenizer"))]
    for key, path in needed:
        if not path or "://" in str(path):
            continue
        folder = Path(path).expanduser()
        if (folder / "config.json").is_file() if key == "model.path" else folder.is_dir():
            continue
        relative = not os.path.isabs(os.path.expanduser(str(path)))
        raise FileNotFoundError(
            f"{where} was trained from {path} ({key}), which is not there"
            + (f" from {os.getcwd()}: the run kept the path as it was given; run this from the folder the run was "
               "started in" if relative else ": the run reads it from there; put the model back, or run this where "
               "it is"))


def latest_good_checkpoint(location: str | os.PathLike) -> str:
    """:func:`resolve_checkpoint`, skipping (with a warning each) a run's damaged newest checkpoints: what a server
    hands to its replicas. Raises FileNotFoundError or CheckpointError as :func:`load_latest`."""
    return _newest_that(location, verify_checkpoint, "using")[0]


def set_aside_newer(run_dir, kept: str) -> list[str]:
    """Rename the checkpoints newer than ``kept`` (damaged ones :func:`load_latest` skipped) to ``*.damaged``, so that
    a resumed run neither prefers them nor keeps them in place of its good ones; returns the new names."""
    store = _store(run_dir)
    kept_name = kept.rsplit("/", 1)[-1]
    moved = []
    for path in list_checkpoints(store):
        name = path.rsplit("/", 1)[-1]
        if name <= kept_name:
            continue
        # the head and its digests (small); its other files too on a filesystem (an object store would copy them)
        files = checkpoint_files(store.display(CKPT_DIR), name) if not store.is_object_store \
            else [_digest_name(name), name]
        for file in files:
            if store.exists(f"{CKPT_DIR}/{file}"):
                store.rename(f"{CKPT_DIR}/{file}", f"{CKPT_DIR}/{file}.damaged")
        moved.append(store.display(CKPT_DIR, f"{name}.damaged"))
    return moved


# what the generator's weights do not depend on (train.init_from); dropout is training, not shape. An algorithm's own
# config sections say which of their keys shape its modules' weights (their ``weights_keys``)
_NOT_WEIGHTS = {"model": {"dropout", "lora_dropout"}}


def init_from_differences(ours: dict, task_spec: dict, ck: dict) -> list[str]:
    """What keeps ``ck``'s weights from this run's model: ``model.*`` (and the architecture keys of the algorithm's own
    sections that both runs have, e.g. SeqGAN's ``disc.*``) that differ, the vocabulary and whether the model reads an
    input. ``ours``: this run's resolved
    config dict; ``task_spec``: its task's :func:`rayseq.tasks.base.task_spec`. Where the data comes from
    (``task.source``, ``task.prepare``), the reward, the algorithm and the schedule do not matter."""
    from rayseq.config import RunConfig, config_to_dict

    try:  # as this version reads it (keys added since take their defaults)
        theirs = config_to_dict(RunConfig.model_validate(ck["config"]))
    except ValueError:
        theirs = ck["config"]
    from rayseq import registry

    shaping = {"model": [k for k in ours["model"] if k not in _NOT_WEIGHTS["model"]]}
    for sec, model in registry.algorithm_class(ours["algo"]["name"]).sections.items():
        shaping[sec] = list(model.weights_keys)
    diff = []
    for sec, keys in shaping.items():
        if sec not in ours or sec not in theirs:
            continue
        diff += [f"{sec}.{k} ({theirs[sec].get(k)!r} there, {ours[sec][k]!r} here)" for k in keys
                 if theirs[sec].get(k) != ours[sec][k]]
    their_task = ck.get("task", {})
    if their_task.get("vocab") != task_spec["vocab"]:
        sizes = [len(v["itos"]) if isinstance(v, dict) and "itos" in v else None
                 for v in (their_task.get("vocab"), task_spec["vocab"])]
        shown = f"{sizes[0]} words there, {sizes[1]} here; " if None not in sizes else ""
        diff.append(f"the vocabulary ({shown}another task.data or task.name)")
    if bool(their_task.get("conditional", True)) != bool(task_spec["conditional"]):
        diff.append(f"task.name ({their_task.get('name')} there, {task_spec['name']} here: one model reads an input)")
    return diff


def checkpoint_to_resume(store: RunStore, cfg) -> tuple[str, dict]:
    """``--resume``: the run's latest checkpoint that loads (a damaged newer one is named in a warning and set aside),
    its head read and checked against this run's config ``cfg`` before anything is written or started: its task,
    model and algorithm must be this config's (else the weights would not fit). Returns (file, head)."""
    from rayseq.config import RunConfig, config_to_dict

    if not list_checkpoints(store):
        raise FileNotFoundError(f"--resume: no checkpoint in {store.display(CKPT_DIR)}")
    path, ck = select_checkpoint(store.display())
    try:  # as this version reads it: keys added since (model.arch) take their defaults
        theirs = config_to_dict(RunConfig.model_validate(ck["config"]))
    except ValueError:
        theirs = ck["config"]
    ours = config_to_dict(cfg)
    diff = [f"{sec}.{k}" for sec in ("task", "model") for k in ours[sec] if theirs.get(sec, {}).get(k) != ours[sec][k]]
    diff += ["algo.name"] if theirs.get("algo", {}).get("name") != cfg.algo.name else []
    if diff:
        run_dir = store.display()
        raise ValueError(f"--resume: {run_dir} was trained with another {', '.join(diff)} (its checkpoint's config); "
                         f"resume it with its own config: python -m rayseq.train run_dir={run_dir} --resume")
    set_aside_newer(store, path)
    return path, ck


def checkpoint_to_start_from(cfg, task_spec: dict) -> tuple[str, dict]:
    """``train.init_from``'s checkpoint, its head checked before anything is written or started: only what the weights
    depend on must match (:func:`init_from_differences`), and that run must have finished MLE pretraining; a
    ConfigError (one line) else. Returns (file, head)."""
    from rayseq.config import ConfigError, config_to_dict

    source = cfg.train.init_from
    path, ck = select_checkpoint(source)  # a run directory: its newest checkpoint that loads
    if diff := init_from_differences(config_to_dict(cfg), task_spec, ck):
        raise ConfigError(f"train.init_from={source}: its model cannot start this run: {'; '.join(diff)}")
    driver = ck["driver"]
    if driver["stage"] == "mle" and driver["stage_iter"] < int(ck["config"]["train"]["pretrain_iters"]):
        raise ConfigError(f"train.init_from={source}: that run has not finished MLE pretraining")
    return path, ck


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


def store_reader(location: str):
    """A ``torch.distributed.checkpoint`` reader of the directory ``location`` (a local path or a pyarrow.fs URI:
    ``s3://``...) that reads in place what this rank's load plan names and nothing else.

    DCP's load plan (``DefaultLoadPlanner``) lists, for each entry of the state dict being filled, the saved chunks
    that overlap this rank's own part of it: a DTensor's local shard, or the whole of a plain tensor or object. The
    reader opens only the files those chunks are in and reads only their byte ranges (random access: a local file's
    seek, an object store's ranged GET). So a learner that loads shards saved by as many ranks, split the same way
    (a resume, a rebuilt learner), reads its own rank's file, and from the others only the entries every rank holds
    whole (unsharded tensors and objects, which the save wrote once); a learner on fewer ranks reads the parts it now
    holds, from every file. Each read is recorded in the reader's ``reads``: ``(file, entry, bytes)``."""
    from contextlib import contextmanager

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.filesystem import FileSystemBase

    from rayseq.storage import RunStore

    store = RunStore(location)

    class StoreFiles(FileSystemBase):
        """DCP's filesystem interface, its reading half, over the run store."""

        @contextmanager
        def create_stream(self, path, mode):
            if mode != "rb":
                raise ValueError(f"{store.display()} is opened for reading only (mode {mode!r})")
            with store.fs.open_input_file(str(path)) as f:
                yield f

        def concat_path(self, path, suffix):
            return f"{path}/{suffix}"

        def init_path(self, path):
            return str(path)

        def exists(self, path):
            return store.fs.get_file_info(str(path)).type.name != "NotFound"

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id) -> bool:
            return True

        def rename(self, path, new_path):
            raise NotImplementedError("reading only")

        mkdir = rm_file = rename

    class StoreReader(FileSystemReader):
        def __init__(self):
            super().__init__(store.root)
            self.fs, self.path, self.reads = StoreFiles(), store.root, []

        def read_data(self, plan, planner):
            for item in plan.items:
                info = self.storage_data[item.storage_index]
                self.reads.append((info.relative_path, item.storage_index.fqn, info.length))
            return super().read_data(plan, planner)

    return StoreReader()


def read_module_shards(location: str, modules: dict) -> None:
    """Fill each of ``modules`` (``{name: module}``, whole, unsharded) from the ``torch.distributed.checkpoint``
    directory ``location`` that sharded learners wrote (any number of ranks; :func:`store_reader`), in this process,
    with no process group: e.g. a reward model's head outside its run."""
    import torch.distributed.checkpoint as dcp

    state = {name: module.state_dict() for name, module in modules.items()}
    dcp.load(state, storage_reader=store_reader(location), no_dist=True)
    for name, module in modules.items():
        module.load_state_dict(state[name])
