"""RLlib's PPO as a peer: RLlib PPO against rayseq's PPO and PPO-dynamic on counting, same model, same start,
same number of sampled replies.

Run book (from the repository root)
  python benchmarks/rllib_peer.py                    # 3 seeds, all methods, one run at a time (15 min, 2 cores)
  python benchmarks/rllib_peer.py --quick            # smoke test: seed 0, 200 MLE + 4 RL iterations, *_quick files
  python benchmarks/rllib_peer.py --seeds 0 1 2 3 4 train.iters=60   # overrides apply to every method
  python benchmarks/rllib_peer.py --rllib-variants rllib_ppo         # RLlib's defaults only (no ablation)
  python benchmarks/rllib_peer.py --report-only      # redo tables and plot from the finished runs

What runs, per seed, on ``tune_configs/counting.yaml`` (rayseq's default counting config) with ``train.iters=30
train.eval_every=5``: an RL budget of 30 iterations × 256 = 7,680 sampled replies, smaller than the config's
200 × 256 (RLlib's default PPO costs seconds per iteration here; see below), the same for every method:

1. one MLE pretraining (``train.iters=0``: 1,000 iterations of 256 reference pairs), in-process;
2. rayseq PPO and rayseq PPO-dynamic from that checkpoint (``train.init_from``), in-process
   (``rollout.num_workers=0``, one torch thread; benchmarks/_compare.py): ``train.iters`` iterations of
   ``train.batch_size`` = 256 sampled replies, 1 epoch of 64-reply minibatches (4 gradient steps) each;
3. RLlib PPO (``ray.rllib.algorithms.ppo``, RLlib's new API stack: its own EnvRunners, Learner, GAE connector)
   on ``rayseq.envs`` (one token per env step) with ``rayseq.envs.rllib_module.GeneratorRLModule`` = rayseq's
   GRU generator and value baseline loaded from the same checkpoint. RLlib's default settings except
   ``train_batch_size_per_learner`` (= 256 replies × 3 tokens = 768 env steps: counting replies are always 3
   tokens), ``lr`` (= rayseq's ``algo.lr``) and ``clip_param`` (= rayseq's ε = 0.2). So: 2 EnvRunners, 30 epochs of
   128-row minibatches, GAE (γ = 0.99, λ = 1) with standardised advantages, the adaptive KL term (coefficient 0.2,
   target 0.01), value loss clipped at 10, no gradient clipping, one learning rate for generator and baseline;
4. the ablation ``rllib_ppo_rayseq_update`` (``--rllib-variants``): RLlib with rayseq's update (1 epoch of 64-reply
   = 192-step minibatches, no KL term, γ = 1), to separate RLlib's defaults from its per-token sampling path.

Same budget: RLlib counts env steps (tokens); its budget is given in episodes (= replies): it trains until it has
completed ``train.iters × train.batch_size`` episodes (``budget()``); the episodes and env steps it consumed are
recorded. Evaluation points: every ``train.eval_every × train.batch_size`` replies, as rayseq's runs.

The measure is rayseq's own: the counting task's ``evaluate`` (greedy precision: the share of correct replies).
RLlib's trained weights are loaded back into a rayseq generator and evaluated by the function rayseq's runs call
for ``val/*`` (the curves: 2,000 validation inputs) and ``test/*`` (the table: 2,000 test inputs, once at the end).
Train seconds: the sum of the iterations (sampling + update), no evaluation; RLlib's start-up (Ray, EnvRunner
actors, module build) apart. One run at a time (``--jobs 1``), so each has the machine to itself: rayseq's runs
use one core (in-process, one torch thread), RLlib's its 2 EnvRunner processes (one thread each, as Ray sets
them) and the learner in the driver, on one torch thread too (``--rllib-torch-threads 1``, rayseq's setting; 0
leaves torch's default of one per core: with another benchmark on the machine that took 60–90 s per RLlib
iteration against 6 s on one thread, the two threads waiting on each other when either is descheduled).

Time on the 2-core development machine (measured, 14.6 min in all): the MLE pretraining ~40 s per seed; rayseq's
RL runs 0.05 s per iteration (1.6 s of training each); RLlib's default PPO 5.5 s per iteration (30 epochs: 240
gradient steps on 1,024 rows, the 768 sampled steps plus the one bootstrap step GAE adds per episode; ~170 s a
run), the ablation 1.2 s per iteration (mostly sampling; ~45 s a run); RLlib's start-up ~7 s a run.
--quick: ~2 minutes.

Outputs in ``--out`` (default benchmarks/results; ``--quick`` adds ``_quick``): rllib_peer.md / .json (every
per-seed number and curve), rllib_peer.png (validation precision against sampled replies and against training
seconds); runs under runs/rllib_peer/ (rayseq run dirs; <rllib variant>-s<seed>/result.json). Finished runs are
reused (``--fresh`` reruns them): change ``--out`` when changing overrides.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._compare import REPO, load_run, mean_std, parse_args, run_all  # noqa: E402
from benchmarks._report import write_report  # noqa: E402

CONFIG = str(REPO / "tune_configs" / "counting.yaml")
RAYSEQ_ALGOS = ["ppo", "ppo_dynamic"]
BASE_OVERRIDES = ["train.iters=30", "train.eval_every=5"]
QUICK_OVERRIDES = ["train.pretrain_iters=200", "train.iters=4", "train.eval_every=2"]
# RLlib PPO variants: label -> PPOConfig.training() keys besides the matched batch, lr and clip (none: defaults).
RLLIB_VARIANTS = {
    "rllib_ppo": {},
    "rllib_ppo_rayseq_update": {"num_epochs": "algo.epochs", "minibatch_size": "algo.minibatch_size",
                                "use_kl_loss": False, "gamma": 1.0},
}
LABELS = {"mle": "MLE (pretrained, the start)", "ppo": "rayseq PPO", "ppo_dynamic": "rayseq PPO-dynamic",
          "rllib_ppo": "RLlib PPO (defaults)", "rllib_ppo_rayseq_update": "RLlib PPO, rayseq's update"}
TARGET = 0.95  # "replies / seconds to reach 95% validation precision"


# -- the budget: rayseq's replies as RLlib's episodes and env steps ---------------------------------------------
def budget(cfg, reply_len: int | None = None) -> dict:
    """RLlib's budget for rayseq config ``cfg``: ``episodes`` = train.iters × train.batch_size replies (what rayseq
    samples), ``steps_per_iter`` = one rayseq batch in env steps (train.batch_size × the reply length, when every
    reply has the same length: counting's 3 tokens; else train.batch_size × task.max_tgt_len, an upper bound),
    ``eval_episodes`` = replies between evaluations (train.eval_every batches), ``minibatch_steps`` = rayseq's
    minibatch in env steps."""
    T = int(reply_len or cfg_reply_len(cfg))
    bs = cfg.train.batch_size
    every = cfg.train.eval_every or cfg.train.iters
    return {
        "episodes": cfg.train.iters * bs,
        "steps_per_iter": bs * T,
        "eval_episodes": every * bs,
        "reply_len": T,
        "minibatch_steps": min(cfg.algo.minibatch_size or bs, bs) * T,
    }


def cfg_reply_len(cfg) -> int:
    from rayseq.registry import task_class

    cls = task_class(cfg.task.name)
    fixed = getattr(cls, "fixed_reply_length", None)
    if fixed:
        return int(fixed)
    from rayseq.tasks import make_task

    return int(make_task(cfg.task).max_tgt_len)


def rllib_training_keys(cfg, variant: str) -> dict:
    """``PPOConfig.training(**keys)`` of ``variant``: the matched batch, lr and clip, then the variant's own keys
    (a string value names a rayseq config key, e.g. ``algo.epochs``; minibatch sizes are converted to env steps)."""
    b = budget(cfg)
    keys = {"train_batch_size_per_learner": b["steps_per_iter"], "lr": cfg.algo.lr, "clip_param": cfg.algo.eps}
    for k, v in RLLIB_VARIANTS[variant].items():
        if isinstance(v, str):
            section, name = v.split(".")
            v = getattr(getattr(cfg, section), name)
            if k == "minibatch_size":
                v = b["minibatch_steps"]
        keys[k] = v
    return keys


def eval_marks(total: int, every: int) -> list[int]:
    """Episode counts at which to evaluate: every ``every`` up to ``total``, and ``total``."""
    marks = list(range(every, total, every)) if every else []
    return [*marks, total]


# -- one RLlib run (in a spawned process: its own Ray) ------------------------------------------------------------
def run_rllib(overrides: list[str], seed: int, variant: str, pretrain_dir: str, out_dir: str,
              torch_threads: int = 1) -> str:
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import ray
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module import RLModuleSpec

    from rayseq.checkpoint import load_checkpoint, resolve_checkpoint
    from rayseq.config import RunConfig, build_config, load_yaml
    from rayseq.envs import ENV_NAME, register
    from rayseq.envs.env import task_section
    from rayseq.envs.rllib_module import GeneratorRLModule
    from rayseq.models.factory import make_generator
    from rayseq.tasks import make_task

    cfg = build_config(load_yaml(CONFIG), [*overrides, f"seed={seed}", "algo.name=ppo"])
    b = budget(cfg)
    pre_cfg = RunConfig.model_validate(load_checkpoint(resolve_checkpoint(pretrain_dir))["config"])
    task = make_task(pre_cfg.task)
    evaluator = make_generator(pre_cfg, task)  # rayseq's generator: RLlib's weights are evaluated in it

    def evaluate(module, split: str) -> dict:
        evaluator.load_state_dict(module.generator.state_dict())
        return task.evaluate(evaluator, "cpu", split=split)[0]

    if torch_threads:  # the learner runs in this process (RLlib's default num_learners=0)
        torch.set_num_threads(torch_threads)
    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    register()
    keys = rllib_training_keys(cfg, variant)
    config = (
        PPOConfig()
        .environment(ENV_NAME, env_config={"task": task_section(pre_cfg.task)})
        .training(**keys)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=GeneratorRLModule,
                                               model_config={"checkpoint": str(pretrain_dir)}))
        .debugging(seed=seed)
    )
    algo = config.build_algo()
    startup_s = time.perf_counter() - t0
    rows, train_s, episodes, steps, iter_s = [], 0.0, 0, 0, []
    try:
        start = evaluate(algo.get_module(), "val")
        rows.append({"episodes": 0, "env_steps": 0, "train_s": 0.0, "val_precision": start["val/precision"]})
        marks = eval_marks(b["episodes"], b["eval_episodes"])
        iters = 0
        while episodes < b["episodes"]:
            t1 = time.perf_counter()
            r = algo.train()
            iter_s.append(time.perf_counter() - t1)
            train_s += iter_s[-1]
            iters += 1
            er, lr = r["env_runners"], r["learners"]["default_policy"]
            rows_trained = r["learners"].get("__all_modules__", {}).get("num_module_steps_trained_lifetime")
            episodes = int(er["num_episodes_lifetime"])
            steps = int(er["num_env_steps_sampled_lifetime"])
            if marks and episodes >= marks[0]:
                while marks and episodes >= marks[0]:
                    marks.pop(0)
                ev = evaluate(algo.get_module(), "val")
                rows.append({
                    "episodes": episodes, "env_steps": steps, "train_s": round(train_s, 3), "iteration": iters,
                    "val_precision": ev["val/precision"], "return_mean": er.get("episode_return_mean"),
                    "rows_trained": _scalar(rows_trained), "sample_s_smoothed": _scalar(er.get("sample")),
                    **{f"{k}_smoothed": _scalar(v) for k, v in r.get("timers", {}).items()
                       if k in ("env_runner_sampling_timer", "learner_update_timer")},
                    **{k: _scalar(lr.get(k)) for k in ("policy_loss", "vf_loss", "mean_kl_loss", "curr_kl_coeff",
                                                        "entropy", "vf_explained_var")},
                })
                print(f"[{variant} s{seed}] {episodes} episodes, {train_s:.0f} s: val precision "
                      f"{100 * ev['val/precision']:.2f}%", flush=True)
        test = evaluate(algo.get_module(), "test")
        minibatch = algo.config.minibatch_size
    finally:
        algo.stop()
        ray.shutdown()
    result = {
        "variant": variant, "seed": seed, "pretrain_dir": str(pretrain_dir), "budget": b, "training": keys,
        "episodes": episodes, "env_steps": steps, "iterations": iters, "train_s": round(train_s, 3),
        "startup_s": round(startup_s, 2), "torch_threads": torch.get_num_threads(), "curve": rows,
        "iter_s": [round(x, 4) for x in iter_s],
        "rows_trained_per_iter": (rows[-1].get("rows_trained") or 0.0) / max(iters, 1),
        "updates_per_iter": (rows[-1].get("rows_trained") or 0.0) / max(iters, 1) / minibatch,
        "test/precision": test["test/precision"], "test/precision_sampled": test["test/precision_sampled"],
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return out_dir


def _scalar(x):
    return None if x is None else float(x)


# -- rayseq's runs, read back ---------------------------------------------------------------------------------
def rayseq_result(run_dir: Path, pretrain: dict, batch_size: int) -> dict:
    """A rayseq run as an RLlib result: curve rows at its evaluations (replies sampled, training seconds)."""
    r = load_run(run_dir, ["val/precision"])
    import pyarrow.parquet as pq

    rows = [x for x in pq.read_table(run_dir / "metrics.parquet").to_pylist() if x["stage"] == "train"]
    curve, train_s = [{"episodes": 0, "train_s": 0.0, "val_precision": pretrain["val/precision"]}], 0.0
    sample_s = sum(x.get("time/rollout_s") or 0.0 for x in rows)
    learn_s = sum(x.get("time/learn_s") or 0.0 for x in rows)
    for k, x in enumerate(rows, 1):
        train_s += x["time/iter_s"]
        if x.get("val/precision") is not None:
            curve.append({"episodes": k * batch_size, "train_s": round(train_s, 3),
                          "val_precision": x["val/precision"]})
    m = r["summary"]["metrics"]
    import yaml

    epochs = yaml.safe_load((run_dir / "config.yaml").read_text())["algo"]["epochs"]
    tokens = [round(x["rollout/len_mean"] * batch_size) for x in rows]  # every reply sampled, in tokens
    return {"episodes": len(rows) * batch_size, "iterations": len(rows), "train_s": round(train_s, 3), "curve": curve,
            "sample_s": round(sample_s, 3), "learn_s": round(learn_s, 3), "env_steps": sum(tokens),
            "rows_trained_per_iter": statistics.fmean(tokens) * epochs, "iter_s": [x["time/iter_s"] for x in rows],
            "updates_per_iter": statistics.fmean(x["policy/updates"] for x in rows),
            "test/precision": m["test/precision"], "test/precision_sampled": m["test/precision_sampled"]}


def first_reaching(curve: list[dict], key: str, target: float = TARGET):
    """``key`` (episodes or train_s) at the first evaluation with validation precision >= target, else None."""
    return next((row[key] for row in curve if row["val_precision"] >= target), None)


# -- report -----------------------------------------------------------------------------------------------------
def table(results: dict, pretrain: dict, seeds: list[int]) -> str:
    """Two Markdown tables: what each method learned from the budget, and what it cost."""
    t1 = [f"| Method | Test precision, greedy (%) | Test precision, sampled (%) | Replies sampled | Env steps (tokens) "
          f"| Replies to ≥{TARGET:.0%} val |", "|" + "---|" * 6]
    t2 = [f"| Method | Train s | s per iteration: first, median | Train s to ≥{TARGET:.0%} val "
          "| Rows trained per iteration | Gradient steps per iteration | Start-up s |", "|" + "---|" * 7]
    pre = [pretrain[s] for s in seeds if s in pretrain]
    t1.append(f"| {LABELS['mle']} | {mean_std([100 * p['test/precision'] for p in pre])} "
              f"| {mean_std([100 * p['test/precision_sampled'] for p in pre])} | 0 | 0 | – |")
    for label, rs in results.items():
        rs = [rs[s] for s in seeds if s in rs]
        if not rs:
            continue
        t1.append(
            f"| {LABELS[label]} | {mean_std([100 * r['test/precision'] for r in rs])} "
            f"| {mean_std([100 * r['test/precision_sampled'] for r in rs])} "
            f"| {_range([r['episodes'] for r in rs])} | {_range([r['env_steps'] for r in rs])} "
            f"| {_reached([first_reaching(r['curve'], 'episodes') for r in rs])} |"
        )
        t2.append(
            f"| {LABELS[label]} | {mean_std([r['train_s'] for r in rs])} "
            f"| {_iter_times([r.get('iter_s') for r in rs])} "
            f"| {_reached([first_reaching(r['curve'], 'train_s') for r in rs], '.1f')} "
            f"| {statistics.fmean(r['rows_trained_per_iter'] for r in rs):.0f} "
            f"| {statistics.fmean(r['updates_per_iter'] for r in rs):.1f} "
            f"| {mean_std([r['startup_s'] for r in rs]) if 'startup_s' in rs[0] else '– (in-process)'} |"
        )
    return "\n".join(t1) + "\n\n" + "\n".join(t2)


def _iter_times(per_run: list) -> str:
    """'first, median' seconds per iteration (medians over seeds), or '–' for runs that did not record them."""
    if not per_run or any(not x for x in per_run):
        return "–"
    first = statistics.median(x[0] for x in per_run)
    return f"{first:.3f}, {statistics.median(statistics.median(x) for x in per_run):.3f}"


def _range(xs: list[int]) -> str:
    return str(xs[0]) if min(xs) == max(xs) else f"{min(xs)}–{max(xs)}"


def _reached(xs: list, spec: str = "d") -> str:
    """The median over seeds of the first point >= target; 'not reached (k/n)' when some seeds never did."""
    got = [x for x in xs if x is not None]
    if not got:
        return f"not reached (0/{len(xs)})"
    med = format(statistics.median(got), spec) if spec != "d" else str(int(statistics.median(got)))
    return med if len(got) == len(xs) else f"{med} ({len(got)}/{len(xs)} seeds)"


def plot(results: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for j, (label, rs) in enumerate(results.items()):
        for i, r in enumerate(rs.values()):
            x_e = [row["episodes"] / 1000 for row in r["curve"]]
            x_s = [row["train_s"] for row in r["curve"]]
            y = [100 * row["val_precision"] for row in r["curve"]]
            name = f"{LABELS[label]} (n={len(rs)})" if i == 0 else None
            axes[0].plot(x_e, y, "-o", ms=3, color=f"C{j}", alpha=0.8, label=name)
            axes[1].plot(x_s, y, "-o", ms=3, color=f"C{j}", alpha=0.8, label=name)
    axes[0].set_xlabel("replies sampled in the RL stage (thousands; RLlib: completed episodes)")
    axes[1].set_xlabel("training seconds (sampling + updates, no evaluation; log scale)")
    axes[1].set_xscale("symlog", linthresh=1.0)
    for ax in axes:
        ax.set_ylabel("validation precision, greedy (%)")
        ax.axhline(100 * TARGET, ls=":", c="gray")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, title="one line per seed", title_fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- main -------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/rllib_peer.py", description=__doc__.split("\n")[0],
                                 epilog="key=value arguments are rayseq config overrides (all methods read them).")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--rllib-variants", nargs="+", choices=list(RLLIB_VARIANTS), default=list(RLLIB_VARIANTS),
                    help="RLlib configurations (default: both; rllib_ppo = RLlib's defaults)")
    ap.add_argument("--rllib-torch-threads", type=int, default=1,
                    help="torch threads of RLlib's learner (the driver process); 0: torch's default (one per core). "
                         "Default 1, as rayseq's in-process learner (learner.torch_threads=1)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1: wall seconds uncontended)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--quick", action="store_true", help="seed 0 (the first of --seeds), 200 MLE + 6 RL iterations")
    ap.add_argument("--report-only", action="store_true", help="no training: the report from finished runs")
    ap.add_argument("--fresh", action="store_true", help="rerun finished runs too")
    args, user = parse_args(ap, sys.argv[1:] if argv is None else argv)
    suffix = "_quick" if args.quick else ""
    seeds = args.seeds[:1] if args.quick else args.seeds
    overrides = [*BASE_OVERRIDES, *(QUICK_OVERRIDES if args.quick else []), *user]
    runs = args.out / "runs" / f"rllib_peer{suffix}"

    from rayseq.config import build_config, load_yaml

    cfg = build_config(load_yaml(CONFIG), [*overrides, "algo.name=ppo"])  # fails early on a bad override
    b = budget(cfg)
    t_start = time.time()
    if not args.report_only:
        run_all(CONFIG, overrides, RAYSEQ_ALGOS, seeds, runs, pretrain_algo="ppo", jobs=args.jobs, fresh=args.fresh)
        ctx = multiprocessing.get_context("spawn")
        extra = {"max_tasks_per_child": 1} if sys.version_info >= (3, 11) else {}
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx, **extra) as pool:  # one Ray at a time
            for v in args.rllib_variants:
                for s in seeds:
                    d = runs / f"{v}-s{s}"
                    if args.fresh or not (d / "result.json").is_file():
                        pool.submit(run_rllib, overrides, s, v, str(runs / f"pretrain-s{s}"), str(d),
                                    args.rllib_torch_threads).result()

    pretrain, results = {}, {}
    for s in seeds:
        p = runs / f"pretrain-s{s}"
        if (p / "summary.json").is_file():
            sm = json.loads((p / "summary.json").read_text())["metrics"]
            pretrain[s] = {k: sm[k] for k in ("val/precision", "test/precision", "test/precision_sampled")}
    for a in RAYSEQ_ALGOS:
        results[a] = {s: rayseq_result(runs / f"{a}-s{s}", pretrain[s], cfg.train.batch_size)
                      for s in seeds if (runs / f"{a}-s{s}" / "summary.json").is_file() and s in pretrain}
    for v in args.rllib_variants:
        results[v] = {s: json.loads((runs / f"{v}-s{s}" / "result.json").read_text())
                      for s in seeds if (runs / f"{v}-s{s}" / "result.json").is_file()}
    if not any(results.values()):
        print("error: no finished runs", file=sys.stderr)
        return 1

    tag = " (QUICK smoke test, not a result)" if args.quick else ""
    t = table(results, pretrain, seeds)
    caption = (
        f"# RLlib's PPO as a peer on counting{tag}\n\n"
        f"Seeds {seeds}. Per seed one MLE pretraining ({cfg.train.pretrain_iters} iterations × "
        f"{cfg.train.pretrain_batch_size} pairs), then every method from that checkpoint for the same budget: "
        f"{cfg.train.iters} iterations × {cfg.train.batch_size} sampled replies = {b['episodes']} replies (RLlib: "
        f"episodes, {b['steps_per_iter']} env steps per iteration), lr {cfg.algo.lr}, clip ε {cfg.algo.eps}. "
        f"Test precision: rayseq's counting evaluation on the {cfg.task.test_size} test inputs, once at the end "
        f"(RLlib's weights loaded into a rayseq generator); mean ± std over seeds. Train s: sampling + updates, "
        f"no evaluation (s per iteration: the first, which includes warm-up, and the median); start-up (Ray, "
        f"EnvRunners, module build) apart; one run at a time on {os.cpu_count()} CPUs; RLlib's learner ran with "
        f"{_threads(results)} torch thread(s), rayseq's with one. "
        f"Replies / train s to ≥{TARGET:.0%}: the first validation evaluation (every {b['eval_episodes']} replies) "
        f"at or above it, median over seeds.\n\n"
        f"- Overrides (rayseq, all methods): `{' '.join(overrides)}` on `tune_configs/counting.yaml`\n"
        + "".join(f"- {LABELS[v]}: `PPOConfig().training({_kwargs(rllib_training_keys(cfg, v))})`, all else "
                  "RLlib's defaults\n" for v in args.rllib_variants)
        + f"\n{t}\n\nPlot: `rllib_peer{suffix}.png`."
    )
    plot(results, args.out / f"rllib_peer{suffix}.png",
         f"Counting: RLlib PPO vs rayseq PPO / PPO-dynamic from one MLE checkpoint per seed{tag}")
    payload = {"quick": args.quick, "seeds": seeds, "overrides": overrides, "config": "tune_configs/counting.yaml",
               "budget": b, "rllib_training": {v: rllib_training_keys(cfg, v) for v in args.rllib_variants},
               "pretrain": {str(s): p for s, p in pretrain.items()},
               "results": {k: {str(s): r for s, r in rs.items()} for k, rs in results.items()},
               "bench_wall_s": None if args.report_only else round(time.time() - t_start, 1)}
    write_report(args.out, f"rllib_peer{suffix}", caption, payload)
    return 0


def _threads(results: dict) -> str:
    return "/".join(sorted({str(r.get("torch_threads")) for rs in results.values() for r in rs.values()
                            if "torch_threads" in r})) or "–"


def _kwargs(d: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in d.items())


if __name__ == "__main__":
    sys.exit(main())
