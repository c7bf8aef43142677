"""Synchronous against pipelined rollouts (``rollout.pipeline``): seconds per iteration and the final metric at
equal iterations, on counting and chit-chat, PPO-dynamic, 2 Ray rollout workers (+ 1 scorer actor for chit-chat's
BLEU-2 reward), seeds 0 1 2.

Per (task, seed): one in-process MLE pretraining run (``train.iters=0``), then the algorithm stage twice from its
checkpoint (``train.init_from``): ``rollout.pipeline=false`` and ``=true``, one after the other, in one embedded
Ray started once for all runs (Ray's workers at nice 0, as ``benchmarks/ray_overhead.py``). Pipelined, the workers
sample batch k+1 with the weights before update k while the learner updates on batch k (staleness 1); PPO-dynamic's
ratio uses the behaviour log-probs recorded at sampling.

Per task and mode: s / iter = median ``time/iter_s`` of a run's stage, mean over seeds; the stage's wall time; the
final validation and test metric (counting: precision; chit-chat: corpus BLEU-2 of the replies), mean ± std over
seeds; the staleness of the updates. The machine is shared and noisy: compare rows of one run.

Command   python -m rayseq.data prepare chitchat --out data/chitchat       # once: the chit-chat corpus
          python benchmarks/pipeline.py [--seeds 0 1 2] [--tasks counting chitchat] [--iters 40]
              [--pretrain-iters 300] [--batch 256] [--data data/chitchat]
Time      see results/pipeline.md (its header line records this run's wall time).
Writes    benchmarks/results/pipeline.md and .json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._report import write_report  # noqa: E402
from rayseq.config import build_config  # noqa: E402
from rayseq.distributed.driver import Trainer  # noqa: E402
from rayseq.distributed.runtime import init_ray  # noqa: E402

COMMON = ["algo.name=ppo_dynamic", "algo.lr=1e-3", "train.eval_every=0", "progress=false", "learner.num_cpus=1",
          "rollout.num_cpus_per_worker=0.5", "scorer.num_cpus_per_scorer=0.5"]
# task -> (overrides, validation / test metric)
TASKS = {
    "counting": (["task.name=counting", "task.test_size=500", "model.emb_dim=32", "model.hidden_dim=64",
                  "train.pretrain_batch_size=128"], "precision"),
    "chitchat": (["task.name=chitchat", "task.prepare=false", "task.test_size=300",
                  "task.val_size=300", "model.emb_dim=32", "model.hidden_dim=64", "train.pretrain_batch_size=128",
                  "scorer.num_scorers=1"], "bleu2"),
}


def train(overrides: list[str], run_dir: Path) -> tuple[dict, list[dict]]:
    summary = Trainer(build_config(None, [*overrides, f"run_dir={run_dir}"])).run()
    rows = [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    return summary, rows


def mean_std(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.4f} ± {statistics.stdev(xs):.4f}" if len(xs) > 1 else f"{xs[0]:.4f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--pretrain-iters", type=int, default=300)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--data", type=Path, default=ROOT / "data" / "chitchat", help="chit-chat's corpus, prepared by "
                   "python -m rayseq.data prepare chitchat --out data/chitchat")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args()
    os.environ.setdefault("RAY_worker_niceness", "0")
    t_start = time.perf_counter()
    started = init_ray(min_cpus=2.5, log_to_driver=False)
    results: dict = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for task in args.tasks:
                over, metric = TASKS[task]
                over = [*COMMON, *over, *([f"task.data={args.data}"] if task == "chitchat" else [])]
                for seed in args.seeds:
                    base = [*over, f"seed={seed}"]
                    pre = Path(tmp) / f"{task}-s{seed}-mle"
                    train([*base, "rollout.num_workers=0", f"train.pretrain_iters={args.pretrain_iters}",
                           "train.iters=0"], pre)
                    for mode in ("sync", "pipelined"):
                        run = [*base, "rollout.num_workers=2", "train.pretrain_iters=0", f"train.iters={args.iters}",
                               f"train.batch_size={args.batch}", f"train.init_from={pre}",
                               f"rollout.pipeline={str(mode == 'pipelined').lower()}"]
                        t0 = time.perf_counter()
                        summary, rows = train(run, Path(tmp) / f"{task}-s{seed}-{mode}")
                        wall = time.perf_counter() - t0
                        rec = {"seed": seed, "wall_s": wall, "stage_s": sum(r["time/iter_s"] for r in rows),
                               "s_per_iter": statistics.median(r["time/iter_s"] for r in rows),
                               "val": summary["metrics"][f"val/{metric}"], "test": summary["metrics"][f"test/{metric}"],
                               "staleness": statistics.mean(r["rollout/staleness"] for r in rows),
                               "reward_last": rows[-1]["rollout/reward_mean"]}
                        results.setdefault(task, {}).setdefault(mode, []).append(rec)
                        print(f"  {task} seed {seed} {mode}: {rec['s_per_iter'] * 1000:.0f} ms/iter, "
                              f"val/{metric} {rec['val']:.4f}", file=sys.stderr, flush=True)
    finally:
        if started:
            import ray

            ray.shutdown()
    minutes = (time.perf_counter() - t_start) / 60
    lines = [f"Synchronous against pipelined rollouts (rollout.pipeline): PPO-dynamic, 2 Ray rollout workers, "
             f"{args.iters} iterations of batch {args.batch} from an MLE model ({args.pretrain_iters} iterations), "
             f"seeds {' '.join(map(str, args.seeds))}; this run took {minutes:.1f} min on {os.cpu_count()} cores "
             "(shared)", "",
             "| task | rollouts | s / iter | stage s | vs sync | staleness | final val | final test |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for task in args.tasks:
        metric = TASKS[task][1]
        sync_s = statistics.mean(r["s_per_iter"] for r in results[task]["sync"])
        for mode in ("sync", "pipelined"):
            rs = results[task][mode]
            s = statistics.mean(r["s_per_iter"] for r in rs)
            lines.append(f"| {task} | {mode} | {s:.3f} | {statistics.mean(r['stage_s'] for r in rs):.1f} | "
                         f"{s / sync_s:.2f}x | {statistics.mean(r['staleness'] for r in rs):.2f} | "
                         f"{metric} {mean_std([r['val'] for r in rs])} | {mean_std([r['test'] for r in rs])} |")
    write_report(args.out, "pipeline", "\n".join(lines), {"results": results, "args": {
        k: str(v) for k, v in vars(args).items()}})


if __name__ == "__main__":
    main()
