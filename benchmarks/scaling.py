"""Scaling: rollout throughput and iteration time against the number of rollout workers.

Runs an RL stage through rayseq's real ``Trainer`` (``benchmarks/ray_overhead.py``'s ``measure``: no MLE
pretraining, so every run does the same work) with ``rollout.num_workers`` = each of ``--workers`` and reads
the per-iteration phase times from the run's metrics.parquet. Tasks (``--tasks``):

  counting  the counting job's PPO-dynamic stage (rayseq defaults), batch ``--batch``, ``--iters`` iterations.
            Rollout phase = ``time/sample_s`` (the slowest worker's sampling and task reward, timed on the
            workers: the driver sends the update right behind the sampling calls and no longer waits for the
            rollout by itself, so ``time/rollout_s`` is only the sending).
  seqgan    SeqGAN on counting (``tune_configs/seqgan_counting.yaml``: N = 16 Monte-Carlo continuations of every
            prefix, each worker's shard scored by D on a scorer actor, then 1 d-step on 5,000 fresh negatives
            sampled by the workers), no D pretraining, ``--seqgan-iters`` iterations, as many scorers as
            workers (``--scorers``). Rollout phase = ``time/rollout_s`` + ``time/mc_total_s`` (sample Y, then
            its Monte-Carlo Q: the batch ready for the update). The d-step (``time/disc_s``) is in the iteration.

Every (task, workers) pair runs ``--repeats`` times, interleaved (repeat 1 of every pair, then repeat 2, ...) so
that load from other users of the machine hits every worker count alike; a run's figures are the medians over
its iterations, and the table shows the median over repeats. Per row:

  s / iter            median seconds per iteration (``time/iter_s``: sync + rollout + learn [+ d-step])
  rollout ms          median rollout phase (above); its throughput = batch / rollout phase (sequences per s)
  seq/s iteration     batch / seconds per iteration: the throughput of the whole training loop
  speed-up            throughput / the throughput at the smallest worker count (both phases)
  efficiency          speed-up / (workers / smallest worker count): 1.0 = linear scaling; per added worker,
                      ``marginal`` = throughput gained per added worker / the smallest count's per-worker
                      throughput (1.0: the added worker is as useful as the first; <= 0: saturated)

Ray: ``--address auto`` (or ``RAY_ADDRESS``) joins an existing cluster, so the same command measures a bigger
machine or a cluster (each run reserves one PACK placement group for its learner, workers and scorers, as a
training run); otherwise an embedded Ray is started once for all runs with logical CPUs = max(cores, the
largest run's bundles). Every worker and scorer reserves ``--cpus-per-worker`` CPUs (default 0.25: the learner's
1 + 4 workers fit 2 cores) and runs 1 torch thread; the learner 1 CPU. The header records the machine's cores
and Ray's cluster resources. On a tiny model the fixed per-iteration costs (weight sync, the learner's update,
task round trips) dominate; ``--batch`` raises the per-iteration sampling work.

On the 2-core machine (results/scaling.md, 2026-11-23): the rollout phase gains at 2 workers (counting 1.16x at
batch 256, 1.60x at batch 2048; SeqGAN's Monte-Carlo Q 1.39x) and loses again at 4 (more processes than cores);
the iteration barely moves (<= 1.09x): the single learner's update (PPO) or d-step (SeqGAN, ~1.1 of 1.3 s) is
most of it. Where it saturates: 2 workers, i.e. the cores.

Command   python benchmarks/scaling.py [--workers 1 2 4] [--tasks counting seqgan] [--repeats 3]
              [--iters 50] [--seqgan-iters 8] [--batch 256] [--cpus-per-worker 0.25] [--address auto]
          python benchmarks/scaling.py --batch 2048 --tasks counting --iters 20 --name scaling_b2048
Time      4 min 5 s on the 2-core machine (default settings, 18 runs); the batch-2048 line 2 min 5 s. Each run
          also pays ~3-11 s of actor start-up and the final test evaluation, outside the per-iteration figures.
Writes    benchmarks/results/scaling.md, .json and scaling.png (throughput and efficiency against workers);
          ``--name`` changes the file names, ``--out`` the folder.
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
sys.path.insert(0, str(ROOT))

from benchmarks._report import write_report  # noqa: E402
from benchmarks.ray_overhead import PHASES, measure  # noqa: E402
from rayseq.config import build_config  # noqa: E402
from rayseq.distributed.groups.placement import bundles  # noqa: E402
from rayseq.distributed.runtime import init_ray  # noqa: E402
from rayseq.train import load_config_data  # noqa: E402

# task -> (experiment file or None for rayseq's defaults, extra overrides, the phases making up its rollout phase)
TASKS = {
    "counting": (None, [], ("time/sample_s",)),
    # the file's schedule as the published table measured it (N = 16, 1 epoch on 5,000 negatives per d-step); the
    # file now trains D at SeqGAN's budget per d-step, which only lengthens the iteration's d-step
    "seqgan": ("tune_configs/seqgan_counting.yaml",
               ["disc.pretrain_steps=0", "algo.mc_rollouts=16", "disc.epochs=1", "disc.num_negatives=5000"],
               ("time/rollout_s", "time/mc_total_s")),
}
LABELS = {"counting": "counting, PPO-dynamic", "seqgan": "counting, SeqGAN (MC Q, N = 16)"}
RECORDED = ("time/mc_s", "time/score_s", "time/negatives_s", "time/disc_s")  # also kept in the JSON where logged


def run_config(task: str, n_workers: int, args) -> tuple[dict | None, list[str]]:
    path, extra, _ = TASKS[task]
    data = load_config_data(str(ROOT / path)) if path else None
    over = [f"rollout.num_cpus_per_worker={args.cpus_per_worker}", f"scorer.num_cpus_per_scorer={args.cpus_per_worker}",
            *extra]
    if task == "seqgan":
        over.append(f"scorer.num_scorers={n_workers if args.scorers == 'workers' else int(args.scorers)}")
    return data, over


def cpus_needed(tasks: list[str], workers: list[int], args) -> float:
    """Logical CPUs of the largest run's placement group."""
    need = 1.0
    for task in tasks:
        data, over = run_config(task, max(workers), args)
        cfg = build_config(data, [f"rollout.num_workers={max(workers)}", *over])
        need = max(need, sum(b.get("CPU", 0) for b in bundles(cfg)))
    return need


def summarise(task: str, n: int, runs: list[dict], batch: int) -> dict:
    """One row: medians over repeats of each run's per-iteration medians."""
    phases = TASKS[task][2]
    iter_ms = statistics.median(r["median_ms"]["time/iter_s"] for r in runs)
    roll_ms = statistics.median(sum(r["median_ms"].get(p, 0.0) for p in phases) for r in runs)
    return {
        "task": task, "workers": n, "repeats": len(runs), "batch": batch,
        "iter_s": iter_ms / 1000, "rollout_ms": roll_ms,
        "phase_ms": {p: statistics.median(r["median_ms"][p] for r in runs) for p in runs[0]["median_ms"]},
        "rollout_seq_per_s": batch / (roll_ms / 1000), "iter_seq_per_s": batch / (iter_ms / 1000),
        "setup_s": statistics.median(r["setup_s"] for r in runs), "runs": runs,
    }


def add_scaling(rows: list[dict]) -> None:
    """Speed-up and efficiency against the smallest worker count of the same task, and the marginal gain."""
    for kind in ("rollout", "iter"):
        prev = None
        for r in rows:
            base = rows[0]
            speedup = r[f"{kind}_seq_per_s"] / base[f"{kind}_seq_per_s"]
            r[f"{kind}_speedup"] = speedup
            r[f"{kind}_efficiency"] = speedup / (r["workers"] / base["workers"])
            if prev is None:
                r[f"{kind}_marginal"] = None
            else:
                per_worker = base[f"{kind}_seq_per_s"] / base["workers"]
                gained = r[f"{kind}_seq_per_s"] - prev[f"{kind}_seq_per_s"]
                r[f"{kind}_marginal"] = gained / (r["workers"] - prev["workers"]) / per_worker
            prev = r


def table(results: dict[str, list[dict]], header: list[str]) -> str:
    def f(x, fmt):
        return "–" if x is None else format(x, fmt)

    lines = [*header, "",
             "| task | workers | s / iter | rollout ms | rollout seq/s | speed-up | efficiency | marginal | "
             "iteration seq/s | speed-up | efficiency | marginal |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for task, rows in results.items():
        for r in rows:
            lines.append(
                f"| {LABELS[task]} | {r['workers']} | {r['iter_s']:.3f} | {r['rollout_ms']:.1f} | "
                f"{r['rollout_seq_per_s']:,.0f} | {r['rollout_speedup']:.2f}x | {r['rollout_efficiency']:.2f} | "
                f"{f(r['rollout_marginal'], '.2f')} | {r['iter_seq_per_s']:,.0f} | {r['iter_speedup']:.2f}x | "
                f"{r['iter_efficiency']:.2f} | {f(r['iter_marginal'], '.2f')} |"
            )
    return "\n".join(lines)


def plot(results: dict[str, list[dict]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.8))
    for i, (task, rows) in enumerate(results.items()):
        w = [r["workers"] for r in rows]
        color = f"C{i}"
        for kind, style, what in (("rollout", "-o", "rollout phase"), ("iter", "--s", "whole iteration")):
            ax1.plot(w, [r[f"{kind}_seq_per_s"] for r in rows], style, color=color, label=f"{LABELS[task]}: {what}")
            ax2.plot(w, [r[f"{kind}_efficiency"] for r in rows], style, color=color,
                     label=f"{LABELS[task]}: {what}")
        ax1.plot(w, [rows[0]["rollout_seq_per_s"] * n / w[0] for n in w], ":", color=color, lw=1,
                 label=f"{LABELS[task]}: rollout, linear")
    workers = sorted({r["workers"] for rows in results.values() for r in rows})
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(workers, [str(n) for n in workers])
        ax.set_xlabel("rollout workers")
        ax.grid(alpha=0.3)
    ax1.set_yscale("log")
    ax1.set_ylabel("sequences per second")
    ax1.set_title("throughput")
    ax2.axhline(1.0, color="grey", lw=1, ls=":")
    top = max(r[f"{k}_efficiency"] for rows in results.values() for r in rows for k in ("rollout", "iter"))
    ax2.set_ylim(0, max(1.2, top + 0.1))
    ax2.set_ylabel("parallel efficiency (speed-up / workers)")
    ax2.set_title("efficiency")
    fig.legend(*ax1.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.06 + 0.025 * len(results), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iters", type=int, default=50, help="iterations per counting run")
    p.add_argument("--seqgan-iters", type=int, default=8, help="iterations per SeqGAN run")
    p.add_argument("--batch", type=int, default=256, help="sequences per iteration (train.batch_size)")
    p.add_argument("--cpus-per-worker", type=float, default=0.25, help="logical CPUs per rollout worker / scorer")
    p.add_argument("--scorers", default="workers",
                   help="SeqGAN scorer actors: a number, or 'workers' (default: as many as rollout workers)")
    p.add_argument("--address", default=None, help="join this Ray cluster (e.g. auto); default: RAY_ADDRESS, "
                                                   "else an embedded Ray")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--name", default="scaling")
    args = p.parse_args()
    workers = sorted(set(args.workers))
    if workers[0] < 1:
        p.error("--workers: counts of 1 or more (0 = in-process is benchmarks/ray_overhead.py's)")
    if args.address:
        os.environ["RAY_ADDRESS"] = args.address
    import ray

    t_start = time.perf_counter()
    need = cpus_needed(args.tasks, workers, args)
    init_ray(min_cpus=need)
    resources = {k: v for k, v in ray.cluster_resources().items() if not k.startswith("node:")}
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    joined = os.environ.get("RAY_ADDRESS")
    runs: dict[tuple[str, int], list[dict]] = {(t, n): [] for t in args.tasks for n in workers}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(args.repeats):
                for task in args.tasks:
                    iters = args.iters if task == "counting" else args.seqgan_iters
                    phases = (*PHASES, *(ph for ph in TASKS[task][2] if ph not in PHASES), *RECORDED)
                    for n in workers:
                        data, over = run_config(task, n, args)
                        r = measure(n, iters, args.batch, Path(tmp), config=data, overrides=over,
                                    name=f"{task}-w{n}-r{rep}", phases=phases)
                        runs[(task, n)].append(r)
                        print(f"[{time.perf_counter() - t_start:6.1f}s] {task} workers={n} repeat={rep + 1}: "
                              f"{r['median_ms']['time/iter_s']:.1f} ms/iter", flush=True)
    finally:
        ray.shutdown()
    wall = time.perf_counter() - t_start
    results: dict[str, list[dict]] = {}
    for task in args.tasks:
        iters = args.iters if task == "counting" else args.seqgan_iters
        results[task] = [summarise(task, n, runs[(task, n)], args.batch) for n in workers]
        add_scaling(results[task])
        for r in results[task]:
            r["iters"] = iters
    ray_desc = (f"joined {joined}" if joined else "embedded") + f", {nodes} node(s), resources " + ", ".join(
        f"{k} {v:g}" if k in ("CPU", "GPU") else f"{k} {v / 2**30:.1f} GiB" if "memory" in k else f"{k} {v:g}"
        for k, v in sorted(resources.items()))
    iters_desc = ", ".join(f"{t} {args.iters if t == 'counting' else args.seqgan_iters}" for t in args.tasks)
    header = [
        f"Scaling with rollout workers: batch {args.batch}, iterations per run: {iters_desc}; {args.repeats} "
        f"repeat(s) per row, interleaved; medians",
        "",
        f"Machine: {os.cpu_count()} CPU cores. Ray: {ray_desc}. Each worker / scorer reserves "
        f"{args.cpus_per_worker:g} CPU, the learner 1; 1 torch thread each"
        + (f"; SeqGAN scorers: {'as many as workers' if args.scorers == 'workers' else args.scorers}"
           if "seqgan" in args.tasks else "") + f". Whole benchmark: {wall:.0f} s.",
    ]
    text = table(results, header)
    write_report(args.out, args.name, text, {
        "workers": workers, "tasks": args.tasks, "batch": args.batch, "iters": args.iters,
        "seqgan_iters": args.seqgan_iters, "repeats": args.repeats, "cpus_per_worker": args.cpus_per_worker,
        "scorers": args.scorers,
        "ray": {"mode": f"joined {joined}" if joined else "embedded", "nodes": nodes, "resources": resources},
        "wall_s": wall, "results": results,
    })
    plot(results, args.out / f"{args.name}.png", header[0])


if __name__ == "__main__":
    main()
