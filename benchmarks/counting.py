"""Counting benchmark: MLE, REINFORCE, MIXER, PPO and PPO-dynamic against Tuan et al. (2018) Table 1.

Reproduces the synthetic counting experiment of Tuan, Zhang, Li & Lee, "Proximal Policy Optimization
and its Dynamic Version for Sequence Generation" (2018): Sec. 5.1, Table 1 (precision), Fig. 1
(learning curves), Fig. 2 (distribution of the first output y1 at N = 5) and Supplement D, Table 1
(mean variance of the y1 distribution per input length N). Settings of Supplement C: 1-layer GRU of
128 units; PPO ε = 0.2; PPO-dynamic α1 = β1 = ∞, α2 = β2 = 1.0.

Run book (from the repository root)
  python benchmarks/counting.py                      # 5 algorithms x 3 seeds, 2 runs at a time
  python benchmarks/counting.py --quick              # smoke test: 1 seed, short budget, *_quick files
  python benchmarks/counting.py --algos ppo ppo_dynamic --seeds 0 1 2 3 4 train.iters=400
  python benchmarks/counting.py --report-only        # redo tables and plots from the existing runs
  python benchmarks/counting.py --config tune_configs/seqgan_counting.yaml --pretrain-once \
      --algos seqgan seqgan_ppo seqgan_ppo_dynamic --out benchmarks/results/counting_seqgan \
      --notes benchmarks/results/counting_seqgan/FINDINGS.md      # Table 1's SeqGAN block (its YAML's header)
A run whose directory already holds a finished run of the same resolved config is kept, not rerun (--fresh reruns
everything): an interrupted benchmark, or one given more --algos or --seeds, trains only what is missing or changed.
The check compares configs, not code: after changing training code, pass --fresh.

Time on the 2-core development machine (--jobs 2, in-process runs): one default run takes ~1-1.5 min
(1,000 MLE iterations at ~0.03 s, 200 algorithm iterations at ~0.1 s, 48 evaluations at ~0.4 s), so
the 15 default runs take ~10-12 min; --quick (5 runs of 200 + 40 iterations) takes ~1 min.
Results are deterministic: the same command on the same machine gives the same numbers.

Same budget: every run of one seed shares the same MLE pretraining (``train.pretrain_iters``
iterations of ``train.pretrain_batch_size`` reference pairs, same data order and initialisation, so
the pretrained model is identical across algorithms; the report checks this), then runs
``train.iters`` iterations of the algorithm, each consuming ``train.batch_size`` inputs (sampled
rollouts; reference pairs for MLE, reference prefixes plus sampled suffixes for MIXER) and making the
algorithm's usual update (PPO: ``algo.epochs`` passes of ``algo.minibatch_size`` minibatches). All
values are the config defaults of :mod:`rayseq.config` unless overridden on the command line.

Runs are in-process (``rollout.num_workers=0``, no Ray) so the numbers measure the algorithms; each
run is its own spawned process (``--jobs`` at a time). Wall seconds are measured with ``--jobs``
runs sharing the machine.

Outputs in ``--out`` (default ``benchmarks/results``; ``--quick`` adds the suffix ``_quick``):
  counting.md                    the two tables, budget, command, machine
  counting.json                  every per-seed number, the overrides, command, date, machine
  counting_learning_curves.png   Fig. 1 analogue (val/precision against iteration)
  counting_y1_n5.png             Fig. 2 analogue (y1 distribution at N = 5)
  runs/counting/<algo>-s<seed>/  the run directories (metrics.parquet, summary.json, checkpoints)
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ALGOS = ("mle", "reinforce", "mixer", "ppo", "ppo_dynamic", "mixer_ppo", "mixer_ppo_dynamic")
ALGOS = (*DEFAULT_ALGOS, "seqgan", "seqgan_ppo", "seqgan_ppo_dynamic", "grpo", "rloo", "grpo_dynamic")
LABELS = {"mle": "MLE", "reinforce": "REINFORCE", "mixer": "MIXER", "ppo": "PPO", "ppo_dynamic": "PPO-dynamic",
          "mixer_ppo": "MIXER-PPO", "mixer_ppo_dynamic": "MIXER-PPO-dynamic", "grpo": "GRPO", "rloo": "RLOO",
          "grpo_dynamic": "GRPO-dynamic",
          "seqgan": "SeqGAN", "seqgan_ppo": "SeqGAN-PPO", "seqgan_ppo_dynamic": "SeqGAN-PPO-dynamic"}
# Tuan et al. (2018) Table 1, precision (%): the upper block (REINFORCE, PPO, PPO-dynamic), the middle one
# (MIXER original, with PPO, with PPO-dynamic) and the lower one (SeqGAN with the policy gradient, PPO, PPO-dynamic).
PAPER_PRECISION = {"mle": 87.01, "reinforce": 98.61, "mixer": 98.43, "ppo": 98.42, "ppo_dynamic": 98.62,
                   "mixer_ppo": 98.39, "mixer_ppo_dynamic": 98.42,
                   "seqgan": 87.37, "seqgan_ppo": 87.24, "seqgan_ppo_dynamic": 91.85}
# Tuan et al. (2018) Supplement D, Table 1: mean variance of the y1 distribution, N = 1..9.
PAPER_Y1_VAR = {
    "reinforce": [0.066, 0.064, 0.066, 0.066, 0.066, 0.066, 0.066, 0.066, 0.066],
    "ppo_dynamic": [0.090, 0.076, 0.029, 0.018, 0.014, 0.012, 0.011, 0.011, 0.010],
}
VAR_LENGTHS = range(1, 10)
# Every run: in-process, no progress bar. The paper's settings (PPO ε = 0.2; PPO-dynamic α1 = β1 = ∞,
# α2 = β2 = 1) are the defaults, resolved into each run's config.yaml (keys an algorithm does not read are
# refused, so they are not repeated for every algorithm here).
BASE_OVERRIDES = [
    "task.name=counting",
    "rollout.num_workers=0",
    "progress=false",
]
QUICK_OVERRIDES = ["train.pretrain_iters=200", "train.iters=40"]
PER_RUN_KEYS = ("algo.name", "seed", "run_dir", "name")  # set by this script for each run


def _use_repo() -> None:
    """Make ``import rayseq`` work without installing the package (also in spawned workers)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


# -- one run (in a spawned worker process) ----------------------------------------------------------
def run_overrides(overrides: list[str], algo: str, seed: int, run_dir: Path) -> list[str]:
    return [*overrides, f"algo.name={algo}", f"seed={seed}", f"run_dir={run_dir}", f"name=counting-{algo}-s{seed}"]


def _config_data(path: str | None) -> dict | None:
    """The experiment YAML's content (``--config``), or None."""
    from rayseq.config import load_yaml

    return load_yaml(path) if path else None


def resolved_for(algo: str, overrides: list[str], config: str | None = None):
    """The config ``algo``'s runs resolve to under ``overrides`` (its own defaults and per-algorithm keys applied)."""
    from rayseq.config import build_config

    return build_config(_config_data(config), [*overrides, f"algo.name={algo}"])


def run_config(overrides: list[str], algo: str, seed: int, run_dir: Path, config: str | None = None):
    """The config of one (algorithm, seed) run into ``run_dir``: what it trains with and writes to config.yaml."""
    from rayseq.config import build_config

    return build_config(_config_data(config), run_overrides(overrides, algo, seed, run_dir))


def _finished_as(run_dir: Path, config: str | None, overrides: list[str], algo: str, seed: int) -> bool:
    """``run_dir`` holds a finished run of exactly this config (kept, not rerun, unless --fresh)."""
    import yaml

    from rayseq.config import config_to_dict

    if not (run_dir / "summary.json").exists():
        return False
    want = config_to_dict(run_config(overrides, algo, seed, run_dir, config))
    return yaml.safe_load((run_dir / "config.yaml").read_text()) == want


def kept_runs(jobs: list, per_seed: dict, pretrain_todo: list[int], config: str | None, fresh: bool) -> list:
    """The ``(algo, seed, run_dir)`` jobs not to rerun: an interrupted or extended benchmark trains only what is
    missing or changed. None with ``fresh``; none of a seed pretrained anew (its runs started from the old model)."""
    if fresh:
        return []
    return [(a, s, d) for a, s, d in jobs if s not in pretrain_todo and _finished_as(d, config, per_seed[s], a, s)]


def run_one(overrides: list[str], algo: str, seed: int, run_dir: str, config: str | None = None) -> str:
    """Trains one (algorithm, seed) from scratch into ``run_dir`` (``config``: an experiment YAML under the
    overrides); returns ``run_dir``."""
    _use_repo()
    from rayseq.distributed.driver import Trainer

    path = Path(run_dir)
    if path.exists():
        shutil.rmtree(path)
    Trainer(run_config(overrides, algo, seed, path, config)).run()
    return run_dir


def collect(run_dir: Path, algo: str, seed: int) -> dict:
    """The numbers of one finished run, from its summary.json and metrics.parquet."""
    import pyarrow.parquet as pq

    s = json.loads((run_dir / "summary.json").read_text())
    m, pre = s["metrics"], s["pretrain_metrics"]
    # the curve: validation precision during training; the figures: the test set's, once at the end
    table = pq.read_table(run_dir / "metrics.parquet", columns=["stage", "iteration", "val/precision"])
    curve = [
        (r["stage"], r["iteration"], r["val/precision"]) for r in table.to_pylist() if r["val/precision"] is not None
    ]
    if "val/precision" in pre and not any(c[0] == "mle" for c in curve):  # started from another run (init_from):
        import yaml  # its curve starts at the pretrained model's validation precision, where the stage starts

        start = s["iterations"] - yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["iters"]
        curve.insert(0, ("start", start, pre["val/precision"]))
    return {
        "algo": algo,
        "seed": seed,
        "run_dir": str(run_dir),
        "precision": m["test/precision"],
        "precision_sampled": m["test/precision_sampled"],
        "val_precision": m["val/precision"],
        "y1_tv": m["test/y1_tv"],
        "y1_tv_n5": m.get("test/y1_tv_n5"),
        "y1_tv_per_n": {n: m[f"test/y1_tv_n{n}"] for n in range(1, 11) if f"test/y1_tv_n{n}" in m},
        "y1_var_per_n": {n: m[f"test/y1_var_n{n}"] for n in range(1, 11) if f"test/y1_var_n{n}" in m},
        "pretrain_precision": pre["test/precision"],
        "pretrain_precision_sampled": pre["test/precision_sampled"],
        "pretrain_y1_tv": pre["test/y1_tv"],
        "y1_dist": {int(n): d for n, d in s["details"]["y1_dist"].items()},
        "y1_truth": {int(n): d for n, d in s["details"]["y1_truth"].items()},
        "wall_s": s["wall_s"],
        "iterations": s["iterations"],
        "curve": {
            "stage": [c[0] for c in curve],
            "iteration": [c[1] for c in curve],
            "precision": [c[2] for c in curve],
        },
    }


# -- statistics and tables ----------------------------------------------------------------------------
def mean_std(xs: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single seed)."""
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else None)


def fmt(xs: list[float], scale: float = 1.0, digits: int = 2) -> str:
    if not xs:
        return "–"
    mu, sd = mean_std([x * scale for x in xs])
    return f"{mu:.{digits}f}" if sd is None else f"{mu:.{digits}f} ± {sd:.{digits}f}"


def summarize(runs: list[dict], algos: list[str]) -> dict:
    """Per algorithm: the per-seed lists and their aggregates (precision in %)."""
    out = {}
    for a in algos:
        rs = sorted((r for r in runs if r["algo"] == a), key=lambda r: r["seed"])
        if not rs:
            continue

        def col(key, rs=rs):
            return [r[key] for r in rs if r[key] is not None]

        prec = [round(100 * x, 4) for x in col("precision")]  # float32 metrics: 4 decimals are exact
        out[a] = {
            "seeds": [r["seed"] for r in rs],
            "precision_pct": prec,
            "precision_pct_mean": statistics.fmean(prec),
            "precision_pct_std": mean_std(prec)[1],
            "precision_sampled_pct": [round(100 * x, 4) for x in col("precision_sampled")],
            "y1_tv": col("y1_tv"),
            "y1_tv_n5": col("y1_tv_n5"),
            "pretrain_precision_pct": [round(100 * x, 4) for x in col("pretrain_precision")],
            "wall_s": col("wall_s"),
            "wall_s_median": statistics.median(col("wall_s")),
            "y1_var_mean_per_n": {
                n: statistics.fmean(r["y1_var_per_n"][n] for r in rs)
                for n in sorted(rs[0]["y1_var_per_n"])
                if all(n in r["y1_var_per_n"] for r in rs)
            },
            "paper_precision_pct": PAPER_PRECISION.get(a),  # GRPO, RLOO: after the paper, no figure
            "diff_vs_paper_pct": (statistics.fmean(prec) - PAPER_PRECISION[a]) if a in PAPER_PRECISION else None,
        }
    return out


def pretraining_identical(runs: list[dict]) -> bool:
    """True if, for every seed, all algorithms start the algorithm stage from the same model."""
    by_seed: dict[int, set] = {}
    for r in runs:
        key = (r["pretrain_precision"], r["pretrain_precision_sampled"], r["pretrain_y1_tv"])
        by_seed.setdefault(r["seed"], set()).add(key)
    return all(len(v) == 1 for v in by_seed.values())


def precision_table(summary: dict, runs: list[dict]) -> str:
    head = (
        "| Algorithm | Precision greedy (%) | Precision sampled (%) | y1 TV, mean over N | y1 TV, N=5 "
        "| MLE-pretrained precision (%) | Wall s (median) | Paper Table 1 (%) | Ours − paper (pp) |"
    )
    lines = [head, "|" + "---|" * 9]
    for a, s in summary.items():
        rs = [r for r in runs if r["algo"] == a]
        lines.append(
            f"| {LABELS[a]} | {fmt(s['precision_pct'])} | {fmt(s['precision_sampled_pct'])} "
            f"| {fmt(s['y1_tv'], digits=3)} | {fmt(s['y1_tv_n5'], digits=3)} "
            f"| {statistics.fmean(100 * r['pretrain_precision'] for r in rs):.2f} "
            f"| {s['wall_s_median']:.0f} | {_num(s['paper_precision_pct'], '.2f')} "
            f"| {_num(s['diff_vs_paper_pct'], '+.2f')} |"
        )
    return "\n".join(lines)


def _num(x, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def variance_table(summary: dict) -> str:
    algos = list(summary)
    head = (
        "| N | truth 1/(10N) − 0.01 | "
        + " | ".join(LABELS[a] for a in algos)
        + " | paper REINFORCE | paper PPO-dynamic |"
    )
    lines = [head, "|" + "---|" * (len(algos) + 4)]
    for i, n in enumerate(VAR_LENGTHS):
        ours = [summary[a]["y1_var_mean_per_n"].get(n) for a in algos]
        cells = ["–" if v is None else f"{v:.3f}" for v in ours]
        lines.append(
            f"| {n} | {1 / (10 * n) - 0.01:.3f} | "
            + " | ".join(cells)
            + f" | {PAPER_Y1_VAR['reinforce'][i]:.3f} | {PAPER_Y1_VAR['ppo_dynamic'][i]:.3f} |"
        )
    return "\n".join(lines)


# -- plots ----------------------------------------------------------------------------------------------
COLORS = {
    "mle": "tab:gray",
    "reinforce": "tab:blue",
    "mixer": "tab:purple",
    "ppo": "tab:green",
    "ppo_dynamic": "tab:red",
    "mixer_ppo": "tab:pink",
    "mixer_ppo_dynamic": "tab:orange",
    "grpo": "darkgreen",
    "rloo": "navy",
    "grpo_dynamic": "crimson",
    "seqgan": "tab:olive",
    "seqgan_ppo": "tab:cyan",
    "seqgan_ppo_dynamic": "tab:brown",
}


def _curve_band(rs: list[dict]):
    """Iterations every seed evaluated at; mean, min and max precision (%) over seeds."""
    per_iter: dict[int, list[float]] = {}
    for r in rs:
        for it, p in zip(r["curve"]["iteration"], r["curve"]["precision"]):
            per_iter.setdefault(it, []).append(100 * p)
    its = sorted(i for i, v in per_iter.items() if len(v) == len(rs))
    return (
        its,
        [statistics.fmean(per_iter[i]) for i in its],
        [min(per_iter[i]) for i in its],
        [max(per_iter[i]) for i in its],
    )


def plot_learning_curves(runs: list[dict], algos: list[str], pretrain_iters: int, path: Path, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.4), gridspec_kw={"width_ratios": [1.2, 1]})
    for ax, zoom in zip(axes, (False, True)):
        for a in algos:
            rs = [r for r in runs if r["algo"] == a]
            if not rs:
                continue
            its, mu, lo, hi = _curve_band(rs)
            if zoom:  # the algorithm stage, starting from the pretrained model
                keep = [k for k, i in enumerate(its) if i >= pretrain_iters]
                its, mu, lo, hi = ([v[k] for k in keep] for v in (its, mu, lo, hi))
            ax.plot(its, mu, color=COLORS[a], label=f"{LABELS[a]} (n={len(rs)})", lw=1.8, marker=".", ms=4)
            ax.fill_between(its, lo, hi, color=COLORS[a], alpha=0.15, lw=0)
        ax.axvline(pretrain_iters, color="black", ls="--", lw=1)
        ax.set_xlabel("iteration (MLE pretraining, then the algorithm stage)")
        ax.set_ylabel("precision on the validation inputs, greedy (%)")
        ax.grid(alpha=0.3)
    axes[0].set_title("Whole run (dashed: end of MLE pretraining)")
    axes[1].set_title("Algorithm stage only (zoom)")
    # One legend under both panels, so it never covers a curve.
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="lower center",
        ncol=len(labels),
        fontsize=9,
        frameon=False,
        title="mean over seeds (n = seeds), band = min–max over seeds",
        title_fontsize=9,
    )
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_y1(runs: list[dict], summary: dict, path: Path, title: str, n: int = 5):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algos = [a for a in summary if any(n in r["y1_dist"] for r in runs if r["algo"] == a)]
    truth = next(r["y1_truth"][n] for r in runs if n in r["y1_truth"])
    series = []
    for a in algos:
        dists = [r["y1_dist"][n] for r in runs if r["algo"] == a]
        mean = [statistics.fmean(d[k] for d in dists) for k in range(10)]
        series.append((f"{LABELS[a]} (TV {statistics.fmean(summary[a]['y1_tv_n5']):.3f})", mean, COLORS[a]))
    series.append(("ground truth", truth, "gold"))
    fig, ax = plt.subplots(figsize=(13, 4.8))
    width = 0.8 / len(series)
    for j, (label, dist, color) in enumerate(series):
        xs = [k - 0.4 + width * (j + 0.5) for k in range(10)]
        ax.bar(xs, dist, width, label=label, color=color, edgecolor="black", lw=0.4)
    ax.set_xticks(range(10))
    ax.set_xlabel("first output y1 (digit)")
    ax.set_ylabel(f"mean probability over test inputs of length N={n}")
    ax.set_title(title)
    ax.set_ylim(0, max(max(d) for _, d, _ in series) * 1.1)
    ax.grid(axis="y", alpha=0.3)
    # Outside the axes: which digits carry mass depends on the run, so no corner is safe.
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=9, title="mean over seeds\n(TV to the truth)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- report ---------------------------------------------------------------------------------------------
def machine_info() -> dict:
    def version(pkg):
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = None, None
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch": version("torch"),
        "numpy": version("numpy"),
        "git_commit": commit,
        "git_dirty": dirty,
    }


def json_safe(obj):
    """Strict JSON: ∞ becomes the string "inf", NaN becomes null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _setting(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def resolved_settings(runs: list[dict], algos: list[str], overrides: list[str], config: str | None = None) -> list[str]:
    """One line per algorithm: the ``algo:`` keys (and ``disc:`` for the SeqGAN family) of its runs' config.yaml,
    i.e. the resolved config its learner used (the algorithm's own defaults, such as SeqGAN-PPO-dynamic's bounds of
    Supplement C, and every override), flagged when its seeds disagree. Without a config.yaml (runs deleted): the
    config ``overrides`` resolve to for that algorithm, which is what config.yaml holds."""
    import yaml

    from rayseq.config import config_to_dict

    lines = []
    for a in algos:
        sections = []
        for r in runs:
            path = Path(r["run_dir"]) / "config.yaml"
            path = path if path.is_absolute() or path.exists() else REPO / path
            if r["algo"] == a and path.exists():
                c = yaml.safe_load(path.read_text())
                sections.append(({k: v for k, v in c["algo"].items() if k != "name"}, c.get("disc")))
        if not sections:
            c = config_to_dict(resolved_for(a, overrides, config))
            sections.append(({k: v for k, v in c["algo"].items() if k != "name"}, c.get("disc")))
        algo, disc = sections[0]
        text = ", ".join(f"{k} {_setting(v)}" for k, v in algo.items())
        if disc:
            text += "; D: " + ", ".join(f"{k} {_setting(v)}" for k, v in disc.items())
        if any(s != sections[0] for s in sections[1:]):
            text += " (NOT the same for every seed: see each run's config.yaml)"
        lines.append(f"  - {LABELS[a]}: {text}")
    return lines


def algo_lrs(algos: list[str], overrides: list[str], config: str | None = None) -> str:
    """The algorithm stage's learning rate as the runs resolve it: one value, or one per algorithm when per-algorithm
    keys (``algo.seqgan_ppo.lr=...``) make them differ."""
    lrs = {a: resolved_for(a, overrides, config).algo.lr for a in algos}
    if len(set(lrs.values())) == 1:
        return f"lr {lrs[algos[0]]}"
    return "lr " + ", ".join(f"{LABELS.get(a, a)} {v}" for a, v in lrs.items())


def write_report(args, overrides, runs, failures, suffix, quick) -> str:
    _use_repo()
    from rayseq.config import config_to_dict

    out = Path(args.out)
    algos = [a for a in args.algos if any(r["algo"] == a for r in runs)]
    # the shared settings, resolved for the first algorithm (overrides may hold keys only some algorithms read)
    cfg = resolved_for(algos[0], overrides, args.config)
    t = cfg.train
    summary = summarize(runs, algos)
    machine = machine_info()
    command = " ".join(shlex.quote(a) for a in ["python", *sys.argv])
    date = datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")
    same_pre = pretraining_identical(runs)
    budget = (
        f"MLE pretraining {t.pretrain_iters} iterations × {t.pretrain_batch_size} pairs (lr {t.pretrain_lr}), "
        f"then {t.iters} algorithm iterations × {t.batch_size} inputs ({algo_lrs(algos, overrides, args.config)}); "
        f"validation every {t.eval_every} iterations on {cfg.task.val_size} inputs (the curves); the table: "
        f"{cfg.task.test_size} test inputs, evaluated once at the end of each run"
    )
    settings = resolved_settings(runs, algos, overrides, args.config)
    seeds = sorted({r["seed"] for r in runs})
    t1 = precision_table(summary, runs)
    t2 = variance_table(summary)
    md = [
        f"# Counting benchmark{' (QUICK smoke test — not a result)' if quick else ''}",
        "",
        "Tuan et al. (2018), Sec. 5.1 / Table 1 / Fig. 1-2 / Supplement D, reproduced with `rayseq`.",
        "",
        f"- Command: `{command}`",
        f"- Date: {date}; machine: {machine['platform']}, {machine['cpu_count']} CPUs, torch "
        f"{machine['torch']}; commit {machine['git_commit']}{' (dirty)' if machine['git_dirty'] else ''}",
        f"- Seeds: {seeds}; budget per run (same for every algorithm): {budget}",
        f"- Model: GRU {cfg.model.num_layers}×{cfg.model.hidden_dim}. Settings, as each algorithm's runs resolved "
        "them (their config.yaml: what the learner used):",
        *settings,
        f"- Config file: {args.config or 'none (the defaults of rayseq.config)'}; overrides: `{' '.join(overrides)}`",
        f"- Pretrained model identical across algorithms for each seed: {'yes' if same_pre else 'NO'}",
        "",
        "## Precision (Table 1)",
        "",
        "Mean ± sample std over seeds. Precision = share of correct outputs on the test inputs (greedy "
        "decoding; sampled = temperature 1). y1 TV = total-variation distance between the model's mean "
        "distribution of the first output and the uniform truth over 0..N−1. Wall time includes "
        + ("evaluation, not pretraining (--pretrain-once: each seed pretrained once, every algorithm started from it)"
           if getattr(args, "pretrain_once", False) else "pretraining and evaluation")
        + ", measured with runs sharing the machine.",
        "",
        t1,
        "",
        "## Mean variance of the y1 distribution (Supplement D, Table 1)",
        "",
        "Variance over the 10 digit probabilities of the first output, averaged over test inputs "
        "of length N, then over seeds. One-hot = 0.090; the uniform truth = 1/(10N) − 0.01.",
        "",
        t2,
        "",
        f"Plots: `counting{suffix}_learning_curves.png` (Fig. 1), `counting{suffix}_y1_n5.png` (Fig. 2).",
    ]
    if getattr(args, "notes", None):  # the findings, written by hand beside the report: linked, not copied
        link = os.path.relpath(Path(args.notes).resolve(), Path(args.out).resolve()).replace(os.sep, "/")
        md += ["", f"Findings: [{Path(args.notes).name}]({link})"]
    if failures:
        md += ["", "## Failed runs", ""] + [f"- {f['algo']} seed {f['seed']}: {f['error']}" for f in failures]
    (out / f"counting{suffix}.md").write_text("\n".join(md) + "\n")

    shared = config_to_dict(cfg)
    for key in ("seed", "name", "run_dir"):
        shared.pop(key, None)
    shared["algo"].pop("name", None)
    report = {
        "benchmark": "counting",
        "paper": "Tuan et al. 2018, Proximal Policy Optimization and its Dynamic Version for Sequence Generation",
        "quick": quick,
        "command": command,
        "argv": sys.argv,
        "date": date,
        "machine": machine,
        "overrides": overrides,
        "config_file": args.config,
        "config": shared,
        "algos": algos,
        "resolved_settings": settings,
        "seeds": seeds,
        "pretraining_identical_across_algos": same_pre,
        "paper_table1_precision_pct": PAPER_PRECISION,
        "paper_suppD_y1_var": PAPER_Y1_VAR,
        "summary": summary,
        "runs": sorted(runs, key=lambda r: (ALGOS.index(r["algo"]), r["seed"])),
        "failures": failures,
    }
    (out / f"counting{suffix}.json").write_text(json.dumps(json_safe(report), indent=1, allow_nan=False) + "\n")

    tag = " — QUICK smoke test" if quick else ""
    plot_learning_curves(
        runs,
        algos,
        t.pretrain_iters,
        out / f"counting{suffix}_learning_curves.png",
        f"Counting: precision during training (Tuan et al. 2018, Fig. 1 analogue){tag}",
    )
    plot_y1(
        runs,
        summary,
        out / f"counting{suffix}_y1_n5.png",
        f"Counting: distribution of the first output y1 for inputs of length N = 5 (Fig. 2 analogue){tag}",
    )
    return t1 + "\n\n" + t2


# -- main -----------------------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="python benchmarks/counting.py",
        description="Counting benchmark of MLE, REINFORCE, MIXER, PPO, PPO-dynamic, MIXER-PPO, MIXER-PPO-dynamic "
                    "(Tuan et al. 2018, Table 1).",
        epilog="Any key=value argument is a config override passed to every run, e.g. train.iters=400.",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default: 0 1 2)")
    p.add_argument("--algos", nargs="+", choices=ALGOS, default=list(DEFAULT_ALGOS),
                   help="algorithms (default: Table 1's upper and middle blocks; the SeqGAN ones on request)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one process each (default: 2)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="output directory")
    p.add_argument("--config", default=None,
                   help="experiment YAML every run starts from, under the overrides "
                        "(e.g. tune_configs/seqgan_counting.yaml)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: first seed only, train.pretrain_iters=200 train.iters=40, files *_quick",
    )
    p.add_argument("--report-only", action="store_true", help="no training: tables and plots from existing runs")
    p.add_argument("--fresh", action="store_true",
                   help="rerun every run; by default a run whose directory holds a finished run of the same resolved "
                        "config is kept")
    p.add_argument("--notes", default=None, help="the findings file beside the report, which the report links")
    p.add_argument("--pretrain-once", action="store_true",
                   help="pretrain once per seed (train.iters=0, the first algorithm: MLE, and D for SeqGAN) and start "
                        "every algorithm from it (train.init_from); wall times then exclude pretraining")
    # key=value tokens are taken out first: `--seeds 0 1 train.iters=5` would otherwise feed them to --seeds.
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    args = p.parse_args([a for a in argv if a not in overrides])
    bad = [o for o in overrides if o.split("=", 1)[0].strip() in PER_RUN_KEYS]
    if bad:
        p.error(f"{bad}: {', '.join(PER_RUN_KEYS)} are set per run by this script (use --algos/--seeds/--out)")
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    return args, overrides


def main(argv: list[str] | None = None) -> int:
    args, user_overrides = parse_args(sys.argv[1:] if argv is None else argv)
    _use_repo()
    from rayseq.config import ConfigError

    quick = args.quick
    suffix = "_quick" if quick else ""
    seeds = args.seeds[:1] if quick else args.seeds
    overrides = BASE_OVERRIDES + (QUICK_OVERRIDES if quick else []) + user_overrides
    out = Path(args.out)
    runs_root = out / "runs" / f"counting{suffix}"
    jobs = [(a, s, runs_root / f"{a}-s{s}") for s in seeds for a in args.algos]
    try:  # fail before starting anything on a bad override
        for a, s, d in jobs:
            run_config(overrides, a, s, d, args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)

    runs, failures = [], []
    if args.report_only:
        for a, s, d in jobs:
            if (d / "summary.json").exists():
                runs.append(collect(d, a, s))
            else:
                failures.append({"algo": a, "seed": s, "error": f"no summary.json in {d}"})
    else:
        from tqdm import tqdm

        per_seed, todo = {s: overrides for s in seeds}, []  # todo: the seeds to pretrain (--pretrain-once)
        pre, pre_overrides = {s: runs_root / f"pretrained-s{s}" for s in seeds}, [*overrides, "train.iters=0"]
        if args.pretrain_once:  # one pretraining per seed (MLE, and D for SeqGAN), every algorithm starts from it
            todo = [s for s in seeds
                    if args.fresh or not _finished_as(pre[s], args.config, pre_overrides, args.algos[0], s)]
            per_seed = {s: [*overrides, f"train.init_from={pre[s]}"] for s in seeds}
        kept = kept_runs(jobs, per_seed, todo, args.config, args.fresh)
        print(
            f"{len(jobs)} runs ({', '.join(args.algos)} × seeds {seeds}), {len(kept)} of them kept (finished, same "
            f"config), {args.jobs} at a time; overrides: {' '.join(overrides)}",
            flush=True,
        )
        for a, s, d in kept:
            runs.append(collect(d, a, s))
            print(f"kept {d} (finished, same config)", flush=True)
        extra = {"max_tasks_per_child": 1} if sys.version_info >= (3, 11) else {}  # a fresh process per run
        pool = ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"), **extra)
        try:
            for fut in [pool.submit(run_one, pre_overrides, args.algos[0], s, str(pre[s]), args.config)
                        for s in todo]:
                fut.result()
            futures = {pool.submit(run_one, per_seed[s], a, s, str(d), args.config): (a, s, d)
                       for a, s, d in jobs if (a, s, d) not in kept}
            bar = tqdm(total=len(futures), unit="run", dynamic_ncols=True, disable=None)  # None: off unless a tty
            for k, fut in enumerate(as_completed(futures), 1):
                a, s, d = futures[fut]
                try:
                    fut.result()
                    r = collect(d, a, s)
                    runs.append(r)
                    bar.write(
                        f"[{k}/{len(futures)}] {a:>11} seed {s}: precision {100 * r['precision']:6.2f}% "
                        f"(pretrained {100 * r['pretrain_precision']:.2f}%), sampled "
                        f"{100 * r['precision_sampled']:6.2f}%, y1 TV {r['y1_tv']:.3f}, {r['wall_s']:.0f} s"
                    )
                except Exception as exc:  # keep the other runs; the report lists the failure
                    tb = "".join(traceback.format_exception(exc))
                    failures.append({"algo": a, "seed": s, "error": f"{type(exc).__name__}: {exc}", "traceback": tb})
                    bar.write(f"[{k}/{len(futures)}] {a:>11} seed {s}: FAILED {type(exc).__name__}: {exc}\n{tb}")
                bar.update(1)
            bar.close()
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            print("interrupted", file=sys.stderr)
            return 130
        pool.shutdown()

    if not runs:
        print("error: no finished runs", file=sys.stderr)
        return 1
    print(write_report(args, overrides, runs, failures, suffix, quick))
    print(f"\nwrote {out}/counting{suffix}.md, .json, _learning_curves.png, _y1_n5.png")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
