"""Shared by benchmarks/seqgan_oracle.py and benchmarks/chitchat.py: pretrain once per seed, then run
every algorithm from that checkpoint (``train.init_from``), so all algorithms of a seed start from the
identical MLE model (and, for SeqGAN, the identical pretrained discriminator) and spend the same budget.

Runs are in-process (``rollout.num_workers=0``, one torch thread each), ``jobs`` processes at a time;
a finished run (its summary.json exists) is not run again unless ``fresh``.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IN_PROCESS = ["rollout.num_workers=0", "learner.torch_threads=1", "rollout.torch_threads=1", "progress=false"]


def _use_repo() -> None:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


def _train(args: list[str], run_dir: str) -> str:
    _use_repo()
    from rayseq.config import build_config
    from rayseq.distributed.driver import Trainer

    path = Path(run_dir)
    if path.exists():
        shutil.rmtree(path)
    overrides = [a for a in args if not a.startswith("--config=")] + [f"run_dir={path}"]
    Trainer(build_config(_config_data(args), overrides)).run()
    return run_dir


def _config_data(args: list[str]) -> dict:
    from rayseq.config import load_yaml

    files = [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    return load_yaml(files[0]) if files else {}


def run_all(config: str, overrides: list[str], algos: list[str], seeds: list[int], out: Path, *,
            pretrain_algo: str | None, jobs: int = 2, fresh: bool = False,
            variants: dict[str, list[str]] | None = None) -> dict[tuple[str, int], Path]:
    """Pretrain per seed into ``out/pretrain-s<seed>``, then each algorithm into ``out/<algo>-s<seed>`` (and each
    of ``variants``, label -> overrides such as ``["algo.name=ppo", "algo.kl_coef=0.1"]``, into
    ``out/<label>-s<seed>``). Returns {(algo or label, seed): run dir}; the pretrained model is (algo "mle", seed)
    for the table's MLE row. ``pretrain_algo`` None: no pretraining run, each run starts as its config says."""
    import multiprocessing

    base = [*([f"--config={config}"] if config else []), *overrides, *IN_PROCESS]  # config "": the defaults
    ctx = multiprocessing.get_context("spawn")
    dirs: dict[tuple[str, int], Path] = {}

    def pending(path: Path) -> bool:
        return fresh or not (path / "summary.json").is_file()

    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        pre = {}
        for s in seeds if pretrain_algo is not None else ():
            d = out / f"pretrain-s{s}"
            dirs[("mle", s)] = d
            if pending(d):
                args = [*base, f"seed={s}", f"algo.name={pretrain_algo}", "train.iters=0", f"name=pretrain-s{s}"]
                pre[s] = pool.submit(_train, args, str(d))
        for f in pre.values():
            f.result()
        futs = []
        runs = {a: [f"algo.name={a}"] for a in algos} | dict(variants or {})
        for s in seeds:
            for a, extra in runs.items():
                d = out / f"{a}-s{s}"
                dirs[(a, s)] = d
                if pending(d):
                    start = [f"train.init_from={out / f'pretrain-s{s}'}"] if pretrain_algo is not None else []
                    args = [*base, f"seed={s}", *extra, *start, f"name={a}-s{s}"]
                    futs.append(pool.submit(_train, args, str(d)))
        for f in futs:
            f.result()
    return dirs


def parse_args(ap, argv) -> tuple:
    """``ap.parse_known_args`` where ``key=value`` overrides may also follow ``--algos a b`` (argparse would
    take them for algorithm names); returns (args, overrides)."""
    args, overrides = ap.parse_known_args(argv)
    if getattr(args, "algos", None):
        overrides = [*overrides, *(a for a in args.algos if "=" in a)]
        args.algos = [a for a in args.algos if "=" not in a]
    return args, overrides


def load_run(run_dir: Path, metric_keys: list[str]) -> dict:
    """summary.json plus the evaluation curve (iteration, stage, metric) of ``metric_keys``."""
    import pyarrow.parquet as pq

    s = json.loads((run_dir / "summary.json").read_text())
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    curve = {k: [(r["iteration"], r[k]) for r in rows if r.get(k) is not None] for k in metric_keys}
    times = [r["time/iter_s"] for r in rows  # the algorithm's iterations (not a critic's warm-up)
             if r.get("time/iter_s") is not None and r["stage"] == "train" and not r.get("critic/warmup")]
    return {"summary": s, "curve": curve, "train_iter_s": statistics.median(times) if times else None}


def mean_std(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def plot_curves(curves: dict, path: Path, *, ylabel: str, title: str, hlines=(), markers: bool = False,
                xlabel: str = "iteration (pretraining, then the algorithm)", chosen: dict | None = None) -> None:
    """One line per run, one colour per algorithm: ``curves[algo]`` = list of [(iteration, value), ...]; ``chosen``
    (algo -> [(iteration, value), ...]) marks each run's chosen evaluation with a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for j, (algo, cs) in enumerate(curves.items()):
        for i, c in enumerate(cs):
            if c:
                x, y = zip(*c)
                ax.plot(x, y, "-o" if markers else "-", ms=3, color=f"C{j}", alpha=0.8, label=algo if i == 0 else None)
    for j, algo in enumerate(curves):
        if (chosen or {}).get(algo):
            x, y = zip(*chosen[algo])
            ax.plot(x, y, "*", ms=11, color=f"C{j}", markeredgecolor="k",
                    label="chosen on validation" if algo == next(a for a in curves if chosen.get(a)) else None)
    for y, style, label in hlines:
        ax.axhline(y, ls=style, c="gray", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
