"""Reward-model over-optimisation at CPU scale (Gao, Schulman & Hilton 2022, "Scaling Laws for Reward Model
Overoptimization"): proxy reward models trained on preference sets of several sizes, a policy optimised by RL
against each, the gold reward and the proxy's measured against d = √KL(π ‖ π_init), and the paper's RL form
R(d) = d(α − β log d) fitted to the gold reward's gain.

The gold reward is a function rayseq computes exactly (:func:`gold`): with p pleasant and u unpleasant words,

    gold = min(p, 3) − 1.5 · max(0, p − 3) − 2 · [u > 0],

so a reply gains 1 for each of its first three pleasant words, loses 1.5 for each one past the third (gushing) and 2
for saying anything unpleasant; its maximum, 3, is a reply with three pleasant words and no unpleasant one.
Preference pairs are two replies to one prompt, the preferred one drawn from the Bradley–Terry model of the gold
reward (P(a ≻ b) = σ(3 (g_a − g_b)), so labels are noisy near ties). In the replies of the data (:func:`reply`) more
pleasant words are better almost everywhere: 95 % of them have at most three, 5 % four and none more, so the pairs
barely show a proxy that gushing is bad and never show it five or more pleasant words. A proxy learns "more
pleasant words, fewer unpleasant ones = better" and extrapolates it off the data, where the gold falls: the paper's
mechanism (the proxy is right where its preference data lie and wrong off them, and RL pushes the policy off them).

Each proxy is ``algo.name=reward_model`` on a built-in GRU (N pairs, 80 % train, the checkpoint of best validation
accuracy kept); each policy is a GRU pretrained by MLE on replies of the same distribution, then REINFORCE with the
proxy as its reward term (``reward.terms``: the proxy with weight 1, the gold with weight 0, logged) and a small KL
penalty to the pretrained policy (``algo.kl_coef``), whose ``kl/per_reply`` (Σ_t log π/π_init over a sampled reply)
gives d per iteration. The gain of a window is its mean gold minus that of the first window (d ≈ 0.03: the
pretrained policy); the peak is the window of highest median gold.

Run book (from the repository root; one size and seed takes about half a minute on an idle CPU core, the defaults
nine of them; the three seeds may run side by side, each its own process, then --report-only for the report of all)
  python benchmarks/rm_overoptimization.py                          # N ∈ {100, 400, 1600}, seeds 0 1 2
  python benchmarks/rm_overoptimization.py --seeds 1                # one seed's runs (N ∈ {100, 400, 1600})
  python benchmarks/rm_overoptimization.py --sizes 100 1600 --seeds 0 --iters 60
  python benchmarks/rm_overoptimization.py --report-only

Outputs in ``--out`` (default benchmarks/results): rm_overoptimization.md / .json (per size: the proxy's held-out
accuracy on gold-labelled pairs beside the longer-reply baseline; gold and proxy reward and d per window of
iterations, medians over seeds; the peak's d and gain; the fitted α, β) and rm_overoptimization.png (gold and proxy
gain against d).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._report import write_report  # noqa: E402

PLEASANT = ["great", "wonderful", "lovely", "excellent", "fantastic"]
UNPLEASANT = ["awful", "terrible", "boring", "horrible", "dreadful"]
FILLER = ["it was", "honestly it was", "i think it was", "well it was really", "it was quite"]
PROMPTS = [f"{q} {t}" for q in ("how was the", "what do you think of the", "tell me about the", "did you like the")
           for t in ("movie", "food", "weather", "book", "trip", "job", "party", "game")]
N_PLEASANT_P = [0.25, 0.3, 0.25, 0.15, 0.05]  # how many pleasant words a reply of the data has: rarely four, never 5
N_UNPLEASANT_P = [0.6, 0.35, 0.05]
BEST_PLEASANT = 3  # the gold's best number of pleasant words
GUSH = 1.5  # what each pleasant word past BEST_PLEASANT costs
UNPLEASANT_COST = 2.0  # what saying anything unpleasant costs


def gold(prompts, replies, references):
    """The gold reward (module docstring), exact: a reward function of rayseq's protocol."""
    out = []
    for r in replies:
        words = r.split()
        p = sum(w in PLEASANT for w in words)
        u = sum(w in UNPLEASANT for w in words)
        out.append(float(min(p, BEST_PLEASANT) - GUSH * max(0, p - BEST_PLEASANT) - UNPLEASANT_COST * (u > 0)))
    return out


def reply(rng: np.random.Generator) -> str:
    adjs = list(rng.choice(PLEASANT, rng.choice(len(N_PLEASANT_P), p=N_PLEASANT_P))) + \
        list(rng.choice(UNPLEASANT, rng.choice(3, p=N_UNPLEASANT_P)))
    rng.shuffle(adjs)
    return " ".join([str(rng.choice(FILLER)), *(" and ".join(adjs).split() or ["fine"])])


def preference_rows(n: int, seed: int) -> list[dict]:
    """n pairs labelled by the Bradley–Terry model of the gold reward."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        p, a, b = str(rng.choice(PROMPTS)), reply(rng), reply(rng)
        ga, gb = gold(None, [a, b], None)
        if rng.random() < 1 / (1 + math.exp(-3 * (ga - gb))):
            rows.append({"prompt": p, "chosen": " " + a, "rejected": " " + b})
        else:
            rows.append({"prompt": p, "chosen": " " + b, "rejected": " " + a})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train(args: list[str]) -> dict:
    from rayseq.config import build_config
    from rayseq.distributed.driver import Trainer

    return Trainer(build_config(None, [*args, "progress=false", "rollout.num_workers=0"])).run()


def run_one(root: Path, size: int, seed: int, iters: int, kl_coef: float, lr: float) -> None:
    """The proxy RM of ``size`` pairs and the RL run against it, for ``seed`` (skipped when done)."""
    from rayseq.data.preparation import PrepareOptions, prepare

    rm, rl = root / f"rm-n{size}-s{seed}", root / f"rl-n{size}-s{seed}"
    if not (rm / "summary.json").is_file():
        data = write_jsonl(root / "data" / f"prefs-n{size}-s{seed}.jsonl", preference_rows(size, 1000 * seed + size))
        train(["task.name=preferences", f"task.data={data}", "algo.name=reward_model", "train.pretrain_iters=0",
               f"train.iters={max(40, size // 16)}", "train.batch_size=32", "algo.lr=0.003", "model.emb_dim=16",
               "model.hidden_dim=32", "train.eval_every=10", "train.best_metric=val/accuracy", f"seed={seed}",
               f"run_dir={rm}"])
    policy = root / "data" / f"policy-s{seed}"
    if not (policy / "manifest.json").is_file():
        rng = np.random.default_rng(7 + seed)
        rows = [{"prompt": str(rng.choice(PROMPTS)), "reply": reply(rng)} for _ in range(3000)]
        prepare(f"jsonl:{write_jsonl(root / 'data' / f'policy-s{seed}.jsonl', rows)}", policy,
                PrepareOptions(quiet=True, valid_frac=0.05, test_frac=0.05, seed=seed))
    if not (rl / "summary.json").is_file():
        train(["task.name=pairs", f"task.data={policy}", "task.test_size=100", "task.val_size=50",
               "model.emb_dim=16", "model.hidden_dim=32", "algo.name=reinforce", f"algo.lr={lr}",
               f"algo.kl_coef={kl_coef}", "train.pretrain_iters=150", "train.pretrain_batch_size=64",
               "train.pretrain_lr=0.01", f"train.iters={iters}", "train.batch_size=64", f"train.eval_every={iters}",
               f"seed={seed}", f"run_dir={rl}",
               f"reward.terms=[{{fn: reward_model, kwargs: {{path: '{rm / 'best'}'}}, name: proxy}}, "
               "{fn: 'benchmarks.rm_overoptimization:gold', weight: 0.0, name: gold}]"])


def curves(rl: Path, window: int) -> dict:
    """Per window of ``window`` train iterations: mean d = √KL, gold and proxy reward of the sampled replies."""
    import pyarrow.parquet as pq

    t = pq.read_table(rl / "metrics.parquet").to_pydict()
    rows = [(k, g, p) for s, k, g, p in zip(t["stage"], t["kl/per_reply"], t["reward/gold"], t["reward/proxy"])
            if s == "train" and g is not None]
    out = {"d": [], "gold": [], "proxy": []}
    for a in range(0, len(rows), window):
        part = rows[a : a + window]
        out["d"].append(math.sqrt(max(statistics.mean(r[0] for r in part), 0.0)))
        out["gold"].append(statistics.mean(r[1] for r in part))
        out["proxy"].append(statistics.mean(r[2] for r in part))
    return out


def fit_rl_form(d: np.ndarray, gain: np.ndarray) -> tuple[float, float]:
    """(α, β) of R(d) = d(α − β log d) by least squares on R/d = α − β log d over the points with d > 0."""
    keep = d > 1e-6
    A = np.stack([np.ones(keep.sum()), -np.log(d[keep])], 1)
    (alpha, beta), *_ = np.linalg.lstsq(A, gain[keep] / d[keep], rcond=None)
    return float(alpha), float(beta)


def peak(gold_curve: list[float]) -> int:
    """The window of highest gold (the first of equals): where over-optimisation starts."""
    return int(np.argmax(gold_curve))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", type=int, default=[100, 400, 1600])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--iters", type=int, default=150)
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--kl-coef", type=float, default=0.002)
    ap.add_argument("--lr", type=float, default=0.001, help="the policy's REINFORCE learning rate")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    root = args.out / "runs" / "rm_overoptimization"
    if not args.report_only:
        for size in args.sizes:
            for seed in args.seeds:
                run_one(root, size, seed, args.iters, args.kl_coef, args.lr)
    payload, lines = {"sizes": {}, "args": {k: str(v) for k, v in vars(args).items()}}, []
    lines += ["| pairs N | RM test accuracy | longer-reply baseline | window | d = √KL | gold | proxy |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    plot = {}
    for size in args.sizes:
        accs, bases, runs = [], [], []
        for seed in args.seeds:
            rm, rl = root / f"rm-n{size}-s{seed}", root / f"rl-n{size}-s{seed}"
            if not (rl / "summary.json").is_file():
                continue
            best = json.loads((rm / "summary.json").read_text())["best"]["metrics"]
            accs.append(best["test/accuracy"])
            bases.append(best["test/accuracy_longer"])
            runs.append(curves(rl, args.window))
        if not runs:
            continue
        n_win = min(len(r["d"]) for r in runs)
        med = {k: [statistics.median(r[k][w] for r in runs) for w in range(n_win)] for k in ("d", "gold", "proxy")}
        # the gain over the first window (the policy nearest the pretrained one), every seed's points
        d = np.concatenate([r["d"][:n_win] for r in runs])
        gain = np.concatenate([np.array(r["gold"][:n_win]) - r["gold"][0] for r in runs])
        alpha, beta = fit_rl_form(d, gain)
        top = peak(med["gold"])
        payload["sizes"][str(size)] = {"rm_test_accuracy": accs, "longer_baseline": bases, "median": med,
                                       "peak": {"window": top, "d": med["d"][top],
                                                "gold_gain": med["gold"][top] - med["gold"][0]},
                                       "fit": {"alpha": alpha, "beta": beta}, "runs": runs}
        plot[size] = (med, alpha, beta)
        for w in range(n_win):
            lines.append(f"| {size} | {statistics.median(accs):.3f} | {statistics.median(bases):.3f} | "
                         f"{w * args.window}-{(w + 1) * args.window - 1} | {med['d'][w]:.3f} | {med['gold'][w]:.3f} | "
                         f"{med['proxy'][w]:.3f} |")
    lines.append("")
    lines.append("| pairs N | peak window | d at the peak | gold gain at the peak | gold gain at the end | α | β | "
                 "argmax_d R(d) = e^(α/β − 1) |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for size, (med, alpha, beta) in plot.items():
        top = peak(med["gold"])
        fitted = math.exp(alpha / beta - 1) if beta > 0 else float("inf")
        lines.append(f"| {size} | {top * args.window}-{(top + 1) * args.window - 1} | {med['d'][top]:.3f} | "
                     f"{med['gold'][top] - med['gold'][0]:.3f} | {med['gold'][-1] - med['gold'][0]:.3f} | "
                     f"{alpha:.3f} | {beta:.3f} | {fitted:.3f} |")
    table = (f"Medians over seeds {args.seeds}; gold and proxy: mean reward of the sampled training replies in each "
             f"window of {args.window} iterations; d from kl/per_reply.\n\n" + "\n".join(lines))
    write_report(args.out, "rm_overoptimization", table, payload)
    _plot(args.out / "rm_overoptimization.png", plot)
    return 0


def _plot(path: Path, plot: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (ax1, ax0, ax2) = plt.subplots(1, 3, figsize=(15, 4))
    for size, (med, alpha, beta) in plot.items():
        d, gain = np.array(med["d"]), np.array(med["gold"]) - med["gold"][0]
        xs = np.linspace(max(d.min(), 1e-3), d.max(), 50)
        top = peak(med["gold"])
        near = d <= 1.2  # the rise and the turn, on their own scale
        for ax, keep in ((ax1, slice(None)), (ax0, near)):
            (line,) = ax.plot(d[keep], gain[keep], "o-", label=f"gold, N={size}")
            fit = xs <= d[keep].max()
            ax.plot(xs[fit], xs[fit] * (alpha - beta * np.log(xs[fit])), "--", color=line.get_color(), alpha=0.6)
            ax.plot(d[top], gain[top], "*", ms=14, color=line.get_color())
        ax2.plot(d, np.array(med["proxy"]) - med["proxy"][0], "o-", label=f"proxy, N={size}")
    ax0.set_title("d ≤ 1.2")
    for ax, what in ((ax1, "gold gain (dashed: d(α − β log d); ★: peak)"), (ax0, "gold gain"),
                     (ax2, "proxy reward gain")):
        ax.set_xlabel("d = √KL(π ‖ π_init)")
        ax.set_ylabel(what)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
