"""python -m rayseq.train — train a sequence generator: MLE pretraining, then an RL algorithm.

Run book
  python -m rayseq.train                                    # default: counting, MLE -> PPO-dynamic,
                                                            # 2 rollout workers, embedded Ray (~minutes)
  python -m rayseq.train algo.name=ppo algo.eps=0.2 seed=3  # key=value overrides (see rayseq/config.py)
  python -m rayseq.train --config tune_configs/counting_quick.yaml rollout.num_workers=0  # in-process
  python -m rayseq.train run_dir=runs/x --resume            # continue from the last checkpoint
  python -m rayseq.train --print-config                     # the resolved config, then exit
  python -m rayseq.train task.name=pairs task.data=DIR reward.fn=my_reward:polite   # your data and reward
  ray job submit --working-dir . -- python -m rayseq.train  # on a cluster (RAY_ADDRESS is joined)

Outputs in ``runs/<name>/`` (or ``run_dir=``): config.yaml, metrics.parquet, tb/ (TensorBoard),
checkpoints/, summary.json.
"""

from __future__ import annotations

import argparse
import logging
import sys

import yaml

from rayseq.config import ConfigError, build_config, config_to_dict, load_yaml


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m rayseq.train",
        description="Train a sequence generator with MLE pretraining then RL (REINFORCE, MIXER, PPO, PPO-dynamic).",
        epilog="Overrides: key=value pairs, e.g. algo.name=ppo algo.eps=0.2 seed=3 rollout.num_workers=0",
    )
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    p.add_argument("--config", help="experiment YAML (e.g. tune_configs/counting.yaml)")
    p.add_argument("--resume", action="store_true", help="continue the run in run_dir from its last checkpoint")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    return p.parse_args(argv)


def load_config(config_path: str | None, overrides: list[str]):
    data = load_yaml(config_path) if config_path else {}
    if "train" in data and "search" in data and isinstance(data.get("train"), dict) and "task" in data["train"]:
        data = data["train"]  # a Tune experiment file: its train: section is a run config
    return build_config(data, overrides)


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
)


def format_table(summary: dict) -> str:
    """The test set's figures (``test/*``) of the pretrained model and of the final one."""
    pre, fin = summary["pretrain_metrics"], summary["metrics"]
    algo = summary["algo"]
    rows = [("test set", "MLE (pretrained)", algo)]
    for name, label in TABLE_ROWS:
        key = f"test/{name}"
        if key in fin:
            a = f"{pre[key]:.4f}" if key in pre else "-"
            rows.append((label, a, f"{fin[key]:.4f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"run dir: {summary['run_dir']}   wall: {summary['wall_s']:.0f} s")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        return 0
    if args.resume and not cfg.run_dir:
        print("error: --resume needs run_dir=DIR", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from rayseq.data.dialogue import DataError
    from rayseq.distributed.driver import Interrupted, run_training
    from rayseq.rewards.reward import RewardError

    try:
        summary = run_training(cfg, resume=args.resume)
    except Interrupted:
        print("interrupted: checkpoint written; continue with --resume", file=sys.stderr)
        return 130
    except (FileExistsError, FileNotFoundError, DataError, RewardError) as exc:
        # a reward function's error raised on a scorer actor arrives as Ray's RayTaskError, an instance of both
        # that and the RewardError: its `cause` is the error itself, without the remote traceback
        print(f"error: {getattr(exc, 'cause', None) or exc}", file=sys.stderr)
        return 2
    print(format_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
