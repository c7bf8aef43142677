"""Guess-the-number from scratch: does an episode-trained policy's success rise, and how many episodes does it take?

The environment is tinker-cookbook's multi-turn recipe (``recipes/multiplayer_rl/guess_number``, rayseq's
``env.name=guess_number``): a hidden integer in [lo, hi], at most ``max_guesses`` guesses, each answered ``higher`` or
``lower``, reward 1 on a hit. Its published figure: a pretrained 4B model with LoRA goes from ~0 to >= 80% success in
20 steps of 256 episodes (~5,000 episodes) on 0-1024 in 10 guesses. Here the policy is a Transformer trained from
nothing on a smaller range (by default 0-15 in 4 guesses: binary search wins 15 of 16), with one token per action
(the guess). The priors differ completely: the 4B model can already read "higher" and count, this one learns what
the words and the numbers mean from the rewards alone. The two numbers sit side by side, not as a comparison.

Each run is ``python -m rayseq.train env.name=guess_number ...`` in-process (``rollout.num_workers=0``), one after the
other; ``val/success`` is measured every ``--eval-every`` iterations on ``task.val_size`` fixed episodes. The table
gives success at a few points of training (mean over seeds), the episodes sampled until validation success first
reached each threshold, and two references: a policy that guesses uniformly at random (distinct guesses) and binary
search (the ceiling).

Run book (from the repository root)
  python benchmarks/guess_number.py                  # GRPO and REINFORCE, 3 seeds, 0-15 in 4 (what results/ holds)
  python benchmarks/guess_number.py --algos grpo --seeds 0 --iters 300                    # a quick look
  python benchmarks/guess_number.py --hi 100 --max-guesses 7 --iters 3000                 # the issue's larger range
  python benchmarks/guess_number.py --report-only                    # the table again from the runs

Time on the 2-core development machine: 90-170 s per run of 1,000 iterations of 64 episodes (evaluations included);
the default (2 algorithms x 3 seeds) takes ~12 min.

Outputs in ``--out`` (default benchmarks/results): guess_number.md (the table), guess_number.json (every run's curve,
the command, commit, machine); the runs in ``runs/guess_number/``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

THRESHOLDS = (0.5, 0.8)
ANCHOR = ("tinker-cookbook guess_number, Qwen 4B + LoRA, 0-1024 in 10 guesses: ~0 -> >= 80% success in 20 steps "
          "x 256 episodes (~5,000 episodes)")


def overrides(args, algo: str, seed: int, run_dir: Path) -> list[str]:
    """The run's command-line overrides."""
    group = [f"algo.group_size={args.group}"] if algo in ("grpo", "rloo") else []
    return ["env.name=guess_number", f"env.kwargs.lo={args.lo}", f"env.kwargs.hi={args.hi}",
            f"env.kwargs.max_guesses={args.max_guesses}", "env.max_action_tokens=1", f"algo.name={algo}", *group,
            f"algo.lr={args.lr}", f"train.batch_size={args.batch}", f"train.iters={args.iters}",
            f"train.eval_every={args.eval_every}", f"train.checkpoint_every={args.iters}", "model.arch=transformer",
            "model.hidden_dim=64", "model.ff_dim=128", f"task.val_size={args.val_size}", "task.test_size=256",
            "rollout.num_workers=0", "progress=false", f"seed={seed}", f"run_dir={run_dir}", *args.extra]


def curve(run_dir: Path) -> dict:
    """(iteration, val/success) at every evaluation, the training success per iteration, test/success."""
    import json

    import pyarrow.parquet as pq

    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    summary = json.loads((run_dir / "summary.json").read_text())
    start = summary["pretrain_metrics"].get("val/success")  # the evaluation before the first update
    val = [(0, float(start))] if start is not None else []
    val += [(int(r["iteration"]), float(r["val/success"])) for r in rows if r.get("val/success") is not None]
    train = [float(r["episode/success"]) for r in rows if r["stage"] == "train"]
    return {"val": val, "train": train, "test_success": summary["metrics"].get("test/success"),
            "wall_s": summary.get("wall_s")}


def random_guesser(lo: int, hi: int, k: int) -> float:
    """Success of k distinct uniformly random guesses: k / n."""
    return min(k, hi - lo + 1) / (hi - lo + 1)


def table(args, runs: dict) -> str:
    from rayseq.episodes.games import binary_search_wins

    n = args.hi - args.lo + 1
    points = sorted({0, *(i for i in (args.iters // 4, args.iters // 2, args.iters) if i)})
    head = ["algorithm", "seeds", *[f"val success @ it {p} ({p * args.batch} ep.)" for p in points],
            *[f"episodes to {t:.0%}" for t in THRESHOLDS], "test success", "wall s/run"]
    lines = [f"# Guess-the-number from scratch: {args.lo}-{args.hi} in {args.max_guesses} guesses", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for algo in args.algos:
        mine = [runs[(algo, s)] for s in args.seeds if (algo, s) in runs]
        if not mine:
            continue
        cells = [algo, str(len(mine))]
        for p in points:
            vals = [dict(r["val"]).get(p) for r in mine]
            vals = [v for v in vals if v is not None]
            cells.append(f"{statistics.mean(vals):.3f}" + (f" ± {statistics.stdev(vals):.3f}" if len(vals) > 1 else "")
                         if vals else "–")
        for t in THRESHOLDS:
            reached = [next((it * args.batch for it, v in r["val"] if v >= t), None) for r in mine]
            got = [x for x in reached if x is not None]
            cells.append(f"{statistics.median(got):,.0f} ({len(got)}/{len(mine)} seeds)" if got else
                         f"not within {args.iters * args.batch:,} (0/{len(mine)})")
        tests = [r["test_success"] for r in mine if r["test_success"] is not None]
        cells.append(f"{statistics.mean(tests):.3f}" if tests else "–")
        cells.append(f"{statistics.mean(r['wall_s'] for r in mine):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    step = max(args.eval_every, (args.iters // 10) // args.eval_every * args.eval_every)
    marks = list(range(0, args.iters + 1, step))
    lines += ["", "Validation success against iterations (mean over seeds):", "",
              "| algorithm | " + " | ".join(str(m) for m in marks) + " |", "|" + " --- |" * (len(marks) + 1)]
    for algo in args.algos:
        mine = [runs[(algo, s)] for s in args.seeds if (algo, s) in runs]
        if mine:
            means = [[dict(r["val"]).get(m) for r in mine] for m in marks]
            lines.append(f"| {algo} | " + " | ".join(f"{statistics.mean(v):.2f}" if None not in v else "–"
                                                     for v in means) + " |")
    lines += ["", f"References: random distinct guesses {random_guesser(args.lo, args.hi, args.max_guesses):.3f}; "
              f"binary search {binary_search_wins(args.lo, args.hi, args.max_guesses)}/{n} = "
              f"{binary_search_wins(args.lo, args.hi, args.max_guesses) / n:.3f}.", "",
              f"Anchor (different prior, different range): {ANCHOR}.", "",
              f"Budget: {args.iters} iterations of {args.batch} episodes (GRPO: groups of {args.group} from one seed), "
              f"algo.lr={args.lr}, a Transformer of width 64 (2 layers) from scratch, one token per action; "
              f"val/success on {args.val_size} fixed episodes every {args.eval_every} iterations, sampling at "
              "temperature 1.", "",
              f"Runs: `python benchmarks/guess_number.py --algos {' '.join(args.algos)} --seeds "
              f"{' '.join(map(str, args.seeds))} --lo {args.lo} --hi {args.hi} --max-guesses {args.max_guesses} "
              f"--iters {args.iters} --batch {args.batch} --group {args.group} --lr {args.lr:g}"
              + "".join(f" {x}" for x in args.extra) + "`."]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algos", nargs="+", default=["grpo", "reinforce"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--lo", type=int, default=0)
    p.add_argument("--hi", type=int, default=15)
    p.add_argument("--max-guesses", type=int, default=4)
    p.add_argument("--iters", type=int, default=1000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--val-size", type=int, default=256)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--runs", type=Path, default=REPO / "runs" / "guess_number")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("extra", nargs="*", help="more overrides for every run (key=value)")
    args = p.parse_args(argv)

    from benchmarks._report import write_report
    from rayseq.train import main as train_main

    runs = {}
    for algo in args.algos:
        for seed in args.seeds:
            run_dir = args.runs / f"{algo}-s{seed}"
            if not args.report_only:
                if run_dir.exists():
                    import shutil

                    shutil.rmtree(run_dir)
                t0 = time.time()
                code = train_main(overrides(args, algo, seed, run_dir))
                if code:
                    print(f"{algo} seed {seed}: exit {code}", file=sys.stderr)
                    return code
                print(f"{algo} seed {seed}: {time.time() - t0:.0f} s", file=sys.stderr)
            if (run_dir / "summary.json").exists():
                runs[(algo, seed)] = curve(run_dir)
    text = table(args, runs)
    write_report(args.out, "guess_number", text, {
        "runs": [{"algo": a, "seed": s, **{k: v for k, v in r.items() if k != "train"},
                  # the training episodes' success, averaged per evaluation interval
                  "train_success": [round(statistics.mean(r["train"][i: i + args.eval_every]), 4)
                                    for i in range(0, len(r["train"]), args.eval_every)]}
                 for (a, s), r in runs.items()], "anchor": ANCHOR,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "random_guesser": random_guesser(args.lo, args.hi, args.max_guesses)})
    return 0 if runs and not any(math.isnan(r["test_success"] or 0.0) for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
