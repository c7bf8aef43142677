"""Dynamic sampling (DAPO, Yu et al. 2025, Sec. 3.2) against plain GRPO on the counting task: the same
MLE-pretrained model per seed, the same batch (``train.batch_size`` replies, G per prompt), side by side.

After MLE pretraining most counting inputs are answered correctly by every one of G samples: their groups have equal
rewards, advantage 0, and plain GRPO spends most of each batch on them. With ``algo.dynamic_sampling=true`` those
groups are dropped and fresh prompts are sampled until the batch holds only groups with a learning signal (at most
``algo.max_resample_rounds`` extra rounds). The question: does it reach plain GRPO's reward in fewer updates, and
what does that cost in sampled prompts and seconds?

Run book (from the repository root)
  python benchmarks/dynamic_sampling.py --seeds 0 1 2 train.iters=120   # what results/ holds
  python benchmarks/dynamic_sampling.py                     # 2 seeds x {grpo, grpo + dynamic sampling}, 80 iterations
  python benchmarks/dynamic_sampling.py --report-only       # tables and plots again from the runs

Time on a 2-core machine (2 runs at a time, in-process): ~3-5 min.

Outputs in ``--out`` (default benchmarks/results): dynamic_sampling.md (table), dynamic_sampling.json (every
per-seed figure, command, machine), dynamic_sampling.png (validation reward against updates and against sampled
prompts); the runs in ``runs/dynamic_sampling/``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._compare import run_all  # noqa: E402
from benchmarks._report import write_report  # noqa: E402

# counting, GRU 1x128; a short MLE pretraining (precision ~0.6-0.7: many groups already all-correct), then GRPO
BASE = ["task.name=counting", "train.pretrain_iters=300", "train.pretrain_batch_size=256", "train.iters=80",
        "train.batch_size=64", "algo.group_size=8", "algo.minibatch_size=64", "algo.lr=1e-3", "train.eval_every=5",
        "task.val_size=1000", "task.test_size=1000", "train.checkpoint_every=0"]
VARIANTS = {
    "grpo": ["algo.name=grpo"],
    "grpo_dynamic_sampling": ["algo.name=grpo", "algo.dynamic_sampling=true", "algo.max_resample_rounds=4"],
}
METRIC = "val/reward"  # the policy's sampled reward on the validation inputs (1 = a correct count)


def load(run_dir: Path) -> dict:
    """The algorithm stage's rows: per evaluation (updates so far, prompts sampled so far, seconds so far, reward).
    The run started from the seed's pretrained model (``train.init_from``: learner version 0, its reward in
    summary.json's pretrain_metrics)."""
    import json

    import pyarrow.parquet as pq
    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    per_iteration = cfg["train"]["batch_size"] // cfg["algo"]["group_size"]  # prompts of one plain iteration
    train = [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    summary = json.loads((run_dir / "summary.json").read_text())
    points = [(0, 0, 0.0, summary["pretrain_metrics"][METRIC])]
    prompts = seconds = 0.0
    version = 0
    for r in train:
        consumed = r.get("group/prompts_consumed")
        prompts += per_iteration if consumed is None else consumed
        seconds += r["time/iter_s"]
        if r.get("learner/version") is not None:
            version = r["learner/version"]
        if r.get(METRIC) is not None:
            points.append((int(version), int(prompts), seconds, r[METRIC]))
    ds = [r for r in train if r.get("group/resample_rounds") is not None]
    return {
        "points": points,  # (updates, prompts sampled, train seconds, val reward)
        "final": points[-1][3],
        "updates": int(version),
        "prompts": int(prompts),
        "train_s": seconds,
        "iter_s_median": statistics.median(r["time/iter_s"] for r in train),
        "all_equal_frac_mean": statistics.mean(r["group/all_equal_frac"] for r in train),
        "resample_rounds_mean": statistics.mean(r["group/resample_rounds"] for r in ds) if ds else 0.0,
        "kept_groups_mean": statistics.mean(r["group/kept_groups"] for r in ds) if ds else None,
    }


def first_reaching(points: list, target: float) -> tuple | None:
    """The first evaluation point after the start whose reward is at least ``target``."""
    return next((p for p in points[1:] if p[3] >= target - 1e-12), None)


def report(dirs: dict, seeds: list[int], out: Path, overrides: list[str], load_avg: tuple) -> None:
    runs = {(v, s): load(dirs[(v, s)]) for v in VARIANTS for s in seeds}
    rows, per_seed = [], []
    for s in seeds:
        plain, ds = runs[("grpo", s)], runs[("grpo_dynamic_sampling", s)]
        target = plain["final"]  # plain GRPO's reward after its whole budget
        hit = first_reaching(ds["points"], target)
        per_seed.append({"seed": s, "target": target, "grpo": plain, "grpo_dynamic_sampling": ds,
                         "ds_reaches_target_at": None if hit is None else
                         {"updates": hit[0], "prompts": hit[1], "train_s": hit[2], "reward": hit[3]}})
        for name, r in (("GRPO", plain), ("GRPO + dynamic sampling", ds)):
            at = (r["updates"], r["prompts"], r["train_s"]) if r is plain else hit
            rows.append(f"| {s} | {name} | {r['points'][0][3]:.3f} | {r['final']:.3f} | {r['updates']} "
                        f"| {r['prompts']} | {r['all_equal_frac_mean']:.2f} | {r['resample_rounds_mean']:.2f} | "
                        f"{'-' if at is None else at[0]} | {'-' if at is None else at[1]} | "
                        f"{'-' if at is None else f'{at[2]:.1f}'} | {1000 * r['iter_s_median']:.0f} |")
    ratio = [p["grpo"]["updates"] / p["ds_reaches_target_at"]["updates"] for p in per_seed
             if p["ds_reaches_target_at"] and p["target"] > p["grpo"]["points"][0][3]]
    gain = [(p["grpo"]["final"], p["grpo_dynamic_sampling"]["final"]) for p in per_seed]
    budget = " ".join([*BASE, *overrides])
    table = "\n".join([
        "# Dynamic sampling (DAPO Sec. 3.2) vs plain GRPO on counting",
        "",
        f"Command: `python benchmarks/dynamic_sampling.py {' '.join(sys.argv[1:])}`; settings `{budget}`; "
        f"dynamic sampling `algo.max_resample_rounds=4`. Both runs of a seed start from the same MLE-pretrained model "
        f"and sample `train.batch_size` replies per round. Runs in-process, 1 torch thread, 2 at a time on a 2-core "
        f"machine; load average before / after: {load_avg[0]:.1f} / {load_avg[1]:.1f}.",
        "",
        f"Target: plain GRPO's `{METRIC}` after its whole budget (per seed). 'to target' = the first validation "
        "(every 5 iterations, after the start) at which the run has reached it: updates, prompts sampled, seconds of "
        "training. all-equal = mean share of sampled groups whose G rewards were all equal; extra rounds = mean "
        "resampling rounds per iteration. A seed where plain GRPO ends below its start has no meaningful target "
        "(its ratio is left out).",
        "",
        f"| seed | run | {METRIC} before | {METRIC} final | updates | prompts sampled | all-equal | extra rounds "
        "| updates to target | prompts to target | train s to target | ms / iteration (median) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Updates to reach plain GRPO's final reward, plain / dynamic sampling: "
        f"{', '.join(f'{x:.1f}x' for x in ratio) or '-'} (seeds where plain GRPO gained). `{METRIC}` after the same "
        f"number of iterations, plain vs dynamic sampling: "
        f"{', '.join(f'{a:.3f} vs {b:.3f}' for a, b in gain)} (per seed).",
    ])
    write_report(out, "dynamic_sampling", table, {"seeds": per_seed, "settings": [*BASE, *overrides],
                                                 "variants": VARIANTS, "load_average": load_avg})
    curves = {v: [[(p[0], p[3]) for p in runs[(v, s)]["points"]] for s in seeds] for v in VARIANTS}
    by_prompts = {f"{v} (x: prompts)": [[(p[1], p[3]) for p in runs[(v, s)]["points"]] for s in seeds]
                  for v in VARIANTS}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, data, xlabel in ((axes[0], curves, "updates (policy steps after MLE)"),
                             (axes[1], by_prompts, "prompts sampled (G replies each)")):
        for j, (name, cs) in enumerate(data.items()):
            for i, c in enumerate(cs):
                x, y = zip(*c)
                ax.plot(x, y, "-o", ms=3, color=f"C{j}", alpha=0.8, label=name.split(" (")[0] if i == 0 else None)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(METRIC)
        ax.legend(fontsize=8)
    fig.suptitle(f"counting, GRPO (G=8, batch 64) with and without dynamic sampling, seeds {seeds}")
    fig.tight_layout()
    fig.savefig(out / "dynamic_sampling.png", dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--runs", type=Path, default=REPO / "runs" / "dynamic_sampling")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--fresh", action="store_true", help="pretrain again (else a seed's finished pretraining is "
                    "reused: it depends on the seed and the train.pretrain_* overrides only)")
    argv = sys.argv[1:] if argv is None else argv
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]  # key=value anywhere, even after --seeds
    args, rest = ap.parse_known_args([a for a in argv if a not in overrides])
    overrides = [*rest, *overrides]
    before = os.getloadavg()[0]
    variants = {k: [*v, *overrides] for k, v in VARIANTS.items()}
    if args.report_only:
        dirs = {(v, s): args.runs / f"{v}-s{s}" for v in VARIANTS for s in args.seeds}
    else:
        for v in VARIANTS:  # always run again
            for s in args.seeds:
                shutil.rmtree(args.runs / f"{v}-s{s}", ignore_errors=True)
        dirs = run_all("", [*BASE, *overrides], [], args.seeds, args.runs, pretrain_algo="grpo", jobs=args.jobs,
                       fresh=args.fresh, variants=variants)
    report(dirs, args.seeds, args.out, overrides, (before, os.getloadavg()[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
