"""Learner scaling: seconds per update and per iteration against ``learner.num_learners``.

Runs an RL stage through rayseq's real ``Trainer`` (``benchmarks/ray_overhead.py``'s ``measure``: no MLE
pretraining, every run the same work) with ``learner.num_learners`` = each of ``--learners`` and one Ray rollout
worker, and reads the per-iteration phases from the run's metrics.parquet. Cases (``--cases``):

  counting256   the counting job's PPO-dynamic stage (rayseq defaults: one minibatch per batch), batch 256
  counting2048  the same at batch 2048: 8x the rows per update, the update's share of the iteration grows
  gpt2          PPO-dynamic on a tiny local GPT-2 (``tests/hf_fixtures.make_tiny_hf``: 2 layers, 64 wide) on the
                pairs task, batch ``--hf-batch``, minibatches of ``--hf-minibatch``

Every (case, N) pair runs ``--repeats`` times, interleaved (repeat 1 of every pair, then repeat 2, ...), so load
from other users of the machine hits every N alike; a run's figures are medians over its iterations after the
first (warm-up), the table shows the median over repeats, and the ratio is to N = 1 of the same case in the same
invocation. Per row:

  update s      ``time/update_s``: rank 0's update alone (its rows' forward/backward, the all-reduces, the
                optimizer step; with N > 1 the forward passes every rank makes on the whole batch for the
                advantages too)
  learn s       ``time/learn_s``: the driver's wait for the update call (fetching the shards, the update, the
                weights published), with the sampling of the batch it waits for
  iter s        ``time/iter_s``: the whole iteration
  x update / x iter   the N = 1 time divided by this row's (> 1: faster)

Each learner reserves ``--learner-cpus`` CPUs and runs ``learner.torch_threads=1``; the worker reserves
``--worker-cpus``. Ray: an embedded Ray started once with logical CPUs = max(cores, the largest run's bundles), or
``--address auto`` to join a cluster (a machine with more cores or GPUs: ``--device cuda`` puts the learners on
GPUs, NCCL). What N buys is the update's forward and backward split over N processes; what it costs is one
all-reduce of the gradients per optimizer step, one of the metrics per update, the whole-batch forward passes
every rank repeats, and N processes where there may be fewer free cores.

Command   python benchmarks/learner_scaling.py [--learners 1 2] [--cases counting256 counting2048 gpt2]
              [--repeats 2] [--iters 6]
Writes    benchmarks/results/learner_scaling.md, .json and .png (ratio to N = 1 per case: update and iteration).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._report import write_report  # noqa: E402
from benchmarks.ray_overhead import PHASES, measure  # noqa: E402
from rayseq.config import build_config  # noqa: E402
from rayseq.distributed.groups.placement import bundles  # noqa: E402
from rayseq.distributed.runtime import init_ray  # noqa: E402

LABELS = {"counting256": "counting, PPO-dynamic, batch 256", "counting2048": "counting, PPO-dynamic, batch 2048",
          "gpt2": "pairs, PPO-dynamic, tiny GPT-2"}


def case_config(case: str, n: int, args, fixtures: Path) -> tuple[int, list[str]]:
    """(batch, overrides) of one run."""
    over = [f"learner.num_learners={n}", f"learner.num_cpus={args.learner_cpus}",
            f"rollout.num_cpus_per_worker={args.worker_cpus}", "learner.torch_threads=1"]
    if args.device == "cuda":
        over += ["learner.num_gpus=1", "learner.device=cuda"]
    if case == "gpt2":
        from benchmarks.bitwise_check import _fixtures

        corpus, hf_dir = _fixtures({"corpus", "hf"}, fixtures)
        over += ["task.name=pairs", f"task.data={corpus}", "task.test_size=100", "task.val_size=10", "model.arch=hf",
                 f"model.path={hf_dir}", "algo.name=ppo_dynamic", f"algo.minibatch_size={args.hf_minibatch}"]
        return args.hf_batch, over
    return (256 if case == "counting256" else 2048), over


def summarise(runs: list[dict]) -> dict:
    return {p: statistics.median(r["median_ms"][p] for r in runs) / 1000 for p in runs[0]["median_ms"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--learners", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cases", nargs="+", default=list(LABELS), choices=list(LABELS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--hf-batch", type=int, default=32)
    ap.add_argument("--hf-minibatch", type=int, default=16)
    ap.add_argument("--learner-cpus", type=float, default=0.5)
    ap.add_argument("--worker-cpus", type=float, default=0.5)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--address", default=None, help="join this Ray cluster (auto: the local one)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--name", default="learner_scaling")
    args = ap.parse_args(argv)
    if args.address:
        os.environ["RAY_ADDRESS"] = args.address
    fixtures = Path(tempfile.gettempdir()) / "rayseq-bitwise-fixtures"
    need = max(sum(b.get("CPU", 0) for b in bundles(build_config(None, ["rollout.num_workers=1", "algo.name=ppo",
                                                                         *case_config("counting256", n, args,
                                                                                      fixtures)[1]])))
               for n in args.learners)
    init_ray(min_cpus=need)
    import ray

    runs: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="learner-scaling-") as tmp:
        for rep in range(args.repeats):
            for case in args.cases:
                for n in args.learners:
                    batch, over = case_config(case, n, args, fixtures)
                    r = measure(1, args.iters + 1, batch, Path(tmp), overrides=over, name=f"{case}-n{n}-r{rep}",
                                phases=PHASES, skip_first=True)
                    runs.setdefault((case, n), []).append(r)
                    print(f"  {case} N={n} repeat {rep + 1}: update {r['median_ms']['time/update_s']:.0f} ms, "
                          f"iteration {r['median_ms']['time/iter_s']:.0f} ms", flush=True)
    resources = ray.cluster_resources()
    rows = []
    for case in args.cases:
        base = summarise(runs[(case, args.learners[0])])
        for n in args.learners:
            s = summarise(runs[(case, n)])
            rows.append({"case": case, "learners": n, "update_s": s["time/update_s"], "learn_s": s["time/learn_s"],
                         "iter_s": s["time/iter_s"], "update_ratio": base["time/update_s"] / s["time/update_s"],
                         "iter_ratio": base["time/iter_s"] / s["time/iter_s"], "runs": runs[(case, n)]})
    load = os.getloadavg()
    lines = [f"Learner scaling ({os.cpu_count()} cores, Ray CPUs {resources.get('CPU')}, GPUs "
             f"{resources.get('GPU', 0)}; load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; "
             f"{args.repeats} interleaved repeats, {args.iters} iterations each after one warm-up)", "",
             "| case | learners | update s | learn s | iter s | x update | x iter |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {LABELS[r['case']]} | {r['learners']} | {r['update_s']:.3f} | {r['learn_s']:.3f} | "
                     f"{r['iter_s']:.3f} | {r['update_ratio']:.2f} | {r['iter_ratio']:.2f} |")
    write_report(args.out, args.name, "\n".join(lines), {"rows": rows, "args": vars(args) | {"out": str(args.out)},
                                                         "cluster_resources": resources, "load_average": load})
    plot(rows, args, args.out / f"{args.name}.png")
    return 0


def plot(rows: list[dict], args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    width = 0.8 / len(args.learners)
    for ax, key, title in ((axes[0], "update_ratio", "update (time/update_s)"),
                           (axes[1], "iter_ratio", "iteration (time/iter_s)")):
        for j, n in enumerate(args.learners):
            vals = [next(r[key] for r in rows if r["case"] == c and r["learners"] == n) for c in args.cases]
            ax.bar([i + j * width for i in range(len(args.cases))], vals, width, label=f"N = {n}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks([i + width * (len(args.learners) - 1) / 2 for i in range(len(args.cases))])
        ax.set_xticklabels(args.cases)
        ax.set_title(f"speed-up of the {title} over N = 1")
    axes[0].set_ylabel("N = 1 time / N learners' time")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
