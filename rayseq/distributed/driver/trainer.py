"""The driver: runs the stages, and around each iteration evaluates, logs, checkpoints and reports; each iteration
is the algorithm's own.

Stages (:data:`rayseq.algos.iteration.STAGES`): ``mle`` (MLE pretraining), the algorithm's own pretraining stage
``algo_pretrain`` when it has one (``Algorithm.pretrain_steps``, labelled by its ``pretrain_label``) and ``train``
(the configured algorithm). Per iteration the driver hands the actor groups (:mod:`rayseq.distributed.groups`:
learner, rollout workers, scorers; in-process or Ray actors) and a :class:`~rayseq.algos.iteration.Step` (the task,
the data RNG, the stage's position, the batch sent ahead) to ``algo.training_step(groups, step)``
(``pretrain_step`` in the algorithm's own stage), which returns the iteration's metrics; the driver times and counts
the iteration (:func:`~rayseq.algos.iteration.counted`), adds the evaluation (``val/*`` every ``train.eval_every``,
once per weights version), writes ``metrics.parquet``, checkpoints, keeps the best evaluation
(:mod:`.best`), reports to Tune and draws the progress (:mod:`.progress`).

The batches a rollout algorithm samples ahead of the learner (the next one right behind the update, or
``rollout.max_staleness`` of them: :func:`~rayseq.algos.iteration.ahead_step`) are drawn from the data RNG before this
iteration ends: a checkpoint keeps the RNG from before the oldest of them (``Carry.rng_ahead``), so a resumed run
draws them again.
"""

from __future__ import annotations

import functools
import logging
import random
import signal
import time
from datetime import datetime

import numpy as np
import yaml

from rayseq.algos import MLE, make_algo
from rayseq.algos.iteration import ALGO_PRETRAIN, STAGES, Carry, Step, counted, stage_name
from rayseq.algos.reward_refresh import refresh_due, refresh_step
from rayseq.checkpoint import (
    FORMAT,
    checkpoint_stem,
    checkpoint_to_resume,
    checkpoint_to_start_from,
    list_checkpoints,
    save_checkpoint,
    select_checkpoint,
)
from rayseq.config import RunConfig, config_to_dict
from rayseq.config.paths import absolute_paths
from rayseq.distributed.driver.best import BestKeeper, check_best_keys
from rayseq.distributed.driver.progress import Progress, figures, progress_keys
from rayseq.distributed.groups import ActorGroups
from rayseq.distributed.groups.manager import LearnerLost
from rayseq.runlog import MetricsLog, to_json
from rayseq.storage import RunStore
from rayseq.tasks import prepared_task
from rayseq.tasks.evaluation import decodes_split

log = logging.getLogger(__name__)


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived; a checkpoint was written (``checkpoint``: its location)."""

    checkpoint: str | None = None


def default_run_dir(cfg: RunConfig) -> str:
    name = cfg.name or f"{cfg.task.name}-{cfg.algo.name}-s{cfg.seed}-{datetime.now():%Y%m%d-%H%M%S}"
    return f"runs/{name}"


class Trainer:
    """Owns the run directory, the data RNG, the actor groups and the loop. ``run()`` returns the summary.

    Args:
        cfg: the run's config.
        resume: continue from the run directory's latest checkpoint.
        placement_group: one reserved elsewhere (a Tune trial's).
        report: ``callback(metrics_row, trainer)`` after each iteration (Tune).
    """

    def __init__(self, cfg: RunConfig, *, resume: bool = False, placement_group=None, report=None):
        # its files named in full, as every actor, checkpoint and config.yaml then reads them (from any folder)
        self.cfg = cfg = absolute_paths(cfg)
        self.store = RunStore(cfg.run_dir or default_run_dir(cfg))  # local path or pyarrow.fs URI
        self.run_dir = self.store.display()
        self.resume = resume
        self.report = report
        self._placement_group = placement_group
        self.rng = np.random.default_rng(cfg.seed)
        self.iteration = 0  # global iteration counter across stages (1-based after the first update)
        self.stage = "mle"
        self.stage_iter = 0
        self.pretrain_metrics: dict = {}
        self.best = BestKeeper(cfg.train, self.store)
        self._evaluated: dict = {}  # split -> (learner version, metrics, details)
        self._stop = False
        self.carry = Carry()  # the batches sampling ahead of the learner
        self.groups: ActorGroups | None = None

    @functools.cached_property
    def task(self):
        """The run's task, its data prepared first (``Task.prepare_data``: e.g. pairs' ``task.prepare``): the run's
        first step, before any actor starts and reads that data; the driver's copy draws the prompts."""
        return prepared_task(self.cfg.task, self.cfg.reward)

    # -- bookkeeping ------------------------------------------------------------------------------
    def plan(self) -> dict[str, int]:
        """Iterations of each stage."""
        own = self.cfg.algorithm.pretrain_steps(self.cfg)
        return {"mle": self.cfg.train.pretrain_iters, ALGO_PRETRAIN: own, "train": self.cfg.train_stage_iters}

    def _driver_state(self) -> dict:
        return {
            "iteration": self.iteration,
            "stage": self.stage,
            "stage_iter": self.stage_iter,
            # a batch drawn ahead (sent with the last update, or pipelined) is drawn again by a resumed run
            **(self.carry.rng_ahead or self._rng_state()),
            "pretrain_metrics": self.pretrain_metrics,
            "best": self.best.best,
        }

    def _rng_state(self) -> dict:
        return {"numpy_rng": self.rng.bit_generator.state, "python_rng": random.getstate()}

    def _write_checkpoint(self, store: RunStore, keep: int, groups: ActorGroups | None = None) -> str:
        """The checkpoint of this iteration in ``store``: the learners write their state (nothing of it comes back
        but its files' digests), then the driver its head (config, task, its own state)."""
        stem = checkpoint_stem(self.iteration)
        written = (groups or self.groups).learner.save(store.display(), stem)
        head = {"format": FORMAT, "config": config_to_dict(self.cfg), "task": self.task.spec(),
                "learner": {"generator": written["generator"], "state": written["state"]},
                "driver": self._driver_state()}
        return save_checkpoint(store, self.iteration, head, keep=keep, files=written["files"])

    def save(self, groups: ActorGroups | None = None) -> str:
        """Checkpoint (metrics first: rows past a checkpoint are dropped again on resume)."""
        self.metrics.flush()
        t0 = time.perf_counter()
        path = self._write_checkpoint(self.store, self.cfg.train.keep_checkpoints, groups)
        if self.metrics.rows:  # written with the next flush
            self.metrics.rows[-1]["time/checkpoint_s"] = time.perf_counter() - t0
        return path

    def _restore(self, groups: ActorGroups, path: str, ck: dict) -> None:
        """The run as checkpoint ``path`` (head ``ck``) left it: the learners read their state themselves."""
        groups.learner.restore(path)
        groups.learner.apply_config_lrs()  # this run's learning rates, not the saved ones (Tune PBT mutates them)
        saved = ck["driver"]
        self.iteration, self.stage = int(saved["iteration"]), stage_name(saved["stage"])
        self.stage_iter = int(saved["stage_iter"])
        self.rng.bit_generator.state = saved["numpy_rng"]
        random.setstate(_as_random_state(saved["python_rng"]))
        self.pretrain_metrics = dict(saved["pretrain_metrics"])
        self.best.best = saved.get("best")  # (a checkpoint written before train.best_metric has none)
        rows = [r for r in MetricsLog.read_rows(self.store) if r["iteration"] <= self.iteration]
        self.metrics.rows = [{k: (stage_name(v) if k == "stage" else v) for k, v in r.items() if v is not None}
                             for r in rows]

    def _init_from(self, groups: ActorGroups, path: str, ck: dict) -> None:
        """Start the algorithm stage from a pretrained run (``train.init_from``), its starting point scored with this
        run's task, data and reward (the table's and summary.json's "before"). A checkpoint without what the
        algorithm pretrains itself starts at that pretraining (stage ``algo_pretrain``) from its generator."""
        loaded = groups.learner.init_from(path)
        self.iteration = int(ck["driver"]["iteration"])
        self.stage, self.stage_iter = ("train" if all(loaded.values()) else ALGO_PRETRAIN), 0
        self.pretrain_metrics = {**self._evaluate(groups, "val")[0], **self._evaluate(groups, "test")[0]}

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        t_start = time.time()
        task = self.task  # the data, prepared before the groups start
        # checked before anything is written or started
        ck = checkpoint_to_resume(self.store, cfg) if self.resume else None
        init = checkpoint_to_start_from(cfg, task.spec()) if ck is None and cfg.train.init_from else None
        if ck is None and list_checkpoints(self.store):
            raise FileExistsError(f"{self.run_dir} already holds a run; pass --resume or another run_dir")
        self.store.makedirs()
        self.store.write_text("config.yaml", yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        self.metrics = MetricsLog(self.store)
        self._start_state = self._rng_state()  # where a learner lost before the first checkpoint starts again
        bar = Progress(cfg.progress, cfg.progress_every)
        # a start-up that fails (an actor whose constructor raised, a placement the cluster cannot meet) raises
        # StartupFailed, its line after the progress lines of the step that was starting
        groups = self.groups = ActorGroups(cfg, self._placement_group, note=bar.note)
        old_handlers = _install_signal_handlers(self)
        try:
            groups.learner.check_run_dir(self.store)  # the learners write their files on their own nodes
            if ck is not None:
                self._restore(groups, *ck)
            elif init is not None:
                self._init_from(groups, *init)
            restarts = 0
            while True:
                try:
                    final = self._run_stages(groups, bar)
                    test, details = self._evaluate(groups, "test")
                    ckpt = self.save(groups)
                    best = self.best.summary(self.iteration, (test, details), groups.learner,
                                             functools.partial(self._evaluation, groups))
                    self._evaluated = {}  # (the summary may have loaded the best weights)
                    break
                except LearnerLost as exc:
                    bar.close()
                    restarts += 1
                    if restarts > cfg.learner.max_restarts:
                        raise RuntimeError(f"{exc}; the learner was rebuilt {restarts - 1} time(s) already "
                                           f"(learner.max_restarts={cfg.learner.max_restarts}): continue the run from "
                                           f"its last checkpoint with python -m rayseq.train run_dir={self.run_dir} "
                                           "--resume") from exc
                    self._rebuild_learner(groups, exc, restarts)
            summary = {
                "task": cfg.task.name, "algo": cfg.algo.name, "seed": cfg.seed, "metrics": {**final, **test},
                "pretrain_metrics": self.pretrain_metrics, "details": details, "iterations": self.iteration,
                "pretrained": bool(cfg.train.pretrain_iters or cfg.train.init_from),
                "wall_s": round(time.time() - t_start, 2), "run_dir": self.run_dir, "checkpoint": ckpt,
                "rollout_workers": cfg.rollout.num_workers, **({"best": best} if best is not None else {}),
            }
            self.store.write_text("summary.json", to_json(summary))
            return summary
        except Interrupted as exc:
            bar.close()  # the bar's final redraw comes before the caller's message
            exc.checkpoint = self.save(groups)
            raise
        finally:
            bar.close()
            _restore_signal_handlers(old_handlers)
            self.metrics.close()
            groups.shutdown()

    def _run_stages(self, groups: ActorGroups, bar) -> dict:
        """The stages from where the run stands; the validation metrics at the end of the last."""
        plan = self.plan()
        for stage in STAGES[STAGES.index(self.stage) :]:
            if stage != self.stage:
                self.stage, self.stage_iter = stage, 0
            if plan[stage] == 0 and stage != "train":
                continue
            groups.learner.start_stage(stage)  # (the first call waits for the learner actor: before the bar)
            if stage != "mle" and not self.pretrain_metrics and self.stage_iter == 0:  # no pretraining: the start's
                self.pretrain_metrics = {**self._evaluate(groups, "val")[0], **self._evaluate(groups, "test")[0]}
            if stage == "train" and self.cfg.train.best_metric and self.best.best is None and self.stage_iter == 0:
                self.best.start(self.pretrain_metrics, self.iteration, lambda store: self._write_checkpoint(store, 1))
            if self.stage_iter < plan[stage]:
                bar.start(self._label(stage), plan[stage], self.stage_iter)
            final = self._run_stage(groups, stage, plan[stage], bar)
            bar.close()
            if stage == "mle":  # the pretrained model's test figures are reported beside the final ones
                self.pretrain_metrics = {**final, **self._evaluate(groups, "test")[0]}
        return final

    def _label(self, stage: str) -> str:
        """A stage's progress label: MLE pretraining, the algorithm's own stage's (``pretrain_label``), its name."""
        if stage == "mle":
            return "MLE pretraining"
        if stage == ALGO_PRETRAIN:
            return self.cfg.algorithm.pretrain_label or f"{self.cfg.algo.name} pretraining"
        return self.cfg.algo.name

    def _rebuild_learner(self, groups: ActorGroups, exc: LearnerLost, restarts: int) -> None:
        """A learner actor died: fresh learner actors (:meth:`ActorManager.recover_learner`), loaded from the latest
        checkpoint, and the driver back at that checkpoint (its iteration, data RNG, metrics rows: the iterations after
        it are run again and logged once); with no checkpoint yet, the run starts again (as the original run started,
        or from ``train.init_from``)."""
        t0 = time.perf_counter()
        groups.restart_learner()
        groups.learner.check_run_dir(self.store)  # (the rebuilt learners may be on other nodes)
        self._evaluated, self.carry, lost_at = {}, Carry(), self.iteration
        if list_checkpoints(self.store):
            path, ck = select_checkpoint(self.store.display())
            self._restore(groups, path, ck)
            where = f"its checkpoint {path} (iteration {self.iteration})"
        else:
            self.rng.bit_generator.state = self._start_state["numpy_rng"]
            random.setstate(self._start_state["python_rng"])
            self.iteration, self.stage, self.stage_iter, self.pretrain_metrics = 0, "mle", 0, {}
            self.best.best, self.metrics.rows = None, []
            if self.cfg.train.init_from:
                self._init_from(groups, *checkpoint_to_start_from(self.cfg, self.task.spec()))
            where = "the start (no checkpoint yet)"
        log.warning("%s at iteration %d; learner group rebuilt (restart %d of learner.max_restarts=%d) from %s in "
                    "%.1f s: iterations %d..%d are run again", exc, lost_at, restarts, self.cfg.learner.max_restarts,
                    where, time.perf_counter() - t0, self.iteration + 1, lost_at)

    def _evaluate(self, groups: ActorGroups, split: str) -> tuple[dict, dict]:
        """The ``split`` metrics and details of the learner's generator now, computed once per weights version:
        ``val/*`` select (Tune, the best evaluation), ``test/*`` are reported (summary.json, the final table)."""
        version = groups.learner.version()
        cached = self._evaluated.get(split)
        if cached is None or cached[0] != version:
            cached = self._evaluated[split] = (version, *self._evaluation(groups, split))
            viewer = cached[2].pop("viewer", None) if isinstance(cached[2], dict) else None
            if viewer:  # a few of the evaluation's episodes as text (a task of episodes), one file per evaluation
                self.store.write_text(f"viewer/{split}-{self.iteration:06d}.txt", viewer + "\n")
        return cached[1], cached[2]

    def _evaluation(self, groups: ActorGroups, split: str) -> tuple[dict, dict]:
        """The ``split`` metrics and details of the learner's generator now: the decodes on the rollout workers
        where the task splits its evaluation (:mod:`rayseq.tasks.evaluation`), the figures on the learners."""
        return groups.evaluate(split, self.task.eval_decodes(split) if decodes_split(self.task) else None)

    def _run_stage(self, groups: ActorGroups, stage: str, n_iters: int, bar) -> dict:
        """Runs the rest of ``stage``; returns the validation metrics (``val/*``) at its end."""
        cfg = self.cfg
        # MLE pretraining is MLE's iteration; the algorithm's own stage its pretrain_step; train its own
        algo = MLE(cfg.algo, cfg.seed) if stage == "mle" else make_algo(cfg.algo, cfg.seed)
        iterate = algo.pretrain_step if stage == ALGO_PRETRAIN else algo.training_step
        batch_size = cfg.train.pretrain_batch_size if stage == "mle" else cfg.train.batch_size
        shown = progress_keys(algo, cfg.task_class, cfg.task)
        # the algorithm's own stage leaves G, hence its evaluation, as pretraining ended; the others evaluate as they go
        own = stage == ALGO_PRETRAIN
        ev = {k: v for k, v in self.pretrain_metrics.items() if k.startswith("val/")} if own else None
        if self.stage_iter >= n_iters:
            return ev if own else self._evaluate(groups, "val")[0]
        refreshing = stage == "train" and cfg.uses_reward_config and cfg.reward.refreshed is not None
        every = cfg.train.eval_every
        if stage == "mle" and cfg.train.pretrain_eval_every is not None:
            every = cfg.train.pretrain_eval_every
        while self.stage_iter < n_iters:
            if self._stop:
                raise Interrupted()
            step = Step(cfg=cfg, task=self.task, rng=self.rng, stage_iter=self.stage_iter, n_iters=n_iters,
                        iteration=self.iteration, batch_size=batch_size, carry=self.carry)
            with counted(groups) as counters:
                if refreshing and groups.scorer.weights_version < 0:  # a resumed run's or a rebuilt learner's RM
                    groups.scorer.sync_weights()
                m = iterate(groups, step)
                if refreshing and refresh_due(cfg, step.stage_iter):  # reward.refresh, before the next scoring
                    m.update(refresh_step(groups, step))
            m.update(counters)
            self.stage_iter += 1
            self.iteration += 1
            if not own and ((every and self.stage_iter % every == 0) or self.stage_iter == n_iters):
                ev = self._evaluate(groups, "val")[0]
                m.update(ev)
                if cfg.train.best_metric:  # its names checked at the first evaluation, MLE's included
                    check_best_keys(ev, cfg.train)
                    if stage == "train":
                        self.best.consider(ev, self.pretrain_metrics, self.iteration,
                                           lambda store: self._write_checkpoint(store, 1))
            self.metrics.log(stage, self.iteration, m)
            if cfg.train.checkpoint_every and self.iteration % cfg.train.checkpoint_every == 0:
                self.save(groups)
            if self.report is not None:
                self.report(self.metrics.rows[-1], self)
            bar.update(figures(m, shown))
        return ev


def _as_random_state(s):
    """python's random state, whose inner sequence may come back from a checkpoint as a list."""
    return (s[0], tuple(s[1]), s[2])


def _install_signal_handlers(trainer: Trainer):
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        trainer._stop = True

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore_signal_handlers(old) -> None:
    if old:
        for sig, h in old.items():
            signal.signal(sig, h)


def run_training(cfg: RunConfig, *, resume: bool = False) -> dict:
    return Trainer(cfg, resume=resume).run()
