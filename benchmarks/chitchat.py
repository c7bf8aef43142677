"""Chit-chat chatbot: every algorithm with the BLEU-2 reward on chitchat-dataset, beside the PPO-dynamic
paper's Table 2 (Tuan et al. 2018, OpenSubtitles, BLEU-2: MLE 9.62, REINFORCE 14.29, PPO 14.12, PPO-dynamic
14.73) and the ERPO paper's Table 1 (Tan et al. 2018, IWSLT'14 de-en, BLEU: MLE 26.44, RAML 27.22, SPG 26.62,
MIXER 26.53, scheduled sampling 26.76, interpolation 27.82). Other data, so compare the ordering and the gain
over MLE.

Run book (from the repository root)
  python benchmarks/chitchat.py                      # quick schedule, every algorithm, 3 seeds
  python benchmarks/chitchat.py --algos raml spg     # some algorithms (finished runs are reused)
  python benchmarks/chitchat.py --seeds 0 1 2 train.iters=600
  python benchmarks/chitchat.py --report-only
  python benchmarks/chitchat.py --seeds 0 --algos grpo --variant kl10 algo.name=grpo algo.grpo.kl_coef=0.1 \
      --variant g16 algo.name=grpo algo.group_size=16 --split val    # candidates, screened on validation

A ``--variant LABEL KEY=VALUE ...`` is one more row: a run per seed from the same pretrained model as the
algorithms (its overrides apply to the RL stage only), so a candidate costs only its RL runs. Overrides for
every run (pretraining included) go before the first ``--variant``. ``--split val`` reports the validation
inputs' figures (``chitchat_val.md``: the one to choose candidates on) instead of the test inputs'.

Same start for every algorithm of a seed: one run pretrains with MLE (``train.iters=0``), each algorithm
starts from its checkpoint (``train.init_from``); the MLE row is that pretrained model. Runs are
in-process, two at a time (benchmarks/_compare.py). The corpus is prepared into ``task.data`` first.

Outputs in ``--out`` (default benchmarks/results): chitchat.md / .json, chitchat_algorithms.png (BLEU-2 per
algorithm; the reward against distinct-2), chitchat_curves.png (validation BLEU-2 against iteration), sample
replies and where each row's BLEU-2 comes from (brevity penalty, p1, p2) in chitchat.md, runs under runs/chitchat/;
with ``--split val`` the same as chitchat_val.*.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._compare import load_run, mean_std, parse_args, plot_curves, run_all  # noqa: E402
from benchmarks._report import write_report  # noqa: E402

# ERPO Table 1's rows first ("mle" = MLE continued for the algorithm stage's budget), then the rest
ALGOS = ["mle", "raml", "spg", "mixer", "scheduled_sampling", "erpo_interpolation", "data_noising", "scst",
         "actor_critic", "reinforce", "ppo", "ppo_dynamic", "grpo", "rloo", "grpo_dynamic"]
PAPER = {"pretrained": 9.62, "reinforce": 14.29, "ppo": 14.12, "ppo_dynamic": 14.73}  # Tuan et al. Table 2, BLEU-2
ERPO = {"pretrained": 26.44, "raml": 27.22, "spg": 26.62, "mixer": 26.53, "scheduled_sampling": 26.76,
        "erpo_interpolation": 27.82}  # Tan et al. Table 1 (IWSLT'14 BLEU; their MLE is trained to convergence)
KEYS = ["test/bleu2", "test/sentence_bleu2", "test/distinct1", "test/distinct2", "test/self_bleu2", "test/reply_len",
        "test/distinct_replies", "test/unk_replies"]
# The chatbot's goal for an RL row against the pretrained model it starts from, per seed and on the mean: gain
# BLEU-2 without giving up the pretrained model's diversity or the variety of its everyday replies
GOAL_GAIN, GOAL_EVERYDAY = 1.0, 15  # BLEU-2 gain at least; distinct replies to the 20 everyday messages at least
HEDGE = "not sure"  # the MLE models' template on everyday messages ("I'm not sure."): counted, not judged
# 20 varied everyday messages (the goal: at least 15 distinct greedy replies to them)
EVERYDAY = (
    "Hi! How was your weekend?", "I'm thinking of making pasta for dinner tonight.",
    "My cat keeps waking me up at 5am, any advice?", "Do you like rainy days?",
    "I just finished a really long week at work.", "What music have you been listening to lately?",
    "I failed my driving test today.", "Can you recommend a good book?", "It's my birthday tomorrow!",
    "I'm so tired, I barely slept last night.", "Where would you go on vacation if you could go anywhere?",
    "My sister is getting married next month.", "Do you play any sports?", "I think I'm catching a cold.",
    "What's your favourite movie?", "We adopted a puppy yesterday.", "I have a job interview on Monday.",
    "The traffic this morning was terrible.", "Are you a morning person or a night owl?",
    "I started learning to play the guitar.",
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="tune_configs/chitchat_quick.yaml")
    ap.add_argument("--algos", nargs="+", default=ALGOS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--fresh", action="store_true", help="rerun finished runs too")
    ap.add_argument("--variant", nargs="+", action="append", default=[], metavar=("LABEL", "KEY=VALUE"),
                    help="a candidate from the same pretrained models: its label, then its RL overrides (repeatable)")
    ap.add_argument("--split", choices=["test", "val"], default="test",
                    help="the inputs whose figures the table shows (val: chitchat_val.md, to choose candidates on)")
    args, overrides = parse_args(ap, argv)
    variants = parse_variants(args.variant, args.algos)
    if isinstance(variants, str):
        ap.error(variants)
    runs_dir = args.out / "runs" / "chitchat"
    if not args.report_only:
        _prepare(args.config, overrides)
        run_all(args.config, overrides, args.algos, args.seeds, runs_dir, pretrain_algo="reinforce",
                jobs=args.jobs, fresh=args.fresh, variants=variants)
    keys = [k.replace("test/", f"{args.split}/") for k in KEYS]
    rows, curves, samples = [], {}, {}
    payload = {"config": args.config, "overrides": overrides, "variants": variants, "split": args.split, "runs": {}}
    mle_bleu = None
    summary: dict[str, dict[str, list]] = {}
    everyday: dict[str, list[str]] = {}  # algo -> seed 0's greedy replies to EVERYDAY
    parts: dict[str, list[dict]] = {}  # algo -> its runs' BLEU-2 factors (bleu_parts)
    tasks: dict = {}
    chosen: dict[str, list[tuple[int, int]]] = {}  # algo -> (seed, RL iteration of its best evaluation) per run
    stars: dict[str, list[tuple[int, float]]] = {}  # algo -> (iteration, val BLEU-2) of each run's best, on the plot
    for algo in ["pretrained", *args.algos, *variants]:
        vals = {k: [] for k in [*KEYS, "everyday_distinct", "everyday_unk"]}
        parts[algo] = []
        for s in args.seeds:
            d = runs_dir / (f"pretrain-s{s}" if algo == "pretrained" else f"{algo}-s{s}")
            if not (d / "summary.json").is_file():
                continue
            r = load_run(d, ["val/bleu2"])  # the curve on the validation inputs; the figures on the test ones
            # a run with train.best_metric ships its best evaluation (chosen on validation): that model is the row
            best = r["summary"].get("best") if algo != "pretrained" else None
            m = best["metrics"] if best else r["summary"]["pretrain_metrics" if algo == "pretrained" else "metrics"]
            if best:
                chosen.setdefault(algo, []).append((s, rl_iteration(d, r["summary"], best["iteration"])))
                if best["metrics"].get("val/bleu2") is not None:  # (the plot's curve, whatever chose)
                    stars.setdefault(algo, []).append((best["iteration"], best["metrics"]["val/bleu2"]))
            for k, key in zip(KEYS, keys):  # vals keeps the test/ names whichever split it holds
                vals[k].append(m.get(key))
            model = load_model(d / "best" if best else d)
            replies = everyday_replies(model)
            parts[algo].append(bleu_parts(model, d, args.split, tasks))
            vals["everyday_distinct"].append(len(set(replies)))
            vals["everyday_unk"].append(sum("…" in x for x in replies))
            everyday.setdefault(algo, replies)
            payload["runs"][f"{algo}-s{s}-everyday"] = replies
            curves.setdefault(algo, []).append(r["curve"]["val/bleu2"])
            if s == args.seeds[0] and algo != "pretrained":
                samples[algo] = (best or r["summary"])["details"]
            payload["runs"][f"{algo}-s{s}"] = {k: m.get(k) for k in keys}
            payload["runs"][f"{algo}-s{s}-bleu_parts"] = parts[algo][-1]
        b = [x for x in vals["test/bleu2"] if x is not None]
        summary[algo] = vals
        if algo == "pretrained" and b:
            mle_bleu = statistics.mean(b)
        gain = f"{statistics.mean(b) - mle_bleu:+.2f}" if b and mle_bleu is not None and algo != "pretrained" else "-"
        n_test = [round(x * TEST_INPUTS) for x in vals["test/distinct_replies"] if x is not None]
        rows.append((algo, mean_std(b), gain, _paper(PAPER, algo), _paper(ERPO, algo),
                     mean_std(vals["test/sentence_bleu2"]), mean_std(vals["test/distinct1"]),
                     mean_std(vals["test/distinct2"]), mean_std(vals["test/self_bleu2"]),
                     mean_std([float(x) for x in n_test]), mean_std([float(x) for x in vals["everyday_distinct"]]),
                     str(sum(vals["everyday_unk"])) + " / " + mean_std(vals["test/unk_replies"]),
                     mean_std(vals["test/reply_len"]), str(len(b))))
    parts_mean = {a: {k: statistics.mean(p[k] for p in ps) for k in ps[0] if k != "checkpoint"}
                  for a, ps in parts.items() if ps}
    table = _table(rows, args, samples, everyday, variants, parts_mean, chosen)
    table += "\n" + goal_table(payload["runs"], [*args.algos, *variants], args.seeds, args.split)
    name = "chitchat" if args.split == "test" else "chitchat_val"
    _plot(curves, args.out / f"{name}_curves.png", stars)  # --split val: chitchat_val_curves.png, the candidates
    _plot_summary(summary, args.out / f"{name}_algorithms.png", args.split, parts_mean)
    write_report(args.out, name, table, payload)
    return 0


def parse_variants(specs: list[list[str]], algos: list[str]) -> dict[str, list[str]] | str:
    """``--variant`` values ([label, key=value, ...] each) as {label: overrides}, or the one-line error."""
    out: dict[str, list[str]] = {}
    for label, *extra in specs:
        if not label.replace("_", "").isalnum() or label in ("pretrain", "pretrained", *algos, *out):
            return (f"--variant {label!r}: a label is letters, digits and _, not an algorithm's name, "
                    "'pretrained' or another variant's")
        if not extra or any("=" not in e for e in extra):
            return f"--variant {label}: give its overrides as KEY=VALUE after the label (e.g. algo.name=grpo)"
        out[label] = extra
    return out


TEST_INPUTS = 1000  # tune_configs/chitchat_quick.yaml's task.test_size (and val_size)


def load_model(run_dir: Path):
    """A run's model from its last checkpoint (the pretraining run's: the MLE model), as serving loads it."""
    import torch

    from rayseq.serving.model import ChatModel

    torch.set_num_threads(1)
    return ChatModel(run_dir)


def everyday_replies(model) -> list[str]:
    """A model's (:func:`load_model`) greedy replies to :data:`EVERYDAY`, decoded as the model has it: no repetition
    penalty, no n-gram ban (serving's defaults would hide a template)."""
    from rayseq.serving.model import GenRequest

    off = dict(temperature=0.0, repetition_penalty=1.0, no_repeat_ngram_size=0, max_tokens=model.max_tgt_len)
    return [r.replies[0] for r in model.generate([GenRequest(m, **off) for m in EVERYDAY])]


def bleu_parts(model, run_dir: Path, split: str, tasks: dict) -> dict:
    """The factors of a model's corpus BLEU-2 on the split's greedy replies (``rayseq.rewards.corpus_bleu_parts``:
    BP, p_1, p_2, reply and reference words), which tell a gain in n-gram precision from one in length. Kept in
    ``bleu_parts_<split>.json`` in the run beside the checkpoint it was computed from; ``tasks`` caches the task (its
    data) by config across runs."""
    import yaml

    from rayseq.config import build_config
    from rayseq.rewards import corpus_bleu_parts
    from rayseq.tasks import make_task

    cache = run_dir / f"bleu_parts_{split}.json"
    if cache.is_file():
        kept = json.loads(cache.read_text())
        if kept.get("checkpoint") == Path(model.checkpoint).name:
            return kept
    cfg = build_config(yaml.safe_load((run_dir / "config.yaml").read_text()))
    key = cfg.task.model_dump_json()
    if key not in tasks:
        tasks[key] = make_task(cfg.task, cfg.reward)
    _, replies, refs = tasks[key].greedy_words(model.generator, split)  # words, as the run's own evaluation counts
    judged = [i for i, r in enumerate(refs) if len(r)]
    parts = corpus_bleu_parts([replies[i] for i in judged], [refs[i] for i in judged], max_order=2)
    out = {"checkpoint": Path(model.checkpoint).name, "bleu2": 100 * parts["bleu"], "bp": parts["bp"],
           "p1": 100 * parts["precisions"][0], "p2": 100 * parts["precisions"][1],
           "reply_words": parts["hyp_len"] / len(judged), "reference_words": parts["ref_len"] / len(judged)}
    cache.write_text(json.dumps(out, indent=1))
    return out


def rl_iteration(run_dir: Path, summary: dict, iteration: int) -> int:
    """The algorithm stage's iteration of the run's global ``iteration`` (which counts the pretraining's too)."""
    import yaml

    iters = yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["iters"]
    return iteration - (summary["iterations"] - iters)


def goal_table(runs: dict, algos: list[str], seeds: list[int], split: str = "test") -> str:
    """The chatbot's goal seed by seed for each row (``runs``: the report's JSON ``runs``): BLEU-2 gain ≥ GOAL_GAIN over
    the seed's pretrained model, distinct-2 at least its, no ``<unk>`` in a greedy reply (held-out or everyday), at
    least GOAL_EVERYDAY distinct replies to the everyday messages; ✓/✗ per criterion, and on the means."""
    def mark(ok: bool) -> str:
        return "✓" if ok else "✗"

    lines = [f"The chatbot's goal, seed by seed ({split} inputs; ✓ met): BLEU-2 gain ≥ +{GOAL_GAIN:.1f}, distinct-2 at "
             f"least the pretrained model's, no <unk> in a greedy reply, ≥ {GOAL_EVERYDAY} distinct replies to the "
             f"{len(EVERYDAY)} everyday messages; \"{HEDGE}\" counts everyday replies with the MLE template.", "",
             f"| row | seed | {split} BLEU-2: pretrained → row (gain) | distinct-2 | <unk> replies | distinct / "
             f"{len(EVERYDAY)} everyday | \"{HEDGE}\" / {len(EVERYDAY)} everyday |", "|---|---|---|---|---|---|---|"]
    for algo in algos:
        per = []
        for s in seeds:
            pre, run = runs.get(f"pretrained-s{s}"), runs.get(f"{algo}-s{s}")
            if not pre or not run:
                continue
            b0, b1 = pre[f"{split}/bleu2"], run[f"{split}/bleu2"]
            d0, d1 = pre[f"{split}/distinct2"], run[f"{split}/distinct2"]
            e0, e1 = runs[f"pretrained-s{s}-everyday"], runs[f"{algo}-s{s}-everyday"]
            unk = sum("…" in x for x in e1) + round((run[f"{split}/unk_replies"] or 0) * TEST_INPUTS)
            hedge = [sum(HEDGE in x.lower() for x in e) for e in (e0, e1)]
            per.append((b0, b1, d0, d1, unk, len(set(e0)), len(set(e1)), *hedge))
            lines.append(f"| {algo} | {s} | {b0:.2f} → {b1:.2f} ({b1 - b0:+.2f}) {mark(b1 - b0 >= GOAL_GAIN)} | "
                         f"{d0:.4f} → {d1:.4f} {mark(d1 >= d0)} | {unk} {mark(unk == 0)} | {len(set(e0))} → "
                         f"{len(set(e1))} {mark(len(set(e1)) >= GOAL_EVERYDAY)} | {hedge[0]} → {hedge[1]} |")
        if len(per) > 1:
            m = [statistics.mean(col) for col in zip(*per)]
            gain = m[1] - m[0]
            lines.append(f"| {algo} | mean | {m[0]:.2f} → {m[1]:.2f} ({gain:+.2f}) {mark(gain >= GOAL_GAIN)}"
                         f" | {m[2]:.4f} → {m[3]:.4f} {mark(m[3] >= m[2])} | {sum(p[4] for p in per)} "
                         f"{mark(m[4] == 0)} | {m[5]:.1f} → {m[6]:.1f} {mark(m[6] >= GOAL_EVERYDAY)} | "
                         f"{m[7]:.1f} → {m[8]:.1f} |")
    return "\n".join(lines) + "\n"


def _prepare(config: str, overrides: list[str]) -> None:
    from rayseq.config import build_config, load_yaml
    from rayseq.tasks.chitchat import ensure_prepared

    ensure_prepared(build_config(load_yaml(config), overrides).task)


def _paper(table: dict, algo: str) -> str:
    """A paper's figure and its gain over that paper's MLE, or '-'."""
    if algo not in table:
        return "-"
    return f"{table[algo]:.2f}" + ("" if algo == "pretrained" else f" ({table[algo] - table['pretrained']:+.2f})")


def _table(rows, args, samples, everyday, variants, parts, chosen) -> str:
    split = {"test": "test", "val": "validation"}[args.split]
    head = ("algorithm", f"{split} BLEU-2 (ours)", "gain over pretrained MLE", "Tuan et al. Table 2 (gain)",
            "ERPO Table 1 (gain)", "sentence BLEU-2 (the reward)", "distinct-1", "distinct-2", "Self-BLEU-2",
            f"distinct greedy replies / {TEST_INPUTS} {split} inputs", f"distinct replies / {len(EVERYDAY)} everyday "
            "messages", f"replies with <unk>: everyday (all seeds) / {split} (fraction)", "reply length (words)",
            "seeds")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += [""] + [f"`{v}`: `{' '.join(o)}` (from the same pretrained model)" for v, o in variants.items()]
    lines += [""] + [f"`{a}`: each run's best evaluation on the validation inputs (`train.best_metric`), at RL "
                     "iteration " + ", ".join(f"{it} (seed {s})" for s, it in its) for a, its in chosen.items()]
    lines += ["", f"Schedule: `{args.config}`; seeds {args.seeds}; corpus BLEU-2 (sacrebleu) of greedy replies on "
              f"the {split} inputs (unseen in training) against all their references. `pretrained` is the MLE model "
              "every algorithm starts from (the papers' MLE row); `mle` continues MLE for the algorithm stage's "
              "budget, so an algorithm's gain over `mle` is what it adds beyond more training. Papers: Tuan et "
              "al. Table 2 (OpenSubtitles, BLEU-2), Tan et al. (ERPO) Table 1 (IWSLT'14 de-en, BLEU-4, attention LSTM, "
              "beam 5).", ""]
    lines += ["Where the BLEU-2 comes from: BLEU-2 = BP · √(p1 · p2), BP = exp(1 − r/c) when the replies' c words "
              "are fewer than the references' r (else 1); means over seeds, seed by seed in the JSON:", "",
              "| algorithm | BLEU-2 | BP | p1 (%) | p2 (%) | reply words / reference words (per input) |",
              "|---|---|---|---|---|---|"]
    for algo, mean in parts.items():
        lines.append(f"| {algo} | {mean['bleu2']:.2f} | {mean['bp']:.3f} | {mean['p1']:.2f} | {mean['p2']:.2f} | "
                     f"{mean['reply_words']:.2f} / {mean['reference_words']:.2f} |")
    lines.append("")
    lines += [f"Greedy replies (seed {args.seeds[0]}, no repetition penalty) to {len(EVERYDAY)} everyday messages:", "",
              "| message | " + " | ".join(everyday) + " |", "|" + "---|" * (len(everyday) + 1)]
    lines += ["| " + " | ".join([m, *(everyday[a][i] for a in everyday)]) + " |" for i, m in enumerate(EVERYDAY)]
    lines.append("")
    for algo, det in samples.items():
        lines.append(f"Replies of `{algo}` (seed {args.seeds[0]}) to the paper's Supplement Table 2 inputs:")
        lines.append("")
        lines += [f"- {p['input']} → {p['reply']}" for p in det.get("paper_prompts", [])]
        lines.append("")
    return "\n".join(lines)


def _plot_summary(summary: dict, path: Path, split: str = "test", parts: dict | None = None) -> None:
    """Left: held-out BLEU-2 per algorithm (mean and each seed); middle: the reward against diversity; right (with
    ``parts``, the mean of :func:`bleu_parts` per algorithm): BLEU-2's two factors, brevity penalty against bigram
    precision."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algos = [a for a, v in summary.items() if any(x is not None for x in v["test/bleu2"])]
    parts = parts or {}
    fig, axes = plt.subplots(1, 3 if parts else 2, figsize=(17 if parts else 12, 4.5),
                             gridspec_kw={"width_ratios": [3, 2, 2] if parts else [3, 2]})
    ax, ax2 = axes[:2]
    palette = [f"C{k}" for k in (0, 1, 2, 3, 4, 5, 6, 8, 9)]  # C7 is gray: kept for the MLE rows
    for i, a in enumerate(algos):
        ys = [x for x in summary[a]["test/bleu2"] if x is not None]
        colour = "gray" if a in ("pretrained", "mle") else palette[i % len(palette)]
        ax.bar(i, statistics.mean(ys), color=colour, alpha=0.7)
        ax.plot([i] * len(ys), ys, "k.", ms=6)
        r = [x for x in summary[a]["test/sentence_bleu2"] if x is not None]
        d = [x for x in summary[a]["test/distinct2"] if x is not None]
        ax2.scatter(statistics.mean(d), statistics.mean(r), color=colour)
        ax2.annotate(a, (statistics.mean(d), statistics.mean(r)), fontsize=7, xytext=(3, 2), textcoords="offset points")
        if a in parts:
            bp, p2 = parts[a]["bp"], parts[a]["p2"]
            axes[2].scatter(bp, p2, color=colour)
            axes[2].annotate(a, (bp, p2), fontsize=7, xytext=(3, 2), textcoords="offset points")
    if "pretrained" in algos:
        base = statistics.mean(x for x in summary["pretrained"]["test/bleu2"] if x is not None)
        ax.axhline(base, ls=":", c="k", label="pretrained MLE")
        ax.legend(fontsize=8)
    ax.set_xticks(range(len(algos)), algos, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel(f"{split} corpus BLEU-2 (bar: mean, dots: seeds)")
    ax.set_title("chitchat-dataset: every algorithm from one MLE model")
    ax2.set_xlabel("distinct-2 (diversity)")
    ax2.set_ylabel(f"{split} sentence BLEU-2 (the reward)")
    ax2.set_title("reward against diversity")
    if parts:
        axes[2].set_xlabel("brevity penalty (1: replies as long as the references)")
        axes[2].set_ylabel(f"{split} bigram precision p2 (%)")
        axes[2].set_title("BLEU-2 = BP · √(p1 · p2): its two levers")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot(curves: dict, path: Path, chosen: dict | None = None) -> None:
    plot_curves(curves, path, ylabel="validation BLEU-2", title="chitchat-dataset: BLEU-2 during training",
                markers=True, chosen=chosen)


if __name__ == "__main__":
    raise SystemExit(main())
