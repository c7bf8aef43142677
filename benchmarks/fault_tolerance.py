"""What failures cost: a checkpoint, a rollout-worker restart, and a resume.

1. Runs the default counting job's RL stage (GRU 128, PPO-dynamic, batch 256) on ``--workers`` Ray
   rollout workers with a checkpoint every ``--checkpoint-every`` iterations, and ``kill -9``s a
   worker's process at iteration ``--kill-at``. Reports the median iteration time, the time of the
   iteration that lost its worker (Ray restarts the actor, it reloads the weights, its shard is re-sent),
   the median checkpoint write time and size.
2. Resumes a copy of the run from its last checkpoint (in-process) and reports the time from process
   start to the first resumed iteration.

Command   python benchmarks/fault_tolerance.py [--iters 60] [--workers 2] [--kill-at 30]
Time      about 1 minute on a 2-core machine.
Writes    benchmarks/results/fault_tolerance.md and .json
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._report import write_report  # noqa: E402
from rayseq.checkpoint import list_checkpoints  # noqa: E402
from rayseq.config import build_config  # noqa: E402
from rayseq.distributed.driver import Trainer  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=60)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--kill-at", type=int, default=30)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="rayseq-ft-"))
    run_dir = tmp / "run"
    overrides = [f"rollout.num_workers={args.workers}", "train.pretrain_iters=0", f"train.iters={args.iters}",
                 "train.eval_every=0", f"train.checkpoint_every={args.checkpoint_every}",
                 "train.keep_checkpoints=100", "progress=false"]
    killed: dict = {}

    def kill_worker(row, trainer):
        if row["iteration"] == args.kill_at - 1 and not killed:
            pid = trainer.groups.rollout.stats()[0]["pid"]
            os.kill(pid, signal.SIGKILL)
            killed["pid"] = pid

    Trainer(build_config(None, [*overrides, f"run_dir={run_dir}"]), report=kill_worker).run()
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    iter_ms = [r["time/iter_s"] * 1000 for r in rows]
    restart_row = next(r for r in rows if r["rollout/worker_restarts"] > 0)
    ckpt_ms = [r["time/checkpoint_s"] * 1000 for r in rows if r.get("time/checkpoint_s")]
    sizes = [os.path.getsize(c) for c in list_checkpoints(run_dir)]

    # resume: a fresh process continuing from the checkpoint before the end
    last = list_checkpoints(run_dir)[-2]
    resume_dir = tmp / "resume"
    (resume_dir / "checkpoints").mkdir(parents=True)
    os.link(last, resume_dir / "checkpoints" / Path(last).name)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "rayseq.train", *overrides, "rollout.num_workers=0",
                        f"run_dir={resume_dir}", "--resume"], cwd=ROOT, capture_output=True, text=True)
    resume_total = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-2000:]
    resumed_rows = pq.read_table(resume_dir / "metrics.parquet").to_pylist()
    loop_s = sum(x["time/iter_s"] for x in resumed_rows[-args.checkpoint_every:])

    result = {
        "iteration_ms_median": statistics.median(iter_ms),
        "restart_iteration_ms": restart_row["time/iter_s"] * 1000,
        "restart_extra_ms": restart_row["time/iter_s"] * 1000 - statistics.median(iter_ms),
        "restarts": restart_row["rollout/worker_restarts"],
        "iterations_completed": len(rows),
        "checkpoint_ms_median": statistics.median(ckpt_ms),
        "checkpoint_bytes": statistics.median(sizes),
        "resume_process_s": resume_total,
        "resume_overhead_s": resume_total - loop_s,
    }
    table = "\n".join([
        f"Failure costs, counting RL stage (GRU 128, batch 256, {args.workers} Ray rollout workers)",
        "",
        "| what | measured |",
        "| --- | --- |",
        f"| median iteration | {result['iteration_ms_median']:.0f} ms |",
        f"| iteration that lost a worker (kill -9, Ray restart, weights reload, shard re-sent) | "
        f"{result['restart_iteration_ms']:.0f} ms (+{result['restart_extra_ms']:.0f} ms) |",
        f"| iterations completed / planned | {result['iterations_completed']} / {args.iters} |",
        f"| checkpoint write (median) | {result['checkpoint_ms_median']:.1f} ms, "
        f"{result['checkpoint_bytes'] / 1e6:.2f} MB |",
        f"| resume: new process to end of {args.checkpoint_every} resumed iterations, minus those iterations "
        f"(in-process) | {result['resume_overhead_s']:.1f} s |",
    ])
    write_report(args.out, "fault_tolerance", table, {"result": result})

if __name__ == "__main__":
    main()
