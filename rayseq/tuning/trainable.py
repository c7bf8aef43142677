"""The Tune trial: one :class:`~rayseq.distributed.driver.Trainer` run — the loop of ``python -m rayseq.train``
— whose per-iteration callback reports to Tune.

What a trial reports every iteration (``tune.report``):

- the iteration's metrics row (``loss/*``, ``policy/*``, ``rollout/*``, ``time/*``, ...) and ``stage``;
- ``iteration`` (all stages) and ``algo_iteration`` (iterations of the algorithm stage, 0 during
  pretraining): the schedulers' clocks (``search.scheduler.time_attr``). Both come back with a checkpoint,
  so a PBT clone or a restarted trial continues the clock of the checkpoint it starts from;
- the ``val/*`` metrics of the *last* validation (they are computed every ``train.eval_every``
  iterations): Tune requires the search metric in every result, and ASHA records a rung at the first
  result past it, so each result carries the latest evaluation; ``tune/eval_fresh`` is 1 on the rows that
  evaluated (the plots use those). Before a trial's first evaluation the search metric is NaN, which
  ASHA's cut-offs and PBT's quantiles ignore; with ``time_attr: algo_iteration`` no decision falls
  before the evaluation that ends MLE pretraining;
- ``tune/restored_iteration``: the checkpoint's iteration this trial session started from (0: from scratch);
  with Ray rollout workers, ``tune/trial_placement_group``, ``tune/learner_placement_group`` and
  ``tune/worker_placement_groups`` (ids; all equal when the actors run in the trial's reservation).

Tune's ``result.json`` holds every key; its ``progress.csv`` only the first result's (so every ``val/*``
key of the task is in the first result, NaN until evaluated). ``test/*`` is never reported to Tune, so no
scheduler, search or best-trial choice can see it: it is in the trial's summary.json, and after the search
:mod:`rayseq.tuning.results` evaluates the chosen trial on the test set.

Where a trial writes: its run directory ``<storage_path>/<name>/runs/<trial_id>/`` (config.yaml,
metrics.parquet, tb/, checkpoints/, summary.json: what ``python -m rayseq.train`` writes, through
:class:`~rayseq.storage.RunStore`, so a URI works), beside Tune's own ``trial_<trial_id>/``.

Checkpoints: every ``checkpoint_every`` ticks of the clock the Trainer writes its checkpoint into the
trial's run directory and the same file is reported as a ``tune.Checkpoint`` (a folder holding
``ckpt_<iteration>.pt``). On start, a trial given a checkpoint (``tune.get_checkpoint()``: a restart, a
resumed experiment, or a PBT exploit that cloned another trial) puts that file into its run directory's
``checkpoints/`` and resumes the Trainer from it; the config is the trial's *current* one, so a PBT
mutation of ``algo.lr`` reaches the optimizer (the learner applies the config's learning rates after
loading). The last iteration is reported after ``Trainer.run()`` returns, with the final checkpoint, so a
scheduler stopping the trial there cannot cut the summary short.

Resources: ``tune.PlacementGroupFactory(trial_bundles(cfg))``. In-process trials (``rollout.num_workers=0``)
run everything in the trainable, which takes the learner's bundle. With Ray rollout workers the head
bundle is empty: Tune runs the function trainable in the head bundle and gives it *all* of that
bundle's resources, so a learner placed there could not start; an empty head bundle runs the (light)
driver loop without a reservation and leaves the group exactly :func:`~rayseq.distributed.runtime.bundles`
— learner in bundle 0, then workers, then scorers — as :class:`~rayseq.distributed.groups.ActorGroups` expects.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path

from rayseq.config import RunConfig
from rayseq.storage import RunStore

CKPT_FILE = re.compile(r"^ckpt_(\d{8})\.pt$")


def trial_bundles(cfg: RunConfig) -> list[dict]:
    from rayseq.distributed.groups.placement import bundles

    b = bundles(cfg)
    return b if cfg.rollout.num_workers == 0 else [{}] + b


def trial_dirname(trial) -> str:
    """Tune's per-trial folder (instead of the default long one with every parameter in its name)."""
    return f"trial_{trial.trial_id}"


def _split(location: str) -> tuple[RunStore, str]:
    parent, _, name = location.rpartition("/")
    return RunStore(parent or "."), name


class TuneReporter:
    """The Trainer's ``report(row, trainer)`` callback: ``tune.report`` every iteration, a checkpoint every
    ``checkpoint_every`` ticks of ``time_attr``; the last iteration is held back for :meth:`final`."""

    def __init__(self, metric: str, time_attr: str, checkpoint_every: int, restored_iteration: int = 0,
                 eval_keys: tuple[str, ...] = ()):
        self.metric, self.time_attr, self.every = metric, time_attr, checkpoint_every
        self.restored_iteration = restored_iteration
        self.eval_keys = eval_keys  # reported as NaN until evaluated: Tune's progress.csv keeps the first row's keys
        self.last_eval: dict[str, float] = {}
        self.held: dict | None = None
        self.diagnostics: dict | None = None

    def metrics(self, row: dict, trainer) -> dict:
        fresh = {k: float(v) for k, v in row.items() if k.startswith("val/")}
        if not self.last_eval and trainer.pretrain_metrics:  # resumed or init_from: the MLE evaluation
            self.last_eval.update({k: float(v) for k, v in trainer.pretrain_metrics.items() if k.startswith("val/")})
        self.last_eval.update(fresh)
        out = dict.fromkeys(self.eval_keys, math.nan) | self.last_eval
        out.update({k: float(v) for k, v in row.items()
                    if k not in ("stage", "iteration") and not k.startswith("test/")})
        out.update({
            "stage": str(row.get("stage", trainer.stage)),
            "iteration": int(trainer.iteration),
            "algo_iteration": int(trainer.stage_iter) if trainer.stage == "train" else 0,
            "tune/eval_fresh": 1.0 if fresh else 0.0,
            "tune/restored_iteration": int(self.restored_iteration),
        })
        out.setdefault(self.metric, math.nan)
        if self.diagnostics is None:
            self.diagnostics = _placement(trainer)
        out.update(self.diagnostics)
        return out

    def __call__(self, row: dict, trainer) -> None:
        m = self.metrics(row, trainer)
        if _is_last_iteration(trainer):
            self.held = m
            return
        t = m[self.time_attr]
        if self.every and t > 0 and t % self.every == 0:
            self.report(m, _checkpoint_now(trainer))
        else:
            self.report(m, None)

    def final(self, trainer, summary: dict) -> None:
        """The last result, with the run's final evaluation and final checkpoint."""
        row = {"stage": trainer.stage, "iteration": trainer.iteration}
        m = self.held if self.held is not None else self.metrics(row, trainer)
        ev = {k: float(v) for k, v in summary["metrics"].items() if k.startswith("val/")}
        self.last_eval.update(ev)
        m.update(ev)
        if ev:
            m["tune/eval_fresh"] = 1.0
        self.report(m, summary["checkpoint"])

    @staticmethod
    def report(metrics: dict, checkpoint_location: str | None) -> None:
        from ray import tune

        if checkpoint_location is None:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="rayseq-tune-ckpt-") as tmp:
            stage_checkpoint(checkpoint_location, metrics["iteration"], tmp)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))  # copied to storage here


def stage_checkpoint(location: str, iteration: int, folder: str | Path) -> None:
    """The files of the checkpoint ``location`` (its head, its SHA-256 record and the learner's files, a sharded
    learner's shards included: :func:`~rayseq.checkpoint.checkpoint_files`) into the local ``folder`` for
    ``tune.Checkpoint.from_directory``, with ``rayseq.json`` naming it. Each file is copied as a stream
    (:func:`~rayseq.storage.copy_file`): no shard is ever whole in memory."""
    from rayseq.checkpoint import checkpoint_files
    from rayseq.storage import copy_file

    store, name = _split(location)
    local = RunStore(folder)
    for file in checkpoint_files(store, name):
        copy_file(store, file, local, file)
    local.write_text("rayseq.json", json.dumps({"file": name, "iteration": iteration, "source": location}))


def _is_last_iteration(trainer) -> bool:
    plan = trainer.plan()
    from rayseq.algos.iteration import STAGES

    later = STAGES[STAGES.index(trainer.stage) + 1 :]
    return trainer.stage_iter >= plan[trainer.stage] and all(plan[s] == 0 for s in later)


def _checkpoint_now(trainer) -> str:
    """The Trainer's checkpoint of this iteration (written now unless its own schedule just did)."""
    from rayseq.checkpoint import list_checkpoints

    have = list_checkpoints(trainer.store)
    if have and have[-1].endswith(f"/ckpt_{trainer.iteration:08d}.pt"):
        return have[-1]
    return trainer.save()


def _placement(trainer) -> dict:
    """Which placement group the trial's actors landed in (diagnostics; remote runs only)."""
    groups = trainer.groups
    if groups is None or groups.is_local:
        return {}
    return {"tune/trial_placement_group": groups.pg.id.hex(),
            "tune/learner_placement_group": str(groups.learner.placement()["placement_group"]),
            "tune/worker_placement_groups": ",".join(sorted({str(w["placement_group"])
                                                             for w in groups.rollout.stats()}))}


def checkpoint_file(folder: Path, shown: str) -> Path:
    """The ``ckpt_*.pt`` of a Tune checkpoint folder: the one its ``rayseq.json`` names. (After a PBT exploit
    Tune numbers the exploiting trial's next checkpoint folders from the cloned one's index, so a folder can
    be reused and keep an older file beside the new one.)"""
    meta = folder / "rayseq.json"
    if meta.is_file():
        named = folder / json.loads(meta.read_text())["file"]
        if named.is_file():
            return named
    files = sorted(p for p in folder.iterdir() if CKPT_FILE.match(p.name))
    if not files:
        raise FileNotFoundError(f"Tune checkpoint {shown}: no ckpt_*.pt in it")
    return files[-1]


def _older_tune_checkpoints(checkpoint) -> list:
    """The trial's Tune checkpoints older than ``checkpoint`` (sibling ``checkpoint_NNNNNN`` folders), newest first."""
    import pyarrow.fs as pafs
    from ray import tune

    parent, _, own = checkpoint.path.rstrip("/").rpartition("/")
    try:
        infos = checkpoint.filesystem.get_file_info(pafs.FileSelector(parent))
    except (OSError, AttributeError):
        return []
    names = sorted((i.base_name for i in infos if i.type == pafs.FileType.Directory
                    and i.base_name.startswith("checkpoint_") and i.base_name < own), reverse=True)
    return [tune.Checkpoint(path=f"{parent}/{n}", filesystem=checkpoint.filesystem) for n in names]


def install_checkpoint(checkpoint, store: RunStore) -> int:
    """Put the ``ckpt_*.pt`` of a ``tune.Checkpoint`` (with its SHA-256 record and weights) into the run directory's
    ``checkpoints/`` (replacing whatever is there: the Trainer resumes from the newest); returns its iteration. A
    damaged one is named in a warning and the trial's previous Tune checkpoint is tried; when none loads, one line
    (CheckpointError) names them all."""
    from rayseq.checkpoint import CheckpointError, checkpoint_files, verify_checkpoint
    from rayseq.storage import copy_file

    tried = []
    for candidate in [checkpoint, *_older_tune_checkpoints(checkpoint)]:
        for old in store.listdir("checkpoints"):
            store.delete(f"checkpoints/{old}")  # a file, or a checkpoint's learner folder
        try:
            with candidate.as_directory() as d:
                path = checkpoint_file(Path(d), candidate.path)
                name = path.name
                folder = RunStore(path.parent)
                for file in checkpoint_files(folder, name):
                    copy_file(folder, file, store, f"checkpoints/{file}")  # as a stream
            verify_checkpoint(store.display("checkpoints", name))
        except (CheckpointError, FileNotFoundError) as exc:
            tried.append(f"{candidate.path}: {exc}")
            continue
        for reason in tried:
            print(f"warning: Tune checkpoint {reason}; restoring the previous one, {candidate.path}", flush=True)
        return int(CKPT_FILE.match(name).group(1))
    raise CheckpointError("no Tune checkpoint of this trial loads; tried: " + "; ".join(tried))


def run_trial(config: dict, exp: dict) -> None:
    """The Tune function trainable. ``config``: the sampled parameters (dotted keys); ``exp``: the
    experiment (:meth:`rayseq.tuning.spec.Experiment.to_dict`) and its path."""
    import ray
    from ray import tune

    from rayseq.distributed.driver import Trainer
    from rayseq.tuning.spec import val_metrics, validate

    experiment = validate(exp["experiment"])
    experiment.search.storage_path = exp["storage_path"]
    trial_id = tune.get_context().get_trial_id()
    cfg = experiment.trial_config(config, trial_id)
    store = RunStore(cfg.run_dir)
    checkpoint = tune.get_checkpoint()
    restored = 0
    if checkpoint is not None:
        restored = install_checkpoint(checkpoint, store)
    elif store.exists():  # restarted before its first checkpoint: start over
        store.fs.delete_dir_contents(store.root, missing_dir_ok=True)
    reporter = TuneReporter(experiment.search.metric, experiment.time_attr, experiment.checkpoint_every, restored,
                            eval_keys=tuple(val_metrics(cfg)))
    pg = ray.util.get_current_placement_group() if cfg.rollout.num_workers else None
    trainer = Trainer(cfg, resume=restored > 0, placement_group=pg, report=reporter)
    summary = trainer.run()
    reporter.final(trainer, summary)
