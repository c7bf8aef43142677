"""python -m rayseq.tune — search hyperparameters of rayseq runs with Ray Tune.

Run book
  python -m rayseq.tune tune_configs/counting_ppo_dynamic_search.yaml      # ASHA over α2 = β2 and the lr
  python -m rayseq.tune tune_configs/counting_compare_algos.yaml           # grid: 5 algorithms × 3 seeds
  python -m rayseq.tune tune_configs/counting_pbt.yaml                     # PBT over lr and α2 = β2
  python -m rayseq.tune FILE.yaml search.num_samples=3 search.storage_path=/tmp/x train.iters=50 algo.lr=1e-3
  python -m rayseq.tune FILE.yaml search.param_space.algo.lr="{loguniform: [1.0e-4, 1.0e-3]}"
  python -m rayseq.tune FILE.yaml --print-spec                             # the resolved experiment, then exit
  python -m rayseq.tune FILE.yaml --resume                                 # continue after Ctrl-C / a crash
  tensorboard --logdir runs/tune/<name>                                    # every trial: Tune's + rayseq's events
  python -m rayseq.serve --checkpoint runs/tune/<name>/best                # serve the best trial
  ray job submit --working-dir . -- python -m rayseq.tune FILE.yaml search.storage_path=s3://bucket/tune

The experiment file (see :mod:`rayseq.tuning.spec`) has ``train:`` (a run config, as for
``python -m rayseq.train --config``) and ``search:`` (param_space, metric, mode, num_samples, scheduler,
...). Overrides are run keys as ``python -m rayseq.train`` takes them (``train.iters=50``, ``algo.lr=1e-3``) or
search keys (``search.num_samples=3``); the file's spelling of a run key, ``train.algo.lr=1e-3``, works too. A bad
file or override stops with exit code 2 before Ray starts, naming the key.

Outputs in ``<storage_path>/<name>/``: ``experiment.yaml`` (the resolved experiment), Tune's trial folders
``trial_<id>/`` (result.json, progress.csv, TensorBoard events, ``checkpoint_*/``), rayseq's run
directories ``runs/<trial_id>/`` (config.yaml, metrics.parquet, tb/, checkpoints/, summary.json),
and at the end ``results.csv``, ``best.json``, ``metric_vs_iteration.png`` and ``best/`` (the best
trial's final checkpoint as a run directory). Exit codes: 0 done, 1 every trial failed, 2 bad
experiment, 130 interrupted (continue with ``--resume``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import logging
import math
import numbers
import os
import random
import shlex
import sys
import threading
import time

from rayseq.tuning.spec import Experiment, SpecError, dump, load_experiment, validate

SPEC_FILE = "experiment.yaml"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m rayseq.tune", description="Search hyperparameters of rayseq runs with Ray Tune.",
        epilog="Overrides: run keys as rayseq.train takes them (train.iters=50 algo.lr=1e-3) or search.KEY=VALUE "
               "(search.num_samples=3)",
    )
    p.add_argument("experiment", help="experiment YAML with train: and search: (tune_configs/*_search.yaml)")
    p.add_argument("overrides", nargs="*", help="overrides key=value: run keys, or search.KEY")
    p.add_argument("--resume", action="store_true", help="continue the experiment in <storage_path>/<name>")
    p.add_argument("--print-spec", action="store_true", help="print the resolved experiment and exit")
    return p.parse_args(argv)


def tune_config(exp: Experiment):
    """Tune's TuneConfig: metric, mode, samples, concurrency, scheduler and the seeded variant generator."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining
    from ray.tune.search import BasicVariantGenerator

    from rayseq.tuning.trainable import trial_dirname

    s, sched = exp.search, exp.search.scheduler
    if sched.name == "asha":
        scheduler = ASHAScheduler(time_attr=sched.time_attr, max_t=sched.max_t, grace_period=sched.grace_period,
                                  reduction_factor=sched.reduction_factor)
    elif sched.name == "pbt":
        scheduler = PopulationBasedTraining(
            time_attr=sched.time_attr, perturbation_interval=sched.perturbation_interval,
            burn_in_period=sched.burn_in_period, quantile_fraction=sched.quantile_fraction,
            resample_probability=sched.resample_probability, synch=sched.synch,
            hyperparam_mutations={k: d.to_mutation() for k, d in exp.mutations.items()},
        )
    else:
        scheduler = FIFOScheduler()
    # the seeded variant generator limits concurrency itself (TuneConfig.max_concurrent_trials would be
    # ignored next to it)
    search_alg = BasicVariantGenerator(random_state=s.seed, max_concurrent=s.max_concurrent_trials or 0)
    # reuse_actors: a new trial (or a PBT trial restarted after an exploit) runs in the process of one that
    # ended, which saves starting Python, torch and the task again (seconds per trial); Tune's reset_config
    # of a function trainable first ends the old trial's thread, and the Trainer seeds everything it uses
    return tune.TuneConfig(metric=s.metric, mode=s.mode, num_samples=s.num_samples, scheduler=scheduler,
                           search_alg=search_alg, trial_dirname_creator=trial_dirname, reuse_actors=True)


def make_trainable(exp: Experiment):
    """The function trainable with the experiment bound and each trial's PlacementGroupFactory."""
    from ray import tune

    from rayseq.tuning.trainable import run_trial, trial_bundles

    storage = exp.path.rsplit("/", 1)[0]
    payload = {"experiment": exp.to_dict(), "storage_path": storage}

    def resources(config: dict):
        cfg = exp.trial_config(config)
        return tune.PlacementGroupFactory(trial_bundles(cfg), strategy=cfg.rollout.placement_strategy)

    return tune.with_resources(tune.with_parameters(run_trial, exp=payload), resources=resources)


def run_experiment(exp: Experiment, *, resume: bool = False):
    """Run (or with ``resume`` continue) the search; returns Tune's ResultGrid. Starts an embedded Ray
    unless one is running or ``RAY_ADDRESS`` names a cluster."""
    from ray import tune

    from rayseq.distributed.runtime import init_ray
    from rayseq.storage import RunStore

    # trials run in the worker's working directory (the repository, or the job's working_dir copy), not
    # Tune's trial folder, so relative paths of the run config (task.data, ...) mean what they say
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    if exp.search.seed is not None:
        random.seed(exp.search.seed)  # PBT's explore draws from `random` in this process
    base = exp.base
    base.task_class.prepare_data(base.task)  # e.g. pairs' task.prepare: once, here, rather than by concurrent trials
    init_ray()
    trainable = make_trainable(exp)
    if resume:
        return tune.Tuner.restore(exp.path, trainable=trainable, resume_errored=True).fit()
    RunStore(exp.path).write_text(SPEC_FILE, dump(exp))
    s = exp.search
    tuner = tune.Tuner(
        trainable,
        param_space={k: d.to_tune() for k, d in exp.dims.items()},
        tune_config=tune_config(exp),
        run_config=tune.RunConfig(
            # Tune's own status tables (verbose=1: ~1,000 lines for 10 trials) give way to one progress line
            name=exp.name, storage_path=exp.path.rsplit("/", 1)[0], stop=dict(s.stop) or None, verbose=0,
            callbacks=[finite_tensorboard_logger(), progress_line(exp)],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=exp.keep_checkpoints),
            failure_config=tune.FailureConfig(max_failures=s.max_failures),
        ),
    )
    return tuner.fit()


def finite_tensorboard_logger():
    """Tune's TensorBoard logger without non-finite scalars: a trial's search metric is NaN until its first evaluation
    (and a few figures can be inf), which tensorboardX would log with a "NaN or Inf found in input tensor" warning
    each (~1,100 for a 10-trial search). The results themselves (result.json, progress.csv) keep every value."""
    from ray.tune.logger import TBXLoggerCallback

    class FiniteTBXLogger(TBXLoggerCallback):
        def log_trial_result(self, iteration, trial, result):
            super().log_trial_result(iteration, trial, _finite(result))

    return FiniteTBXLogger()


def _finite(result: dict) -> dict:
    """``result`` without NaN/inf numbers (nested dicts too; the config is not logged as scalars)."""
    out = {}
    for k, v in result.items():
        if isinstance(v, dict) and k != "config":
            out[k] = _finite(v)
        elif not (isinstance(v, numbers.Real) and not math.isfinite(v)):
            out[k] = v
    return out


def progress_line(exp: Experiment, every_s: float = 30.0):
    """A Tune callback printing one line every ``every_s`` seconds and when a trial ends: trials done / running /
    pending, the best value of the search metric so far and its trial, the time since the start."""
    from ray import tune

    metric, sign = exp.search.metric, 1 if exp.search.mode == "max" else -1

    class ProgressLine(tune.Callback):
        def setup(self, **info):
            self.t0, self.last, self.ended = time.monotonic(), 0.0, 0

        def on_trial_complete(self, iteration, trials, trial, **info):
            self.ended += 1
            self.show(trials)

        on_trial_error = on_trial_complete

        def on_step_end(self, iteration, trials, **info):
            if time.monotonic() - self.last >= every_s:
                self.show(trials)

        def show(self, trials):
            self.last = time.monotonic()
            status = collections.Counter(t.status for t in trials)
            best = None
            for t in trials:
                v = (t.last_result or {}).get(metric)
                if isinstance(v, (int, float)) and math.isfinite(v) and (best is None or sign * v > sign * best[0]):
                    best = (v, t.trial_id)
            parts = [f"{status.get('TERMINATED', 0) + status.get('ERROR', 0)}/{exp.num_trials()} trials done",
                     f"{status.get('RUNNING', 0)} running", f"{status.get('PENDING', 0)} pending"]
            if status.get("ERROR"):
                parts.append(f"{status['ERROR']} failed")
            best_text = f"best {metric} {best[0]:.4g} ({best[1]})" if best else f"no {metric} yet"
            elapsed = int(time.monotonic() - self.t0)
            print(f"tune: {', '.join(parts)}; {best_text}; {elapsed // 60}:{elapsed % 60:02d} elapsed", flush=True)

    return ProgressLine()


class TensorBoardHint(io.TextIOBase):
    """stdout while Tune runs, with one line rewritten: Ray Tune 2.60 opens with "To visualize your results
    with TensorBoard, run: `tensorboard --logdir /tmp/ray/session_.../driver_artifacts`", a temporary staging
    folder of the driver (gone with the Ray session, and without rayseq's events). That line becomes the
    experiment's own folder, which holds Tune's events and every trial's run directory; everything else,
    warnings included, passes through unchanged (a partial line is held only while it can still become
    the hint)."""

    RAY_HINT = "To visualize your results with TensorBoard, run: "

    def __init__(self, out, logdir: str):
        self.out, self.logdir, self.pending, self.lock = out, logdir, "", threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            self.pending += text
            while "\n" in self.pending:
                line, self.pending = self.pending.split("\n", 1)
                if line.startswith(self.RAY_HINT):
                    line = f"{self.RAY_HINT}`tensorboard --logdir {self.logdir}`"
                self.out.write(line + "\n")
            if self.pending and not (self.RAY_HINT.startswith(self.pending) or
                                     self.pending.startswith(self.RAY_HINT)):
                self.out.write(self.pending)
                self.pending = ""
        return len(text)

    def flush(self) -> None:
        with self.lock:
            self.out.write(self.pending)
            self.pending = ""
        self.out.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.out.isatty()

    @property
    def encoding(self):
        return getattr(self.out, "encoding", "utf-8")


@contextlib.contextmanager
def tensorboard_hint_at(logdir: str):
    """Within: Ray Tune's TensorBoard hint names ``logdir`` (see :class:`TensorBoardHint`)."""
    hint = TensorBoardHint(sys.stdout, logdir)
    try:
        with contextlib.redirect_stdout(hint):
            yield
    finally:
        hint.flush()


def interrupted(grid) -> bool:
    """Trials neither done nor errored: the run stopped early (Ctrl-C), resumable."""
    return any(r.error is None and not (r.metrics or {}).get("done") for r in grid)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        exp = load_experiment(args.experiment, args.overrides)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.print_spec:
        print(dump(exp), end="")
        print(f"# {exp.num_trials()} trials; results in {exp.path}")
        return 0
    from ray import tune

    from rayseq.storage import RunStore

    store = RunStore(exp.path)
    exists = tune.Tuner.can_restore(exp.path)
    if args.resume:
        if not exists:
            print(f"error: --resume: no experiment to continue in {exp.path}", file=sys.stderr)
            return 2
        if store.exists(SPEC_FILE):
            import yaml

            saved = validate(yaml.safe_load(store.read_text(SPEC_FILE)), source=args.experiment)
            saved.search.storage_path = exp.search.storage_path  # where it is now (it may have moved)
            if saved.to_dict() != exp.to_dict():
                print(f"note: continuing with the experiment saved in {store.display(SPEC_FILE)}", file=sys.stderr)
            exp = saved
    elif exists:
        print(f"error: {exp.path} already holds an experiment; pass --resume, or search.name=OTHER",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    print(f"experiment {exp.name}: {exp.num_trials()} trials, metric {exp.search.metric} ({exp.search.mode}), "
          f"scheduler {exp.search.scheduler.name}; results in {exp.path}", flush=True)
    from rayseq.distributed.runtime import dropping_log_messages

    # on Ctrl-C Tune names its own way to continue (Tuner.restore(...) in Python); rayseq's command is the one
    # printed below
    with tensorboard_hint_at(exp.path), dropping_log_messages("ray.tune.tune", "Experiment has been interrupted"):
        grid = run_experiment(exp, resume=args.resume)
    if interrupted(grid):
        cmd = shlex.join(["python", "-m", "rayseq.tune", args.experiment, *args.overrides, "--resume"])
        print(f"interrupted: continue with {cmd}", file=sys.stderr)
        return 130
    from rayseq.tuning.results import summarize

    out = summarize(exp, grid)
    best = out.get("best")
    if best is None:
        print(f"no trial reported a finite {exp.search.metric}; see {exp.path}", file=sys.stderr)
        return 1
    print(f"best trial {best['trial_id']}: {exp.search.metric} = {best['value']:.4g} with {best['params']}")
    print(f"best run exported to {best['export']}  (python -m rayseq.serve --checkpoint {best['export']})")
    print(f"results: {out['results_csv']}, {out['plot']}")
    print(f"dashboards: tensorboard --logdir {exp.path}  (every trial: Tune's events and rayseq's runs/<trial>/tb)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
