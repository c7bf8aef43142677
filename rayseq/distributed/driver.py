"""The driver: stages, evaluation, checkpoints, logging and progress; each iteration is the algorithm's own.

Stages: ``mle`` (MLE pretraining), the algorithm's own pretraining stage ``algo_pretrain`` when it has one
(``Algorithm.pretrain_steps``, labelled by its ``pretrain_label``) and ``train`` (the configured algorithm).
Per iteration the driver hands the actor groups (:mod:`rayseq.distributed.groups`: learner, rollout workers,
scorers; in-process or Ray actors) and a :class:`~rayseq.algos.iteration.Step` (the task, the data RNG, the stage's
position, the batch sent ahead) to ``algo.training_step(groups, step)`` (``pretrain_step`` in the algorithm's own
stage), which returns the iteration's metrics; the driver adds the evaluation (``val/*`` every
``train.eval_every``), writes ``metrics.parquet``, checkpoints, reports to Tune and draws the progress bar.

The default iteration (:mod:`rayseq.algos.iteration`: sample → score → update, chained or pipelined) sends the
update right behind the sampling calls with task rewards (the learner starts as the shards arrive), and the next
iteration's batch right behind the update: its sampling calls carry the update's weights by reference, so the
workers start the moment the learner has published them, without a round trip through the driver (still
on-policy: staleness 0, the same prompts, seeds and weights as one call after the other). ``time/rollout_s`` is
then the sending (nothing, for a batch already sent) and ``time/learn_s`` covers sampling and update. The batch
sent ahead is drawn from the data RNG before this iteration ends: a checkpoint keeps the RNG from before it
(``Carry.rng_ahead``), so a resumed run draws it again.
"""

from __future__ import annotations

import logging
import math
import random
import signal
import time
from datetime import datetime

import numpy as np
import yaml

from rayseq import registry
from rayseq.algos import MLE, make_algo
from rayseq.algos.iteration import ALGO_PRETRAIN, STAGES, Carry, Step, stage_name
from rayseq.checkpoint import (
    init_from_differences,
    list_checkpoints,
    load_checkpoint,
    load_latest,
    save_checkpoint,
    set_aside_newer,
)
from rayseq.config import ConfigError, RunConfig, config_to_dict
from rayseq.distributed.groups import ActorGroups
from rayseq.distributed.manager import LearnerLost
from rayseq.runlog import MetricsLog, to_json
from rayseq.storage import RunStore
from rayseq.tasks import make_task

BEST_DIR = "best"  # run_dir/best: train.best_metric's checkpoint and best.json
log = logging.getLogger(__name__)


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived; a checkpoint was written (``checkpoint``: its location)."""

    checkpoint: str | None = None


def default_run_dir(cfg: RunConfig) -> str:
    name = cfg.name or f"{cfg.task.name}-{cfg.algo.name}-s{cfg.seed}-{datetime.now():%Y%m%d-%H%M%S}"
    return f"runs/{name}"


class Trainer:
    """Owns the run directory, the data RNG, the actor groups and the loop. ``run()`` returns the summary."""

    def __init__(self, cfg: RunConfig, *, resume: bool = False, placement_group=None, report=None):
        self.cfg = cfg
        self.store = RunStore(cfg.run_dir or default_run_dir(cfg))  # local path or pyarrow.fs URI
        self.run_dir = self.store.display()
        self.resume = resume
        self.report = report  # optional callback(metrics_row, trainer) per iteration (Tune)
        self._placement_group = placement_group
        cfg.task_class.prepare_data(cfg.task)  # e.g. pairs' task.prepare: once, before any actor reads the data
        self.task = make_task(cfg.task, cfg.reward)
        self.rng = np.random.default_rng(cfg.seed)
        self.iteration = 0  # global iteration counter across stages (1-based after the first update)
        self.stage = "mle"
        self.stage_iter = 0
        self.pretrain_metrics: dict = {}
        self.best: dict | None = None  # train.best_metric: {"iteration", "value", "val"} of the best evaluation so far
        self._test_cache: tuple | None = None  # (learner version, test metrics, details)
        self._stop = False
        self.carry = Carry()  # the batch one iteration sent ahead for the next (chained, pipelined)
        self.groups: ActorGroups | None = None

    # -- bookkeeping ------------------------------------------------------------------------------
    def _plan(self) -> dict[str, int]:
        own = self.cfg.algorithm.pretrain_steps(self.cfg)  # the algorithm's own stage (e.g. SeqGAN's D pretraining)
        return {"mle": self.cfg.train.pretrain_iters, ALGO_PRETRAIN: own, "train": self.cfg.train_stage_iters}

    def _driver_state(self) -> dict:
        return {
            "iteration": self.iteration,
            "stage": self.stage,
            "stage_iter": self.stage_iter,
            # a batch drawn ahead (sent with the last update, or pipelined) is drawn again by a resumed run
            **(self.carry.rng_ahead or self._rng_state()),
            "pretrain_metrics": self.pretrain_metrics,
            "best": self.best,
        }

    def _rng_state(self) -> dict:
        return {"numpy_rng": self.rng.bit_generator.state, "python_rng": random.getstate()}

    def _payload(self, groups: ActorGroups | None = None) -> dict:
        payload = {
            "format": "rayseq-checkpoint-v1",
            "config": config_to_dict(self.cfg),
            "task": self.task.spec(),
            "learner": (groups or self.groups).learner.state_dict(),
            "driver": self._driver_state(),
        }
        if getattr(registry.model_class(self.cfg.model.arch), "weights_format", "torch") == "safetensors":
            payload["weights_format"] = "safetensors"  # the trained weights beside the .pt (rayseq.checkpoint)
        return payload

    def save(self, groups: ActorGroups | None = None) -> str:
        """Checkpoint (metrics first: rows past a checkpoint are dropped again on resume)."""
        self.metrics.flush()
        t0 = time.perf_counter()
        path = save_checkpoint(self.store, self.iteration, self._payload(groups), keep=self.cfg.train.keep_checkpoints)
        if self.metrics.rows:  # written with the next flush
            self.metrics.rows[-1]["time/checkpoint_s"] = time.perf_counter() - t0
        return path

    def _resume_checkpoint(self) -> dict:
        """The latest checkpoint that loads (a damaged newer one is named in a warning and set aside), read and checked
        against this run's config before anything is written or started: its task, model and algorithm must be this
        config's (else the weights would not fit)."""
        ckpts = list_checkpoints(self.store)
        if not ckpts:
            raise FileNotFoundError(f"--resume: no checkpoint in {self.store.display('checkpoints')}")
        path, ck = load_latest(self.store.display())
        try:  # as this version reads it: keys added since (model.arch) take their defaults
            theirs = config_to_dict(RunConfig.model_validate(ck["config"]))
        except ValueError:
            theirs = ck["config"]
        ours = config_to_dict(self.cfg)
        diff = [f"{sec}.{k}" for sec in ("task", "model") for k in ours[sec]
                if theirs.get(sec, {}).get(k) != ours[sec][k]]
        diff += ["algo.name"] if theirs.get("algo", {}).get("name") != self.cfg.algo.name else []
        if diff:
            raise ValueError(f"--resume: {self.run_dir} was trained with another {', '.join(diff)} (its checkpoint's "
                             f"config); resume it with its own config: python -m rayseq.train "
                             f"run_dir={self.run_dir} --resume")
        set_aside_newer(self.store, path)
        return ck

    def _restore(self, groups: ActorGroups, ck: dict) -> None:
        groups.learner.load_state_dict(ck["learner"])
        groups.learner.apply_config_lrs()  # this run's learning rates, not the saved ones (Tune PBT mutates them)
        d = ck["driver"]
        self.iteration, self.stage, self.stage_iter = int(d["iteration"]), stage_name(d["stage"]), int(d["stage_iter"])
        self.rng.bit_generator.state = d["numpy_rng"]
        random.setstate(_as_random_state(d["python_rng"]))
        self.pretrain_metrics = dict(d["pretrain_metrics"])
        self.best = d.get("best")  # (a checkpoint written before train.best_metric has none)
        rows = [r for r in MetricsLog.read_rows(self.store) if r["iteration"] <= self.iteration]
        self.metrics.rows = [{k: (stage_name(v) if k == "stage" else v) for k, v in r.items() if v is not None}
                             for r in rows]

    def _init_from_checkpoint(self) -> dict:
        """``train.init_from``'s checkpoint, checked before anything is written or started: only what the weights
        depend on must match (:func:`rayseq.checkpoint.init_from_differences`); a ConfigError (one line) else."""
        source = self.cfg.train.init_from
        ck = load_checkpoint(source)  # a run directory: its newest checkpoint that loads
        if diff := init_from_differences(config_to_dict(self.cfg), self.task.spec(), ck):
            raise ConfigError(f"train.init_from={source}: its model cannot start this run: {'; '.join(diff)}")
        d = ck["driver"]
        if d["stage"] == "mle" and d["stage_iter"] < int(ck["config"]["train"]["pretrain_iters"]):
            raise ConfigError(f"train.init_from={source}: that run has not finished MLE pretraining")
        return ck

    def _init_from(self, groups: ActorGroups, ck: dict) -> None:
        """Start the algorithm stage from a pretrained run (``train.init_from``), its starting point scored with this
        run's task, data and reward (the table's and summary.json's "before"). A checkpoint without what the
        algorithm pretrains itself (SeqGAN's discriminator, from an MLE-only run) starts at that pretraining (stage
        ``algo_pretrain``) from its generator."""
        loaded = groups.learner.init_from(ck["learner"])
        self.iteration = int(ck["driver"]["iteration"])
        self.stage, self.stage_iter = ("train" if all(loaded.values()) else ALGO_PRETRAIN), 0
        self.pretrain_metrics = {**groups.learner.evaluate("val")[0], **self._test(groups)[0]}

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        t_start = time.time()
        ck = self._resume_checkpoint() if self.resume else None  # checked before anything is written or started
        init = self._init_from_checkpoint() if ck is None and cfg.train.init_from else None  # so is this
        if ck is None and list_checkpoints(self.store):
            raise FileExistsError(f"{self.run_dir} already holds a run; pass --resume or another run_dir")
        self.store.makedirs()
        self.store.write_text("config.yaml", yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        self.metrics = MetricsLog(self.store)
        self._start_state = self._rng_state()  # where a learner lost before the first checkpoint starts again
        groups = self.groups = ActorGroups(cfg, self._placement_group)
        old_handlers = _install_signal_handlers(self)
        bar = Progress(cfg.progress, cfg.progress_every)
        try:
            if ck is not None:
                self._restore(groups, ck)
                del ck
            elif init is not None:
                self._init_from(groups, init)
                init = None
            restarts = 0
            while True:
                try:
                    final = self._run_stages(groups, bar)
                    test, details = self._test(groups)
                    ckpt = self.save(groups)
                    best = self._best_summary(groups, (test, details))
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
                "task": cfg.task.name,
                "algo": cfg.algo.name,
                "seed": cfg.seed,
                "metrics": {**final, **test},
                "pretrain_metrics": self.pretrain_metrics,
                "details": details,
                "iterations": self.iteration,
                "wall_s": round(time.time() - t_start, 2),
                "run_dir": self.run_dir,
                "checkpoint": ckpt,
                "rollout_workers": cfg.rollout.num_workers,
                **({"best": best} if best is not None else {}),
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

    def _label(self, stage: str) -> str:
        """A stage's progress label: MLE pretraining, the algorithm's own (its ``pretrain_label``), its name."""
        if stage == "mle":
            return "MLE pretraining"
        algorithm = self.cfg.algorithm
        return (algorithm.pretrain_label or f"{self.cfg.algo.name} pretraining") if stage == ALGO_PRETRAIN \
            else self.cfg.algo.name

    def _run_stages(self, groups: ActorGroups, bar) -> dict:
        """The stages from where the run stands; the validation metrics at the end of the last."""
        plan = self._plan()
        for stage in STAGES[STAGES.index(self.stage) :]:
            if stage != self.stage:
                self.stage, self.stage_iter = stage, 0
            if plan[stage] == 0 and stage != "train":
                continue
            groups.learner.start_stage(stage)  # (the first call waits for the learner actor: before the bar)
            if stage == "train" and self.cfg.train.best_metric and self.best is None and self.stage_iter == 0:
                self._best_start(groups)
            if self.stage_iter < plan[stage]:
                bar.start(self._label(stage), plan[stage], self.stage_iter)
            final = self._run_stage(groups, stage, plan[stage], bar)
            bar.close()
            if stage == "mle":  # the pretrained model's test figures are reported beside the final ones
                self.pretrain_metrics = {**final, **self._test(groups)[0]}
        return final

    def _rebuild_learner(self, groups: ActorGroups, exc: LearnerLost, restarts: int) -> None:
        """A learner actor died: fresh learner actors, loaded from the latest checkpoint, and the driver back at that
        checkpoint (its iteration, data RNG, metrics rows: the iterations after it are run again and logged once);
        with no checkpoint yet, the run starts again (as the original run started, or from ``train.init_from``)."""
        t0 = time.perf_counter()
        groups.restart_learner()
        self._test_cache = None
        self.carry = Carry()
        lost_at = self.iteration
        if list_checkpoints(self.store):
            path, ck = load_latest(self.store.display())
            self._restore(groups, ck)
            where = f"its checkpoint {path} (iteration {self.iteration})"
        else:
            self.rng.bit_generator.state = self._start_state["numpy_rng"]
            random.setstate(self._start_state["python_rng"])
            self.iteration, self.stage, self.stage_iter, self.pretrain_metrics = 0, "mle", 0, {}
            self.best = None
            self.metrics.rows = []
            if self.cfg.train.init_from:
                self._init_from(groups, self._init_from_checkpoint())
            where = "the start (no checkpoint yet)"
        log.warning("%s at iteration %d; learner group rebuilt (restart %d of learner.max_restarts=%d) from %s in "
                    "%.1f s: iterations %d..%d are run again", exc, lost_at, restarts, self.cfg.learner.max_restarts,
                    where, time.perf_counter() - t0, self.iteration + 1, lost_at)

    def _best_start(self, groups: ActorGroups) -> None:
        """``train.best_metric``: the start of the algorithm stage (the pretrained model, as scored in
        ``pretrain_metrics``) is the first candidate, so an evaluation is the best only if it beats the start; when
        none does, ``run_dir/best`` is the start (the algorithm did not improve on it)."""
        start = {k: v for k, v in self.pretrain_metrics.items() if k.startswith("val/")}
        value = start.get(self.cfg.train.best_metric)  # (no figures without pretraining or train.init_from)
        if value is not None and not math.isnan(value):
            self._keep_best(groups, start)

    def _consider_best(self, groups: ActorGroups, ev: dict) -> None:
        """``train.best_metric``: when this evaluation beats the best so far (the start included) and keeps
        ``train.best_keep_start`` at the start's values, its weights go to ``run_dir/best``."""
        if is_best(ev, self.best, self.pretrain_metrics, self.cfg.train):
            self._keep_best(groups, ev)

    def _keep_best(self, groups: ActorGroups, ev: dict) -> None:
        """The learner's weights now, with validation figures ``ev``, as ``run_dir/best`` (a run folder of one
        checkpoint and best.json)."""
        key = self.cfg.train.best_metric
        self.best = {"iteration": self.iteration, "value": ev[key], "val": dict(ev)}
        save_checkpoint(RunStore(self.store.display(BEST_DIR)), self.iteration, self._payload(groups), keep=1)
        self.store.write_text(f"{BEST_DIR}/best.json", to_json({**self.best, "metric": key}))

    def _best_summary(self, groups: ActorGroups, final_test: tuple[dict, dict]) -> dict | None:
        """summary.json's ``best``: the best evaluation's iteration, checkpoint and figures, its test figures computed
        now by the learner on the best weights (the run's last act: the learner's state is not saved again)."""
        if self.best is None:
            return None
        path = list_checkpoints(RunStore(self.store.display(BEST_DIR)))[-1]
        if self.best["iteration"] == self.iteration:
            test, details = final_test
        else:
            groups.learner.load_state_dict(load_checkpoint(path)["learner"])
            test, details = groups.learner.evaluate("test")
            self._test_cache = None
        best = {"iteration": self.best["iteration"], "metric": self.cfg.train.best_metric, "value": self.best["value"],
                "checkpoint": path, "metrics": {**self.best["val"], **test}}
        self.store.write_text(f"{BEST_DIR}/best.json", to_json(best))
        return {**best, "details": details}

    def _test(self, groups: ActorGroups) -> tuple[dict, dict]:
        """``test/*`` metrics and details of the learner's generator now, computed once per weights version:
        reported (summary.json, the final table), never selected on."""
        version = groups.learner.version()
        if self._test_cache is None or self._test_cache[0] != version:
            self._test_cache = (version, *groups.learner.evaluate("test"))
        return self._test_cache[1], self._test_cache[2]

    def _run_stage(self, groups: ActorGroups, stage: str, n_iters: int, bar) -> dict:
        """Runs the rest of ``stage``; returns the validation metrics (``val/*``) at its end."""
        cfg = self.cfg
        # MLE pretraining is MLE's iteration; the algorithm's own stage its pretrain_step; train its own
        algo = MLE(cfg.algo, cfg.seed) if stage == "mle" else make_algo(cfg.algo, cfg.seed)
        iterate = algo.pretrain_step if stage == ALGO_PRETRAIN else algo.training_step
        batch_size = cfg.train.pretrain_batch_size if stage == "mle" else cfg.train.batch_size
        # the algorithm's own stage leaves G, hence its evaluation, as pretraining ended; the others evaluate as they go
        own = stage == ALGO_PRETRAIN
        ev = {k: v for k, v in self.pretrain_metrics.items() if k.startswith("val/")} if own else None
        if self.stage_iter >= n_iters:
            return ev if own else groups.learner.evaluate("val")[0]
        while self.stage_iter < n_iters:
            if self._stop:
                raise Interrupted()
            t0 = time.perf_counter()
            step = Step(cfg=cfg, task=self.task, rng=self.rng, stage_iter=self.stage_iter, n_iters=n_iters,
                        iteration=self.iteration, batch_size=batch_size, carry=self.carry)
            m = iterate(groups, step)
            self.stage_iter += 1
            self.iteration += 1
            m["time/iter_s"] = time.perf_counter() - t0
            every = cfg.train.eval_every
            if stage == "mle" and cfg.train.pretrain_eval_every is not None:
                every = cfg.train.pretrain_eval_every
            if not own and ((every and self.stage_iter % every == 0) or self.stage_iter == n_iters):
                ev = groups.learner.evaluate("val")[0]
                m.update(ev)
                if cfg.train.best_metric:  # its names checked at the first evaluation, MLE's included
                    check_best_keys(ev, cfg.train)
                    if stage == "train":
                        self._consider_best(groups, ev)
            self.metrics.log(stage, self.iteration, m)
            if cfg.train.checkpoint_every and self.iteration % cfg.train.checkpoint_every == 0:
                self.save(groups)
            if self.report is not None:
                self.report(self.metrics.rows[-1], self)
            bar.update(_postfix(m))
        return ev


def check_best_keys(figures: dict, train, *, keep_only: bool = False, whose: str = "this task's") -> None:
    """A ConfigError naming the first of ``train.best_metric`` and ``train.best_keep_start`` (only the latter with
    ``keep_only``) that ``figures`` lacks, and the validation figures it has."""
    for key in [*([] if keep_only else [train.best_metric]), *train.best_keep_start]:
        if key not in figures:
            have = ", ".join(sorted(k for k in figures if k.startswith("val/"))) or "none"
            raise ConfigError(f"train.best_metric / train.best_keep_start: {key} is not among {whose} validation "
                              f"figures ({have})")


def is_best(ev: dict, best: dict | None, start: dict, train) -> bool:
    """Whether the evaluation ``ev`` (val/* figures) is the new best: ``train.best_metric`` better than ``best``'s
    value (``train.best_mode``; the first qualifying evaluation always is) and each of ``train.best_keep_start`` at
    least its value in ``start`` (the pretrained model's figures). A metric the evaluation lacks is a ConfigError."""
    check_best_keys(ev, train)
    check_best_keys(start, train, keep_only=True, whose="the start's")
    if any(ev[k] < start[k] for k in train.best_keep_start):
        return False
    value = ev[train.best_metric]
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value > best["value"] if train.best_mode == "max" else value < best["value"]


def _postfix(m: dict) -> dict:
    out = {}
    for key, short in (("rollout/reward_mean", "reward"), ("loss/nll", "nll"), ("val/precision", "val_prec"),
                       ("val/nll_oracle", "val_nll_oracle"), ("val/bleu2", "val_bleu2"), ("disc/accuracy", "d_acc")):
        if key in m and math.isfinite(m[key]):
            out[short] = f"{m[key]:.3f}"
    return out




class Progress:
    """What a run shows on stderr while it runs (``progress``): on a terminal a tqdm bar per stage, left on
    screen with its last figures when the next stage starts; elsewhere (``ray job logs``, CI, a file) a plain
    line every ``progress_every`` seconds and one at the end of each stage; nothing with ``progress=false``.
    No rate or time left is shown before a stage's third iteration (its first ones carry start-up costs)."""

    WARMUP = 3  # iterations of a stage (this session) before a rate is shown

    def __init__(self, mode: bool | str, every: float = 30.0, stream=None, clock=time.monotonic):
        import sys

        self.stream, self.clock = stream or sys.stderr, clock
        if mode is True:
            mode = "bar" if _terminal_width(self.stream) else "lines"
        self.mode = mode or "off"
        self.every = every
        self._bar = None
        self._open = False

    def start(self, label: str, total: int, done: int) -> None:
        self.close()
        self.label, self.total, self.n, self.first = label, total, done, done
        self.figures: dict = {}
        self.t0 = self.t_last_line = self.clock()
        self.t_warm = None  # when the warm-up iterations were done: rates are measured from there
        self._open = self.mode != "off"
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=done, desc=label, unit="it", dynamic_ncols=True,
                             file=self.stream, bar_format=self._warmup_format)

    _warmup_format = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

    def update(self, figures: dict) -> None:
        """One iteration done; ``figures``: the short metrics it produced (kept until replaced)."""
        if not self._open:
            return
        self.n += 1
        self.figures.update(figures)
        now = self.clock()
        if self.n - self.first == self.WARMUP:
            self.t_warm = now
        if self._bar is not None:
            if self.n - self.first == self.WARMUP:
                self._bar.bar_format = None  # tqdm's own, with rate and time left from here on
            self._bar.set_postfix(self.figures, refresh=False)
            self._bar.update(1)
        elif now - self.t_last_line >= self.every:
            self._line(now)

    def close(self) -> None:
        """End of the stage (or of the run): the bar's final redraw, or the stage's last line."""
        if not self._open:
            return
        self._open = False
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.n > self.first:
            self._line(self.clock())

    def _line(self, now: float) -> None:
        self.t_last_line = now
        pct = f" {100 * self.n / self.total:3.0f}%" if self.total else ""
        text = f"{self.label} {self.n}/{self.total}{pct}  elapsed {_clock(now - self.t0)}"
        if self.t_warm is not None and self.n - self.first > self.WARMUP and self.n < self.total:
            rate = (self.n - self.first - self.WARMUP) / max(now - self.t_warm, 1e-9)
            text += f", ~{_clock((self.total - self.n) / rate)} left"
        figures = " ".join(f"{k}={v}" for k, v in self.figures.items())
        print(f"{text}  {figures}".rstrip(), file=self.stream, flush=True)


def _terminal_width(stream) -> int:
    """Columns of the terminal ``stream`` writes to; 0 when it is not one, or one without a size (a pseudo-
    terminal nobody sized, where tqdm draws nothing)."""
    import os

    try:
        size = os.get_terminal_size(stream.fileno()) if stream.isatty() else None
    except (AttributeError, OSError, ValueError):
        return 0
    return size.columns if size and size.lines else 0


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


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
