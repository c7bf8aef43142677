"""What Ray costs per iteration: the same RL stage in-process and with 1, 2 rollout workers.

Runs the counting task's algorithm stage (PPO-dynamic, batch 256, no MLE pretraining so every variant
does identical work) for ``--iters`` iterations with ``rollout.num_workers`` = 0 (in-process), 1, 2,
one after the other in this process's machine, and prints the median per-iteration phase times
(``time/sync_s`` weight publication, ``time/rollout_s``, ``time/learn_s``: below), the start-up
cost (Ray start, placement group, actors) and what the driver fetched per iteration (``driver/recv_bytes``: the
pickled size of everything it ray.gets; rollouts go from the workers to the learner by reference). One more row,
2 workers at ``--big-batch`` (default 4 x batch), shows that figure does not grow with the batch; ``--pipeline``
adds 2 workers with ``rollout.pipeline=true`` (sampling of the next batch overlapped with the update).

With task rewards the driver sends the update right behind the sampling calls, and the next iteration's batch right
behind the update (its sampling starts when the learner has published the new weights, while the driver logs): the
phases are then ``rollout`` the sending (0 for a batch already sent), ``learn`` the workers' sampling and the update.
``iteration`` is ``time/iter_s`` (the loop body, logging excluded); ``wall per iteration`` is the wall clock from one
logged iteration to the next (what a user waits per iteration: logging included, and the sampling that overlaps it),
and ``vs in-process`` compares that. ``update`` is ``time/update_s`` (the algorithm's update alone, on the learner),
``sampling`` ``time/sample_s`` (the slowest worker's, measured on it), and ``wall - update`` what an iteration costs
besides the update: sampling, Ray's calls and the driver. The last line sets the 2-worker row beside a bound: the
in-process wall with half its sampling (two workers share it) plus Ray's floor, two hops with no work in them
(measured here too, with nothing else running): what the row would be if the hops cost what they cost alone.

Ray starts its worker processes at nice 15; here they run at nice 0 (``RAY_worker_niceness``, as
``benchmarks/rollout_throughput.py``), like this process and the in-process rows: where other processes compete for
the cores the figures then measure Ray's calls, not the OS scheduler's preference.

``--repeats R`` runs every row R times, interleaved (repeat 1 of every row, then repeat 2), and reports the median
over repeats. ``--compare-with DIR`` also runs this script on DIR's rayseq (another checkout, e.g. the code
before a change; ``--code DIR``) after each repeat, in a subprocess, same iterations, batch and worker counts: its
rows appear as "before", measured in the same run (the machine is shared and noisy: compare rows of one run only).

Command   python benchmarks/ray_overhead.py [--iters 100] [--workers 0 1 2] [--batch 256] [--big-batch 1024]
              [--repeats 1] [--pipeline] [--compare-with /path/to/other/checkout]
Time      about 2 minutes on a 2-core machine (default settings); each repeat and --compare-with add as much.
Writes    benchmarks/results/ray_overhead.md and .json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# --code DIR (what --compare-with runs): this script's measurement on DIR's rayseq (another checkout)
if "--code" in sys.argv:
    sys.path.insert(0, sys.argv[sys.argv.index("--code") + 1])

from benchmarks._report import write_report  # noqa: E402
from rayseq.config import build_config  # noqa: E402
from rayseq.distributed.driver import Trainer  # noqa: E402

PHASES = ("time/sync_s", "time/rollout_s", "time/learn_s", "time/update_s", "time/sample_s", "time/iter_s")


def measure(n_workers: int, iters: int, batch: int, tmp: Path, *, config: dict | None = None,
            overrides: Sequence[str] = (), name: str | None = None, phases: Sequence[str] = PHASES,
            skip_first: bool = False) -> dict:
    """Run the RL stage of ``config`` (an experiment file's content; default: the counting job) without MLE
    pretraining for ``iters`` iterations with ``n_workers`` rollout workers (``overrides`` applied after these).
    Returns the median ms of each of ``phases`` the stage logs, start-up + final evaluation seconds, the median
    bytes the driver fetched per iteration (Ray runs), the last reward and the test precision. ``name``: the run
    directory under ``tmp`` (default ``w<n_workers>``); ``skip_first``: the medians leave out the first iteration.
    Also used by ``benchmarks/scaling.py`` and ``benchmarks/learner_scaling.py``."""
    run_dir = tmp / (name or f"w{n_workers}")
    cfg = build_config(config, [
        f"rollout.num_workers={n_workers}", "train.pretrain_iters=0", f"train.iters={iters}",
        f"train.batch_size={batch}", "train.eval_every=0", "progress=false", f"run_dir={run_dir}", *overrides,
    ])
    logged: list[float] = []  # when each iteration had been logged (Trainer's per-iteration callback)
    t0 = time.perf_counter()
    summary = Trainer(cfg, report=lambda row, trainer: logged.append(time.perf_counter())).run()
    wall = time.perf_counter() - t0
    rows = [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r.get("stage") == "train"]
    rows = rows[1:] if skip_first else rows  # the first iteration's start-up costs left out
    med = {p: statistics.median(r[p] for r in rows) * 1000 for p in phases if rows[0].get(p) is not None}
    # wall clock from one logged iteration to the next: time/iter_s plus the driver's logging, and with the next
    # batch sampled during that logging (it goes out behind the update) what a user waits per iteration
    med["wall"] = statistics.median(b - a for a, b in zip(logged, logged[1:])) * 1000
    loop = sum(r["time/iter_s"] for r in rows)
    recv = [r["driver/recv_bytes"] for r in rows if r.get("driver/recv_bytes") is not None]
    return {"workers": n_workers, "wall_s": wall, "setup_s": wall - loop, "median_ms": med,
            "recv_bytes": statistics.median(recv) if recv else None,
            "reward_last": rows[-1].get("rollout/reward_mean"), "precision": summary["metrics"].get("test/precision")}


def _row(label: str, runs: list[dict], base_ms: float | None) -> tuple[str, dict]:
    """One table row from the repeats of one variant: median over repeats of each run's median."""
    def med(key):
        vals = [r["median_ms"][key] for r in runs if key in r["median_ms"]]
        return statistics.median(vals) if vals else float("nan")

    iter_ms = med("wall")
    recv = [r["recv_bytes"] for r in runs if r.get("recv_bytes") is not None]
    kb = f"{statistics.median(recv) / 1024:.1f}" if recv else "-"
    ratio = f"{iter_ms / base_ms:.2f}x" if base_ms else "-"
    setup = statistics.median(r["setup_s"] for r in runs)
    outside = iter_ms - med("time/update_s")  # sampling, scoring, Ray's calls and the driver: all but the update
    line = (f"| {label} | {med('time/sync_s'):.1f} | {med('time/rollout_s'):.1f} | {med('time/learn_s'):.1f} | "
            f"{med('time/update_s'):.1f} | {med('time/sample_s'):.1f} | {med('time/iter_s'):.1f} | {iter_ms:.1f} | "
            f"{outside:.1f} | {ratio} | {kb} | {setup:.1f} |")
    return line, {"label": label, "iter_ms": iter_ms, "outside_update_ms": outside,
                  "ratio": iter_ms / base_ms if base_ms else None,
                  "driver_kb_per_iter": statistics.median(recv) / 1024 if recv else None, "runs": runs}


def _measure_other(checkout: Path, args, tmp: Path, repeat: int) -> list[dict]:
    """This script's rows measured on ``checkout``'s rayseq (``--code``), in a subprocess (its worker processes
    import that checkout too)."""
    import json
    import subprocess

    out = tmp / f"other{repeat}"
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, __file__, "--code", str(checkout), "--iters", str(args.iters), "--batch", str(args.batch),
           "--big-batch", "0", "--workers", *map(str, args.workers), "--out", str(out)]
    subprocess.run(cmd, cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL)
    rows = json.loads((out / "ray_overhead.json").read_text())["results"]
    return [run for r in rows for run in r["runs"]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--big-batch", type=int, default=None, help="batch of the extra 2-worker row (default 4 x batch; "
                   "0: no such row)")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--pipeline", action="store_true", help="one more row: 2 workers with rollout.pipeline=true")
    p.add_argument("--compare-with", type=Path, default=None)
    p.add_argument("--code", type=Path, default=None, help="measure DIR's rayseq (set by --compare-with)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args()
    os.environ.setdefault("RAY_worker_niceness", "0")  # before Ray starts; inherited by --compare-with's process
    big = 4 * args.batch if args.big_batch is None else args.big_batch
    variants = ([(n, args.batch, False) for n in args.workers] + ([(0, big, False), (2, big, False)] if big else [])
                + ([(2, args.batch, True)] if args.pipeline else []))
    runs: dict = {v: [] for v in variants}
    before: dict = {n: [] for n in args.workers}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for n, batch, pipe in variants:
                runs[(n, batch, pipe)].append(measure(
                    n, args.iters, batch, Path(tmp), name=f"w{n}b{batch}p{int(pipe)}r{rep}",
                    overrides=["rollout.pipeline=true"] if pipe else ()))
            if args.compare_with:
                for r in _measure_other(args.compare_with.resolve(), args, Path(tmp), rep):
                    before[r["workers"]].append(r)
        floor = hop_floor() if args.code is None else None
    base = _row("", runs[(args.workers[0], args.batch, False)], None)[1]["iter_ms"]
    big_base = _row("", runs[(0, big, False)], None)[1]["iter_ms"] if big and 0 in args.workers else None
    title = (f"Ray overhead, counting RL stage (PPO-dynamic, batch {args.batch}, {args.iters} iterations"
             f"{f', median of {args.repeats} interleaved repeats' if args.repeats > 1 else ''}); median ms per "
             "iteration; driver KB/iter: what the driver fetched per iteration")
    lines = [title, "",
             "| rollout workers | sync | rollout | learn | update | sampling | iteration | wall per iteration "
             "| wall - update | vs in-process | driver KB/iter | start-up + eval (s) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    rows = []
    for n, batch, pipe in variants:
        label = ("0 (in-process)" if n == 0 else str(n)) + (f", batch {batch}" if batch != args.batch else "")
        label += ", pipelined" if pipe else ""
        line, rec = _row(label, runs[(n, batch, pipe)], base if batch == args.batch else big_base)
        lines.append(line)
        rows.append({"workers": n, "batch": batch, "pipeline": pipe, **rec})
    if args.compare_with:
        before_base = _row("", before[args.workers[0]], None)[1]["iter_ms"]
        for n in args.workers:
            line, rec = _row(f"before: {'0 (in-process)' if n == 0 else n}", before[n], before_base)
            lines.append(line)
            rows.append({"workers": n, "batch": args.batch, "code": str(args.compare_with), **rec})
    if floor is not None:
        lines += ["", f"Ray's floor on this machine: the synchronous iteration's two hops with no work in them "
                  f"(learner returns {floor['weights_kb']:.0f} KB of weights -> 2 workers fetch them and return a "
                  f"shard each -> the learner fetches both), {floor['ms']:.2f} ms per iteration (median of "
                  f"{floor['iters']})"]
        two = next((r for r in rows if r["workers"] == 2 and r["batch"] == args.batch and not r.get("pipeline")
                    and "code" not in r), None)
        if two is not None and 0 in args.workers:
            local = runs[(0, args.batch, False)]
            sample = statistics.median(r["median_ms"]["time/sample_s"] for r in local)
            bound = base - sample / 2 + floor["ms"]
            floor["bound_2_workers_ms"] = bound
            lines.append(f"Bound for 2 workers: in-process {base:.1f} - half its sampling {sample / 2:.1f} + the "
                         f"floor {floor['ms']:.2f} = {bound:.1f} ms ({bound / base:.2f}x); measured "
                         f"{two['iter_ms']:.1f} ms ({two['ratio']:.2f}x): the rest is the hops under load (2 workers "
                         "sampling on the cores the learner's, the driver's and Ray's own threads need)")
    write_report(args.out, "ray_overhead", "\n".join(lines), {"results": rows, "hop_floor": floor})


def hop_floor(iters: int = 200) -> dict:
    """What the synchronous Ray iteration costs with no work in it: the learner's update returns the counting
    model's weights (its FlatWeights' size) and takes the shards of 2 workers whose next sampling call carries
    that weights ref, as the runtime chains them; median ms per iteration (embedded Ray, actors sized as the run's)."""
    import numpy as np
    import ray

    from rayseq.distributed.actors.learner import Learner
    from rayseq.distributed.runtime import init_ray

    cfg = build_config(None, ["rollout.num_workers=2"])
    nbytes = Learner(cfg).get_flat_weights().data.nbytes
    started = init_ray(min_cpus=cfg.learner.num_cpus + 2 * cfg.rollout.num_cpus_per_worker)

    class Worker:
        def sample(self, weights=None):
            if weights is not None:
                ray.get(weights[0])
            return np.ones((cfg.train.batch_size // 2, 8), np.float32)

    class Updater:
        def update(self, shards):
            ray.get(shards)
            return {"m": 1.0}, np.ones(nbytes, np.uint8)

    try:
        workers = [ray.remote(Worker).options(num_cpus=cfg.rollout.num_cpus_per_worker).remote() for _ in range(2)]
        learner = ray.remote(Updater).options(num_cpus=cfg.learner.num_cpus).remote()
        shards = [w.sample.remote() for w in workers]
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            metrics, weights = learner.update.options(num_returns=2).remote(shards)
            shards = [w.sample.remote([weights]) for w in workers]
            ray.get(metrics)
            times.append(time.perf_counter() - t0)
        ray.get(shards)
        for a in [*workers, learner]:
            ray.kill(a)
    finally:
        if started:
            ray.shutdown()
    return {"ms": statistics.median(times[iters // 10:]) * 1000, "iters": iters - iters // 10,
            "weights_kb": nbytes / 1024}


if __name__ == "__main__":
    main()
