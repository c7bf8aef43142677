"""python -m rayseq.train — train a sequence generator: MLE pretraining, then an RL algorithm.

Run book
  python -m rayseq.train                                    # default: counting, MLE -> PPO-dynamic,
                                                            # 2 rollout workers, embedded Ray (~minutes)
  python -m rayseq.train algo.name=ppo algo.eps=0.2 seed=3  # key=value overrides (--print-config lists every key)
  python -m rayseq.train --config tune_configs/counting_quick.yaml rollout.num_workers=0  # in-process
  python -m rayseq.train run_dir=runs/x --resume            # continue from the last checkpoint, with the
                                                            # run's own config (Ctrl-C prints this command)
  python -m rayseq.train run_dir=runs/x --resume train.iters=400   # ... and a longer algorithm stage
  python -m rayseq.train --print-config                     # the resolved config, every key described; exit
  python -m rayseq.train task.name=pairs task.data=DIR reward.fn=my_reward:polite   # your data and reward
  ray job submit --working-dir . -- python -m rayseq.train  # on a cluster (RAY_ADDRESS is joined)

Outputs in ``runs/<name>/`` (or ``run_dir=``; printed when the run starts): config.yaml, metrics.parquet,
tb/ (TensorBoard), checkpoints/, summary.json.

``--resume`` takes the run's saved config (its latest checkpoint's) as the base; ``--config`` and key=value
on the command line may change only what a checkpoint does not fix (:data:`rayseq.config.RESUMABLE`: length,
evaluation and checkpoint schedule, learning rates, resources, progress output); a key repeated with its saved
value is fine. Everything is checked before a file is written or Ray starts; a run directory without a
checkpoint is an error at once (exit code 2).

A run whose actors cannot start ends as soon as one constructor raises, with one line naming the actor, its node, the
error and, where known, the key to change (``error: rollout worker 1 on node … could not start: ValueError: … (the
key to change: rollout.engine_kwargs)``; exit code 2 with a key, else 1); so does a placement the cluster Ray started
here can never meet. The progress lines before it (``start-up: …``) say which step was starting.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import shlex
import sys

from rayseq.config import (
    ConfigError,
    build_config,
    config_to_dict,
    described_yaml,
    load_yaml,
    parse_overrides,
    resume_config,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m rayseq.train",
        description="Train a sequence generator with MLE pretraining then RL (REINFORCE, MIXER, PPO, PPO-dynamic).",
        epilog="Overrides: key=value pairs, e.g. algo.name=ppo algo.eps=0.2 seed=3 rollout.num_workers=0",
    )
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    p.add_argument("--config", help="experiment YAML (e.g. tune_configs/counting.yaml)")
    p.add_argument("--resume", action="store_true", help="continue the run in run_dir from its last checkpoint")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config, each key with its description, and exit")
    return p.parse_intermixed_args(argv)  # key=value pairs before and after the flags


def load_config_data(config_path: str | None) -> dict:
    data = load_yaml(config_path) if config_path else {}
    if "train" in data and "search" in data and isinstance(data.get("train"), dict) and "task" in data["train"]:
        data = data["train"]  # a Tune experiment file: its train: section is a run config
    return data


def load_config(config_path: str | None, overrides: list[str]):
    return build_config(load_config_data(config_path), overrides)


CKPT_NAME = re.compile(r"^ckpt_\d{8}\.pt$")


def _has_checkpoint(run_dir: str) -> bool:
    """Whether ``run_dir`` holds a checkpoint; for a local path without importing torch or pyarrow (this check
    answers a wrong --resume in a fraction of a second)."""
    if "://" in run_dir:
        from rayseq.storage import RunStore

        names = RunStore(run_dir).listdir("checkpoints")
    else:
        folder = os.path.join(os.path.expanduser(run_dir), "checkpoints")
        names = os.listdir(folder) if os.path.isdir(folder) else []
    return any(CKPT_NAME.match(n) for n in names)


def resume_config_for(run_dir: str, data: dict, overrides: list[str]):
    """(config, checkpoint's driver state, changed keys) of ``--resume``: the run's latest checkpoint's config
    <- ``data`` <- overrides (:func:`rayseq.config.resume_config`). Raises ConfigError / FileNotFoundError."""
    local = "://" not in run_dir
    if local and not os.path.isdir(os.path.expanduser(run_dir)):
        raise FileNotFoundError(f"--resume: run_dir={run_dir} does not exist")
    if not _has_checkpoint(run_dir):
        raise FileNotFoundError(f"--resume: {run_dir} holds no checkpoint (checkpoints/ckpt_*.pt), so there is "
                                "nothing to resume; start the run without --resume")
    from rayseq.checkpoint import CheckpointError, load_checkpoint

    try:
        # its newest checkpoint that loads (a damaged one is named in a warning)
        ck = load_checkpoint(run_dir, training_state=False)
    except CheckpointError as exc:
        raise ConfigError(f"--resume: {exc}") from None
    cfg, changed = resume_config(ck["config"], data, overrides, stage=ck["driver"]["stage"])
    return cfg, ck["driver"], changed


def in_ray_job() -> bool:
    """This process is a job's driver (``ray job submit`` sets this variable for the entrypoint)."""
    return "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ


def relative_run_dir_warning(run_dir: str | None) -> str | None:
    """Inside a Ray job a relative run_dir (the default runs/<name> too) lands in the job's working directory,
    which with --working-dir is Ray's temporary copy of the code: say where, at start."""
    if not in_ray_job() or (run_dir and ("://" in run_dir or os.path.isabs(os.path.expanduser(run_dir)))):
        return None
    try:
        temporary = bool(json.loads(os.environ["RAY_JOB_CONFIG_JSON_ENV_VAR"]).get("runtime_env", {})
                         .get("working_dir"))
    except (ValueError, AttributeError):
        temporary = False
    given = f"run_dir={run_dir}" if run_dir else "the default run_dir runs/<name>"
    where = os.path.abspath(run_dir or "runs")
    return (f"warning: {given} is relative: in this Ray job it is {where}, "
            + ("in Ray's temporary copy of --working-dir, which Ray may delete once the job ends; " if temporary
               else "in the job's working directory on the head node; ")
            + "give an absolute path that outlives the job (run_dir=/shared/runs/x) or a URI (run_dir=s3://...)")


def _where(trainer, stage: str, stage_iter: int) -> str:
    """``stage mle, 120/1000``."""
    return f"stage {stage}, {stage_iter}/{trainer.plan()[stage]}"


def resume_command(run_dir: str) -> str:
    return f"python -m rayseq.train {shlex.quote(f'run_dir={run_dir}')} --resume"


TABLE_ROWS = (
    ("precision", "precision (greedy)"),
    ("precision_sampled", "precision (sampled)"),
    ("y1_tv", "y1 TV distance (mean over N)"),
    ("y1_tv_n5", "y1 TV distance (N = 5)"),
    ("nll_oracle", "NLL-oracle (lower is better)"),
    ("nll_data", "NLL-test"),
    ("bleu2", "BLEU-2"),
    ("distinct1", "distinct-1"),
    ("distinct2", "distinct-2"),
    ("self_bleu2", "Self-BLEU-2"),
    ("reply_len", "mean reply length"),
    ("accuracy", "pairs ranked right (reward model)"),
    ("accuracy_longer", "baseline: the longer reply preferred"),
    ("margin", "mean r(chosen) - r(rejected)"),
    ("loss", "Bradley-Terry loss"),
)
# what a figure the table shows as n/a (NaN) means, said on its row
NOT_AVAILABLE = {"bleu2": "n/a: the data has no reference replies"}


def format_table(summary: dict) -> str:
    """The test set's figures (``test/*``) of the pretrained model (the starting one, without pretraining) and of the
    final one (and of the best evaluation's, with ``train.best_metric``); then, for a task with a reward, the mean
    reward of sampled replies on the test and validation sets, and each term of a configured one."""
    pre, fin = summary["pretrain_metrics"], summary["metrics"]
    best = summary.get("best")
    cols = [pre, fin, *([best["metrics"]] if best else [])]
    start = "MLE (pretrained)" if summary.get("pretrained", True) else "start (not pretrained)"
    rows = [("test set", start, summary["algo"],
             *([f"best {best['metric']} (iteration {best['iteration']})"] if best else []))]
    keys = [(f"test/{name}", label) for name, label in TABLE_ROWS]
    for split, where in (("test", ""), ("val", "validation ")):  # the reward, then each of its terms
        keys += [(f"{split}/reward", f"{where}reward (sampled replies)")]
        keys += [(k, f"{where}reward: {k.rsplit('/', 1)[1]}") for k in fin if k.startswith(f"{split}/reward/")]
    for key, label in keys:
        if key in fin:
            cells = ["-" if key not in c else "n/a" if math.isnan(c[key]) else f"{c[key]:.4f}" for c in cols]
            if "n/a" in cells and (why := NOT_AVAILABLE.get(key.split("/", 1)[1])):
                label = f"{label} ({why})"
            rows.append((label, *cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols) + 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"run dir: {summary['run_dir']}   wall: {summary['wall_s']:.0f} s"
                 + (f"   best: {summary['run_dir']}/best" if best else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    resumed = None
    try:
        data = load_config_data(args.config)
        if args.resume:
            # the run directory is checked first, before anything heavy is imported (torch, Ray)
            run_dir = parse_overrides(args.overrides).get("run_dir", data.get("run_dir"))
            if not run_dir or not isinstance(run_dir, str):
                raise ConfigError("--resume needs run_dir=DIR, the run to continue")
            if warning := relative_run_dir_warning(run_dir):
                print(warning, file=sys.stderr)
            cfg, resumed, changed = resume_config_for(run_dir, data, args.overrides)
        else:
            cfg = build_config(data, args.overrides)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(described_yaml(config_to_dict(cfg), cfg), end="")
        return 0
    if not args.resume and (warning := relative_run_dir_warning(cfg.run_dir)):
        print(warning, file=sys.stderr)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from rayseq.data.preparation import DataError
    from rayseq.distributed.driver import Interrupted, Trainer
    from rayseq.distributed.groups.placement import NodeLost
    from rayseq.distributed.groups.startup import StartupFailed
    from rayseq.episodes.protocol import EnvError
    from rayseq.rewards.reward import RewardError

    trainer = None
    try:
        trainer = Trainer(cfg, resume=args.resume)
        if resumed is not None:
            where = _where(trainer, resumed["stage"], resumed["stage_iter"])
            changes = "; ".join(f"{k} {a} -> {b}" for k, a, b in changed if k != "run_dir")
            print(f"resuming {trainer.run_dir} after iteration {resumed['iteration']} ({where})"
                  + (f"; changed: {changes}" if changes else ""), file=sys.stderr)
        else:
            print(f"run dir: {trainer.run_dir}", file=sys.stderr)
        sys.stderr.flush()
        summary = trainer.run()
    except Interrupted as exc:
        where = _where(trainer, trainer.stage, trainer.stage_iter)
        print(f"interrupted after iteration {trainer.iteration} ({where}); checkpoint {exc.checkpoint}. "
              "Continue with:", file=sys.stderr)
        print(resume_command(trainer.run_dir), file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # outside the loop's own handler (start-up, shut-down)
        where = trainer.run_dir if trainer is not None else cfg.run_dir
        if where and _has_checkpoint(where):
            print("interrupted. Continue from the last checkpoint with:", file=sys.stderr)
            print(resume_command(where), file=sys.stderr)
        else:
            print("interrupted before the first checkpoint: nothing to resume", file=sys.stderr)
        return 130
    except NodeLost as exc:  # the learner's node died: its state since the last checkpoint is gone
        print(f"error: {exc}", file=sys.stderr)
        if _has_checkpoint(trainer.run_dir):
            print("Continue from the last checkpoint with:", file=sys.stderr)
            print(resume_command(trainer.run_dir), file=sys.stderr)
        else:
            print("lost before the first checkpoint: nothing to resume; start the run again", file=sys.stderr)
        return 1
    except StartupFailed as exc:  # an actor that could not start (or start again), a placement never met: one line
        print(f"error: {exc}", file=sys.stderr)
        if trainer is not None and _has_checkpoint(trainer.run_dir):
            print("Continue from the last checkpoint, once that is mended, with:", file=sys.stderr)
            print(resume_command(trainer.run_dir), file=sys.stderr)
        return 2 if exc.config_key else 1
    except (ConfigError, FileExistsError, FileNotFoundError, DataError, RewardError, EnvError) as exc:
        # a reward function's error raised on a scorer actor arrives as Ray's RayTaskError, an instance of both
        # that and the RewardError: its `cause` is the error itself, without the remote traceback
        print(f"error: {getattr(exc, 'cause', None) or exc}", file=sys.stderr)
        return 2
    print(format_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
