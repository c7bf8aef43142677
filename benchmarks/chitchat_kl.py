"""KL control on the chit-chat chatbot: PPO with the per-token KL to the pretrained policy in the reward
(``algo.kl_coef`` β; Ziegler et al. 2019, InstructGPT), for several β, from the same pretrained models as
benchmarks/chitchat.py — the trade-off between the BLEU-2 the reward asks for and the diversity it destroys
(distinct-2 falls from 0.026 to 0.002-0.004 under the policy-gradient algorithms without it).

Run book (from the repository root)
  python benchmarks/chitchat_kl.py                              # β ∈ {0, 0.001, 0.003, 0.01, 0.1, 0.3}, 2 seeds, PPO
  python benchmarks/chitchat_kl.py --algo ppo_dynamic --coefs 0 0.1
  python benchmarks/chitchat_kl.py --report-only

The pretrained models and the β = 0 runs are benchmarks/chitchat.py's (``runs/chitchat/pretrain-s<seed>``,
``<algo>-s<seed>``; reused when they exist). Outputs in ``--out`` (default benchmarks/results): chitchat_kl.md /
.json and chitchat_kl.png (test BLEU-2 against test distinct-2, one point per β, seeds joined).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._compare import load_run, mean_std, parse_args, run_all  # noqa: E402
from benchmarks._report import write_report  # noqa: E402

KEYS = ["test/bleu2", "test/sentence_bleu2", "test/distinct2", "test/self_bleu2", "test/reply_len"]


def label(algo: str, coef: float) -> str:
    return algo if coef == 0 else f"{algo}-kl{coef:g}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="tune_configs/chitchat_quick.yaml")
    ap.add_argument("--algo", default="ppo")
    ap.add_argument("--coefs", nargs="+", type=float, default=[0.0, 0.001, 0.003, 0.01, 0.1, 0.3])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--report-only", action="store_true")
    args, overrides = parse_args(ap, argv)
    runs_dir = args.out / "runs" / "chitchat"
    variants = {label(args.algo, c): [f"algo.name={args.algo}", f"algo.kl_coef={c}"] for c in args.coefs if c}
    if not args.report_only:
        run_all(args.config, overrides, [args.algo] if 0.0 in args.coefs else [], args.seeds, runs_dir,
                pretrain_algo="reinforce", jobs=args.jobs, variants=variants)
    rows, points, payload = [], [], {"config": args.config, "overrides": overrides, "algo": args.algo, "runs": {}}
    for name, coef in [("pretrained", None), *((label(args.algo, c), c) for c in args.coefs)]:
        vals: dict[str, list] = {k: [] for k in (*KEYS, "kl/per_reply")}
        for s in args.seeds:
            d = runs_dir / (f"pretrain-s{s}" if name == "pretrained" else f"{name}-s{s}")
            if not (d / "summary.json").is_file():
                continue
            r = load_run(d, ["kl/per_reply"])
            m = r["summary"]["pretrain_metrics" if name == "pretrained" else "metrics"]
            for k in KEYS:
                vals[k].append(m.get(k))
            kl = [v for _, v in r["curve"]["kl/per_reply"]]
            vals["kl/per_reply"].append(statistics.mean(kl[-10:]) if kl else None)
            payload["runs"][f"{name}-s{s}"] = {k: m.get(k) for k in KEYS}
        if not vals["test/bleu2"]:
            continue
        rows.append(("–" if coef is None else f"{coef:g}", name, mean_std(vals["test/bleu2"]),
                     mean_std(vals["test/distinct2"]), mean_std(vals["test/self_bleu2"]),
                     mean_std(vals["test/sentence_bleu2"]), mean_std(vals["kl/per_reply"]),
                     mean_std(vals["test/reply_len"]), str(len(vals["test/bleu2"]))))
        points.append((name, coef, statistics.mean(vals["test/distinct2"]), statistics.mean(vals["test/bleu2"]),
                       list(zip(vals["test/distinct2"], vals["test/bleu2"])),
                       statistics.mean(k for k in vals["kl/per_reply"] if k is not None) if coef else None))
    head = ("β (kl_coef)", "run", "BLEU-2 (test)", "distinct-2", "Self-BLEU-2", "sentence BLEU-2 (reward)",
            "KL per reply, last 10 iterations (nats)", "reply length", "seeds")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", f"`{args.algo}` from the pretrained model of each seed ({args.config}), the KL to that model in the "
              "reward with weight β; test set figures, once at the end of each run; KL = Σ_t log π_old − log π_ref "
              "per sampled reply, as the learner measured it on its last 10 batches."]
    _plot(points, args.out / "chitchat_kl.png", args.algo)
    write_report(args.out, "chitchat_kl", "\n".join(lines), payload)
    return 0


def _plot(points, path: Path, algo: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    curve = sorted((p for p in points if p[1] is not None), key=lambda p: p[1])
    ax.plot([p[2] for p in curve], [p[3] for p in curve], "-o", color="C3", label=f"{algo}, β = kl_coef")
    for _, coef, x, y, seeds, _ in curve:  # each seed's run beside the mean
        ax.plot([d for d, _ in seeds], [b for _, b in seeds], ".", color="C3", alpha=0.35, ms=7)
        ax.annotate(f"β={coef:g}", (x, y), fontsize=8, xytext=(4, 3), textcoords="offset points")
    for _, coef, x, y, _, _ in points:
        if coef is None:
            ax.plot([x], [y], "s", color="gray", label="pretrained MLE")
    ax.set_xlabel("test distinct-2 (diversity)")
    ax.set_ylabel("test corpus BLEU-2")
    ax.set_title("chitchat-dataset: KL to the pretrained policy (line: mean, dots: seeds)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    knob = [p for p in curve if p[1] > 0]  # the knob itself: KL and diversity against β (log axis)
    ax2.plot([p[1] for p in knob], [p[5] for p in knob], "-o", color="C0", label="KL per reply (nats)")
    ax2.set_xscale("log")
    ax2.set_xlabel("β (algo.kl_coef)")
    ax2.set_ylabel("KL to π_ref per sampled reply (nats)", color="C0")
    twin = ax2.twinx()
    twin.plot([p[1] for p in knob], [p[2] for p in knob], "-s", color="C2")
    twin.set_ylabel("test distinct-2", color="C2")
    ax2.set_title("the knob: KL falls, diversity returns", fontsize=10)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
