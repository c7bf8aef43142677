"""Rollouts sampled ahead of the learner (``rollout.max_staleness`` = k): wall-clock to the synchronous run's
validation reward, and how busy the learner and the workers are, for k = 0 (synchronous), 1, 2 and 4.

Cases, GRPO on 2 Ray rollout workers (the reward computed where the rollout is sampled, no scorer actors), seeds 0 1 2:

  counting   the counting task on the small GRU (32/64), from one MLE model per seed (in-process, ``train.init_from``),
             batch 256 in groups of 4, validated on the reward of sampled replies every 10 iterations, 200 iterations
  gpt2       the tiny local GPT-2 (2 layers, 64 wide; built here, nothing downloaded) on the chit-chat prompts,
             rewarded by reply length (3 words), no pretraining, batch 32 in groups of 4, validated every 10

and each once more with a straggler: worker 0 made ``--slow`` times slower (after each of its sampling calls it
sleeps (slow − 1) × the call's time, counted as its sampling time), installed in Ray's worker processes by a
``worker_process_setup_hook`` of this script. One embedded Ray is started for all runs (workers at nice 0).

Per run: the validation reward after every evaluation against the training wall-clock (the sum of ``time/iter_s``:
evaluations left out, they are the same for every k); the target is 90% of the way from the start to the final
validation reward of the synchronous run of the same seed (and straggler setting); the time to target is the clock
at the first evaluation at or past it. Busy fractions over the run: the learner's (``time/update_s`` +
``time/publish_s`` over the wall-clock) and the workers' (their sampling seconds, ``time/sample_total_s``, over
2 × the wall-clock). Medians over seeds; ratios against k = 0 of the same case and straggler setting.

Command   python benchmarks/async_rollouts.py [--cases counting gpt2] [--ks 0 1 2 4] [--seeds 0 1 2] [--slow 3]
              [--ratio-to behaviour|proximal] [--quick]
Writes    benchmarks/results/async_rollouts.md, .json and .png (``--ratio-to proximal``: async_rollouts_proximal.*;
          ``--quick``: ..._quick.*)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SLOW_FILE = "RAYSEQ_BENCH_SLOW_FILE"  # env: a file holding the straggler's slow-down factor (read at each call)

COMMON = ["algo.name=grpo", "algo.group_size=4", "progress=false", "learner.num_cpus=1", "rollout.num_workers=2",
          "rollout.num_cpus_per_worker=0.5", "scorer.num_scorers=0"]
CASES = {
    "counting": {"overrides": ["task.name=counting", "task.test_size=200", "task.val_size=200", "model.emb_dim=32",
                               "model.hidden_dim=64", "algo.lr=1e-3", "train.batch_size=256",
                               "train.pretrain_batch_size=128", "train.eval_every=10"],
                 "pretrain": 200, "iters": 200},
    "gpt2": {"overrides": ["task.name=pairs", "task.test_size=100", "task.val_size=40", "algo.kl_coef=0.05",
                           "algo.lr=1e-3", "train.batch_size=32", "train.eval_every=10", "reward.fn=length",
                           "reward.kwargs={target: 3}"],
             "pretrain": 0, "iters": 120},
}
QUICK = {"counting": {"pretrain": 20, "iters": 6}, "gpt2": {"pretrain": 0, "iters": 6}}


def straggler_hook() -> None:
    """In each Ray worker process: worker 0's sampling calls take ``slow`` times as long (``slow`` read from the
    file named by $RAYSEQ_BENCH_SLOW_FILE at each call; 1 or no file: unchanged)."""
    from rayseq.distributed.actors import worker

    sample = worker.RolloutWorker.sample

    def slowed(self, *args, **kwargs):
        t0 = time.perf_counter()
        rollout = sample(self, *args, **kwargs)
        path = os.environ.get(SLOW_FILE)
        slow = float(Path(path).read_text()) if path and Path(path).exists() else 1.0
        if self.index == 0 and slow > 1:
            extra = (slow - 1) * (time.perf_counter() - t0)
            time.sleep(extra)
            rollout.info["sample_s"] = rollout.info.get("sample_s", 0.0) + extra
        return rollout

    worker.RolloutWorker.sample = slowed


def train(overrides: list[str], run_dir: Path) -> tuple[dict, list[dict]]:
    import pyarrow.parquet as pq

    from rayseq.config import build_config
    from rayseq.distributed.driver import Trainer

    summary = Trainer(build_config(None, [*overrides, f"run_dir={run_dir}"])).run()
    return summary, pq.read_table(run_dir / "metrics.parquet").to_pylist()


def curve(rows: list[dict], start: float, clock_of=lambda r: r["time/iter_s"]) -> list[tuple[float, float]]:
    """(training seconds, validation reward) at the start and after each evaluation of the algorithm stage
    (``clock_of``: what each iteration adds to the first coordinate; 1: iterations)."""
    out, clock = [(0.0, start)], 0.0
    for r in rows:
        if r["stage"] != "train":
            continue
        clock += clock_of(r)
        if r.get("val/reward") is not None:
            out.append((clock, r["val/reward"]))
    return out


def time_to(points: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, v in points if v >= target), None)


def record(case: str, k: int, slow: float, seed: int, summary: dict, rows: list[dict]) -> dict:
    train_rows = [r for r in rows if r["stage"] == "train"]
    wall = sum(r["time/iter_s"] for r in train_rows)
    start = summary["pretrain_metrics"]["val/reward"]
    return {
        "case": case, "k": k, "slow": slow, "seed": seed, "wall_s": wall, "start": start,
        "final": summary["metrics"]["val/reward"], "curve": curve(rows, start),
        "iter_curve": curve(rows, start, lambda r: 1), "iters": len(train_rows),
        "s_per_iter": statistics.median(r["time/iter_s"] for r in train_rows),
        "staleness": statistics.mean(r["rollout/staleness"] for r in train_rows),
        "in_flight": statistics.mean(r.get("rollout/in_flight") or 0.0 for r in train_rows),
        "learner_busy": sum(r["time/update_s"] + r.get("time/publish_s", 0.0) for r in train_rows) / wall,
        "workers_busy": sum(r["time/sample_total_s"] for r in train_rows) / (2 * wall),
    }


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def table(recs: list[dict], args) -> str:
    lines = ["| case | straggler | k | s / iter | time to target s | vs k = 0 | reached | final val reward | "
             "staleness | learner busy | workers busy |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for case in args.cases:
        for slow in sorted({1.0, args.slow}):
            group = [r for r in recs if r["case"] == case and r["slow"] == slow]
            base = median(r["to_target"] for r in group if r["k"] == 0)
            for k in args.ks:
                rs = [r for r in group if r["k"] == k]
                if not rs:
                    continue
                tt = median(r["to_target"] for r in rs)
                reached = sum(r["to_target"] is not None for r in rs)
                ratio = f"{tt / base:.2f}" if tt and base else "–"
                finals = sorted(r["final"] for r in rs)
                lines.append(
                    f"| {case} | {'worker 0 × ' + format(slow, 'g') if slow > 1 else 'none'} | {k} | "
                    f"{median(r['s_per_iter'] for r in rs):.3f} | {f'{tt:.1f}' if tt is not None else '–'} | "
                    f"{ratio} | {reached}/{len(rs)} | {statistics.median(finals):.3f} "
                    f"({finals[0]:.3f}–{finals[-1]:.3f}) | {median(r['staleness'] for r in rs):.2f} | "
                    f"{median(r['learner_busy'] for r in rs):.2f} | {median(r['workers_busy'] for r in rs):.2f} |")
    return "\n".join(lines)


def long_table(recs: list[dict], args) -> str:
    lines = ["| case | straggler | k | iterations run | synchronous final (per seed) | first iteration at or past it "
             "(per seed) | final val reward (per seed) |", "|---|---|---:|---:|---|---|---|"]

    def per_seed(rs, key, fmt):
        return ", ".join("–" if r[key] is None else format(r[key], fmt) for r in rs)

    for case in args.cases:
        for slow in sorted({1.0, args.slow}):
            for k in args.ks:
                rs = sorted((r for r in recs if (r["case"], r["slow"], r["k"]) == (case, slow, k)),
                            key=lambda r: r["seed"])
                if rs:
                    straggler = f"worker 0 × {slow:g}" if slow > 1 else "none"
                    lines.append(f"| {case} | {straggler} | {k} | {rs[0]['iters']} | "
                                 f"{per_seed(rs, 'sync_final', '.3f')} | {per_seed(rs, 'iters_to_sync_final', '.0f')} "
                                 f"| {per_seed(rs, 'final', '.3f')} |")
    return "\n".join(lines)


def plot(recs: list[dict], args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(c, s) for c in args.cases for s in sorted({1.0, args.slow})]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (case, slow) in zip(axes[0], panels):
        for k in args.ks:
            for i, r in enumerate(r for r in recs if r["case"] == case and r["slow"] == slow and r["k"] == k):
                xs, ys = zip(*r["curve"])
                ax.plot(xs, ys, color=f"C{args.ks.index(k)}", alpha=0.8, label=f"k = {k}" if i == 0 else None)
        ax.set_title(f"{case}, {'straggler × ' + format(slow, 'g') if slow > 1 else 'no straggler'}", fontsize=9)
        ax.set_xlabel("training seconds")
        ax.set_ylabel("validation reward")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--slow", type=float, default=3.0, help="the straggler's slow-down (1: no straggler runs)")
    ap.add_argument("--ratio-to", choices=["behaviour", "proximal"], default="behaviour",
                    help="algo.ratio_to of every run (proximal: the decoupled objective; its report is "
                    "async_rollouts_proximal.*)")
    ap.add_argument("--stale-iters", type=float, default=1.0,
                    help="the runs with k > 0 train this many times the synchronous run's iterations (their "
                    "report: ..._long.*), and the table says at which iteration they first reach the synchronous "
                    "run's final validation reward")
    ap.add_argument("--quick", action="store_true", help="a few iterations (a smoke run)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if 0 not in args.ks:
        ap.error("--ks must include 0: the synchronous run sets the target")
    from benchmarks._report import write_report
    from benchmarks.learner_memory import hf_fixture
    from rayseq.distributed.runtime import init_ray

    os.environ.setdefault("RAY_worker_niceness", "0")
    t_start = time.perf_counter()
    recs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="rayseq-async-") as tmp:
        slow_file = Path(tmp) / "slow"
        os.environ[SLOW_FILE] = str(slow_file)
        started = init_ray(min_cpus=2.0, log_to_driver=False,
                           runtime_env={"worker_process_setup_hook": straggler_hook,
                                        "env_vars": {SLOW_FILE: str(slow_file), "PYTHONPATH": os.pathsep.join(
                                            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}})
        try:
            fixtures = hf_fixture(Path(tmp) / "hf") if "gpt2" in args.cases else None
            for case in args.cases:
                spec = {**CASES[case], **(QUICK[case] if args.quick else {})}
                over = [*COMMON, *spec["overrides"], f"train.iters={spec['iters']}", f"algo.ratio_to={args.ratio_to}"]
                if case == "gpt2":
                    over += [f"task.data={fixtures / 'prepared'}", "model.arch=hf",
                             f"model.path={fixtures / 'tiny-gpt2'}"]
                for seed in args.seeds:
                    base = [*over, f"seed={seed}"]
                    if spec["pretrain"]:
                        pre = Path(tmp) / f"{case}-s{seed}-mle"
                        train([*base, "rollout.num_workers=0", f"train.pretrain_iters={spec['pretrain']}",
                               "train.iters=0"], pre)
                        base += ["train.pretrain_iters=0", f"train.init_from={pre}"]
                    else:
                        base += ["train.pretrain_iters=0"]
                    for slow in sorted({1.0, args.slow}):
                        slow_file.write_text(str(slow))
                        for k in args.ks:
                            name = f"{case}-s{seed}-x{slow:g}-k{k}"
                            iters = spec["iters"] if k == 0 else round(args.stale_iters * spec["iters"])
                            summary, rows = train([*base, f"rollout.max_staleness={k}", f"train.iters={iters}"],
                                                  Path(tmp) / name)
                            recs.append(record(case, k, slow, seed, summary, rows))
                            r = recs[-1]
                            print(f"  {name}: {r['s_per_iter'] * 1000:.0f} ms/iter, val/reward {r['start']:.3f} -> "
                                  f"{r['final']:.3f}, learner busy {r['learner_busy']:.2f}, workers busy "
                                  f"{r['workers_busy']:.2f}", file=sys.stderr, flush=True)
        finally:
            if started:
                import ray

                ray.shutdown()
    for r in recs:  # the target: 90% of the way to the synchronous run's final reward (same case, seed, straggler)
        sync = next(s for s in recs if (s["case"], s["seed"], s["slow"], s["k"]) == (r["case"], r["seed"],
                                                                                        r["slow"], 0))
        r["target"] = sync["start"] + 0.9 * (sync["final"] - sync["start"])
        r["to_target"] = time_to(r["curve"], r["target"])
        r["sync_final"] = sync["final"]
        r["iters_to_sync_final"] = time_to(r["iter_curve"], sync["final"])
    minutes = (time.perf_counter() - t_start) / 60
    text = (f"Rollouts sampled up to k updates ahead (rollout.max_staleness), GRPO (algo.ratio_to={args.ratio_to}) "
            f"on 2 Ray rollout workers, seeds "
            f"{' '.join(map(str, args.seeds))}; the straggler is worker 0 made {args.slow:g}× slower; time to "
            f"target = training seconds until the validation reward is 90% of the way from the start to the "
            f"synchronous run's final one (same seed); this run took {minutes:.1f} min on {os.cpu_count()} cores.\n\n"
            + table(recs, args))
    if args.stale_iters != 1:
        text += ("\n\nThe runs with k > 0 trained " + format(args.stale_iters, "g") + "× the synchronous run's "
                 "iterations: at which iteration each seed's validation reward first reached the synchronous run's "
                 "final one (same seed), – if it did not.\n\n" + long_table(recs, args))
    name = ("async_rollouts" + ("_proximal" if args.ratio_to == "proximal" else "")
            + ("_long" if args.stale_iters != 1 else "") + ("_quick" if args.quick else ""))
    write_report(args.out, name, text, {"runs": recs, "args": {k: str(v) for k, v in vars(args).items()}})
    plot(recs, args, args.out / f"{name}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
