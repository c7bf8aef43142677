"""What Ray costs per iteration: the same RL stage in-process and with 1, 2 rollout workers.

Runs the counting task's algorithm stage (PPO-dynamic, batch 256, no MLE pretraining so every variant
does identical work) for ``--iters`` iterations with ``rollout.num_workers`` = 0 (in-process), 1, 2,
one after the other in this process's machine, and prints the median per-iteration phase times
(``time/sync_s`` weight broadcast, ``time/rollout_s`` sampling + reward, ``time/learn_s`` update) and
the start-up cost (Ray start, placement group, actors).

Command   python benchmarks/ray_overhead.py [--iters 100] [--workers 0 1 2] [--batch 256]
Time      about 1.5 minutes on a 2-core machine.
Writes    benchmarks/results/ray_overhead.md and .json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._report import write_report  # noqa: E402
from rayseq.config import build_config  # noqa: E402
from rayseq.distributed.driver import Trainer  # noqa: E402

PHASES = ("time/sync_s", "time/rollout_s", "time/learn_s", "time/iter_s")


def measure(n_workers: int, iters: int, batch: int, tmp: Path, *, config: dict | None = None,
            overrides: Sequence[str] = (), name: str | None = None, phases: Sequence[str] = PHASES) -> dict:
    """Run the RL stage of ``config`` (an experiment file's content; default: the counting job) without MLE
    pretraining for ``iters`` iterations with ``n_workers`` rollout workers (``overrides`` applied after these).
    Returns the median ms of each of ``phases`` the stage logs, start-up + final evaluation seconds, the last
    reward and the test precision. ``name``: the run directory under ``tmp`` (default ``w<n_workers>``).
    Also used by ``benchmarks/scaling.py``."""
    run_dir = tmp / (name or f"w{n_workers}")
    cfg = build_config(config, [
        f"rollout.num_workers={n_workers}", "train.pretrain_iters=0", f"train.iters={iters}",
        f"train.batch_size={batch}", "train.eval_every=0", "progress=false", f"run_dir={run_dir}", *overrides,
    ])
    t0 = time.perf_counter()
    summary = Trainer(cfg).run()
    wall = time.perf_counter() - t0
    rows = [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r.get("stage") == "train"]
    med = {p: statistics.median(r[p] for r in rows) * 1000 for p in phases if rows[0].get(p) is not None}
    loop = sum(r["time/iter_s"] for r in rows)
    return {"workers": n_workers, "wall_s": wall, "setup_s": wall - loop, "median_ms": med,
            "reward_last": rows[-1].get("rollout/reward_mean"), "precision": summary["metrics"]["test/precision"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(n, args.iters, args.batch, Path(tmp)) for n in args.workers]
    base = results[0]["median_ms"]["time/iter_s"]
    lines = [
        f"Ray overhead, counting RL stage (PPO-dynamic, batch {args.batch}, {args.iters} iterations); "
        "median ms per iteration",
        "",
        "| rollout workers | sync | rollout | learn | iteration | vs in-process | start-up + eval (s) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        m = r["median_ms"]
        label = "0 (in-process)" if r["workers"] == 0 else str(r["workers"])
        lines.append(
            f"| {label} | {m['time/sync_s']:.1f} | {m['time/rollout_s']:.1f} | {m['time/learn_s']:.1f} | "
            f"{m['time/iter_s']:.1f} | {m['time/iter_s'] / base:.2f}x | {r['setup_s']:.1f} |"
        )
    write_report(args.out, "ray_overhead", "\n".join(lines), {"results": results})

if __name__ == "__main__":
    main()
