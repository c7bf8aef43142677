"""The same runs in float32 and in bfloat16 (``model.dtype``), side by side: the final figures and the seconds per
iteration, to decide the default on evidence.

Two cases, in-process (``rollout.num_workers=0``, one torch thread), each run once per seed and dtype, the dtypes
interleaved within a seed (so load from other users of the machine hits both alike):

  counting   the default job's task and algorithm (PPO-dynamic on the GRU), shortened: 300 MLE + 60 RL iterations
  gpt2       GRPO with the KL penalty on a tiny local GPT-2 (tests/hf_fixtures: 2 layers, 64 wide) on the tests'
             chit-chat prompts, rewarded by reply length (the length reward, 3 words), no pretraining, 200
             iterations of 32 replies

Per row: the test set's headline figure at the start of the algorithm stage (after pretraining, for counting)
and at its end, the test replies' reward at the end, and the median ``time/iter_s``
(the iterations after the first) of the algorithm stage; the table gives the medians over seeds and bf16's ratio to
fp32 (> 1: bf16 slower).

Run book (from the repository root):

    python benchmarks/precision.py                      # 3 seeds: benchmarks/results/precision.md and .json
    python benchmarks/precision.py --seeds 0 --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

COUNTING = ["rollout.num_workers=0", "train.pretrain_iters=300", "train.iters=60", "train.eval_every=0",
            "progress=false"]
GPT2 = ["task.name=pairs", "task.test_size=100", "task.val_size=10", "algo.name=grpo", "algo.group_size=4",
        "algo.kl_coef=0.05", "algo.lr=1e-3", "train.pretrain_iters=0", "train.iters=200", "train.batch_size=32",
        "train.eval_every=0", "rollout.num_workers=0", "progress=false", "reward.fn=length",
        "reward.kwargs={target: 3}"]


def run(case: str, dtype: str, seed: int, fixtures: Path, out: Path, quick: bool) -> dict:
    import pyarrow.parquet as pq

    from rayseq.config import build_config
    from rayseq.distributed.driver import Trainer

    overrides = list(COUNTING if case == "counting" else GPT2)
    if case == "gpt2":
        overrides += [f"task.data={fixtures / 'prepared'}", "model.arch=hf", f"model.path={fixtures / 'tiny-gpt2'}"]
    if quick:
        overrides += ["train.pretrain_iters=20", "train.iters=4"]
    run_dir = out / f"{case}-{dtype}-s{seed}"
    summary = Trainer(build_config(None, [*overrides, f"model.dtype={dtype}", f"seed={seed}",
                                          f"run_dir={run_dir}"])).run()
    rows = [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    headline = "test/precision" if case == "counting" else "test/reward"
    return {"case": case, "dtype": dtype, "seed": seed, "headline": headline,
            "start": (summary.get("pretrain_metrics") or {}).get(headline),
            "figure": summary["metrics"][headline], "reward": summary["metrics"].get("test/reward"),
            "iter_s": statistics.median(r["time/iter_s"] for r in rows[1:]) if len(rows) > 1 else float("nan")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--cases", nargs="+", default=["counting", "gpt2"])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    import torch

    from benchmarks._report import write_report
    from benchmarks.learner_memory import hf_fixture

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rayseq-precision-") as tmp:
        fixtures = hf_fixture(Path(tmp) / "hf") if "gpt2" in args.cases else None
        for seed in args.seeds:
            for case in args.cases:
                for dtype in ("float32", "bfloat16"):
                    rows.append(run(case, dtype, seed, fixtures, Path(tmp) / "runs", args.quick))
                    print(rows[-1], flush=True)
    lines = ["| case | dtype | headline | at the start | at the end (median over seeds) | test reward | "
             "s / iteration | bf16 / fp32 time |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for case in args.cases:
        med = {}
        for dtype in ("float32", "bfloat16"):
            rs = [r for r in rows if r["case"] == case and r["dtype"] == dtype]
            med[dtype] = {k: statistics.median([r[k] for r in rs if r.get(k) is not None] or [float("nan")])
                          for k in ("start", "figure", "iter_s")}
            reward = [r["reward"] for r in rs if r["reward"] is not None]
            ratio = med[dtype]["iter_s"] / med["float32"]["iter_s"]
            lines.append(f"| {case} | {dtype} | {rs[0]['headline']} | {med[dtype]['start']:.4f} | "
                         f"{med[dtype]['figure']:.4f} | "
                         f"{statistics.median(reward) if reward else float('nan'):.4f} | "
                         f"{med[dtype]['iter_s']:.3f} | {ratio:.2f} |")
    table = "\n".join([f"float32 against bfloat16, {len(args.seeds)} seed(s), in-process, one torch thread:", "",
                       *lines])
    write_report(args.out, "precision" + ("_quick" if args.quick else ""), table, {"runs": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
