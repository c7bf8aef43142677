"""The policy-loss menu side by side: GRPO trained with each loss variant under TRL's names (``algo.loss_type``,
``algo.importance_sampling_level``, ``algo.scale_rewards``, ``algo.delta``, ``algo.top_entropy_quantile``,
``algo.mask_truncated_completions``; rayseq/losses/menu.py), on counting from the default job's MLE start and on a
tiny GPT-2 task.

counting (Tuan et al. 2018): the default job's MLE pretraining once per seed (``python -m rayseq.train
train.iters=0``: 1000 iterations), then each variant's GRPO stage from it (``train.init_from``) with the default
job's budget (200 iterations × 256 replies, G = 8, lr 3e-4). Its replies are three digits with no end token, so
every reply has the same length: the aggregations (dapo, bnpo, grpo, dr_grpo, luspo) differ by a constant factor at
most, and the length bias they differ on cannot show there; the objectives (cispo, sapo, gmpo, GSPO's ratio) and the
advantage's scale can.

gpt2: the tiny GPT-2 of benchmarks/trl_peer.py (2 layers, hidden 32, a 400-token BPE, built locally) and its
vowel-share reward, on chit-chat pairs (gpt2_setup: replies of at most 8 words): MLE pretraining (300 iterations ×
64 pairs) once per seed, then each variant's GRPO stage from it: G = 4, 64 completions per iteration in 4
minibatches of 16 (the ratio moves off 1 after the first, so the objectives differ, not only the aggregations),
lr 1e-3, 120 iterations. Replies end where the policy samples the end token or at the task's cap (40 tokens), so the
lengths move, and each variant's reply-length curve shows what its aggregation does to them (the point of Dr.GRPO's
and DAPO's aggregations).

Run book (from the repository root)
  python benchmarks/loss_menu.py                            # counting, every variant × seeds 0 1 2 (results/)
  python benchmarks/loss_menu.py --task gpt2                # the tiny GPT-2 task (the hf extra)
  python benchmarks/loss_menu.py --variants dapo gmpo --seeds 0   # a subset
  python benchmarks/loss_menu.py --quick                    # smoke run: 3 variants, 1 seed, a few iterations
  python benchmarks/loss_menu.py --report-only              # tables and plots again from the runs
  python benchmarks/loss_menu.py --task gpt2 --label onpolicy algo.minibatch_size=64 train.iters=150
                                                            # one minibatch per batch: every update at ρ = 1
Finished runs (their summary.json exists) are reused; --fresh runs them again.

Time on a 2-core machine shared with other jobs (2 runs at a time, in-process, one torch thread each): counting
~45 min (MLE ~1 min per seed, each GRPO stage ~1.5 min); gpt2 ~35 min (its 36 runs' summaries were written over
33 min).

Outputs in ``--out`` (default benchmarks/results): loss_menu[_gpt2][_LABEL].md (the table: medians over the seeds
with their range), loss_menu[_gpt2][_LABEL].json (every run's validation curve and figures, the commands, the
machine), loss_menu[_gpt2][_LABEL].png (validation reward, clip fraction and reply length against iterations, the
median over seeds); the runs in runs/loss_menu[_gpt2][_LABEL]/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._compare import run_all  # noqa: E402
from benchmarks._report import write_report  # noqa: E402

# label -> (the variant's keys, what it is)
VARIANTS: dict[str, tuple[list[str], str]] = {
    "dapo": ([], "TRL's default and rayseq's: PPO's clip, token mean"),
    "bnpo": (["algo.loss_type=bnpo"], "TRL's per-micro-batch token mean: dapo here"),
    "grpo": (["algo.loss_type=grpo"], "DeepSeekMath: each reply's token mean, then over replies"),
    "dr_grpo": (["algo.loss_type=dr_grpo", "algo.scale_rewards=none"],
                "Dr.GRPO: token sums / (replies × cap), no std"),
    "lite_ppo": (["algo.scale_rewards=batch"], "token mean, the batch's std (Lite PPO)"),
    "luspo": (["algo.loss_type=luspo", "algo.importance_sampling_level=sequence"],
              "LUSPO: GSPO's ratio, token sums over replies"),
    "gspo": (["algo.loss_type=grpo", "algo.importance_sampling_level=sequence", "algo.eps=3e-4",
              "algo.eps_high=4e-4"], "GSPO: one ratio per reply, TRL's recipe ε 3e-4 / 4e-4"),
    "cispo": (["algo.loss_type=cispo", "algo.eps_high=5"], "CISPO: sg(min(ρ, 5))·A·log π, token mean"),
    "sapo": (["algo.loss_type=sapo"], "SAPO: a sigmoid gate, τ 1 / 1.05"),
    "gmpo": (["algo.loss_type=gmpo", "algo.eps=0.4"], "GMPO: geometric mean of the ratios, log-clip 0.4"),
    "delta": (["algo.delta=1.5"], "dapo with INTELLECT-2's two-sided clip δ = 1.5"),
    "top_entropy_0.2": (["algo.top_entropy_quantile=0.2"], "dapo on the 20% highest-entropy tokens"),
    # replies that end at the cap without the end token: none on counting (fixed 3-token replies, refused there)
    "overlong_filtering": (["algo.mask_truncated_completions=true"], "dapo without the replies the cap cut"),
}
ONLY_ON = {"overlong_filtering": ("gpt2",)}  # variants that mean something on some tasks only
TASKS = {
    # the default job (python -m rayseq.train): counting, MLE then RL; its GRPO with the default budget.
    # common: the MLE start's settings and the GRPO runs'; rl: the GRPO runs' own
    "counting": {"common": [], "rl": ["algo.name=grpo"], "pretrain_algo": "ppo_dynamic", "metric": "val/reward",
                 "test": "test/precision", "test_sampled": "test/precision_sampled", "target": 0.97},
    # benchmarks/trl_peer.py's model and reward, on chit-chat pairs (gpt2_setup): MLE, then GRPO on the reward
    "gpt2": {"common": ["task.name=pairs", "model.arch=hf", "reward.fn=benchmarks.trl_peer:vowel_share",
                        "algo.group_size=4", "train.pretrain_iters=300", "train.pretrain_batch_size=64",
                        "train.batch_size=64", "train.eval_every=15", "task.val_size=100", "task.test_size=100"],
             "rl": ["algo.name=grpo", "algo.minibatch_size=16", "algo.lr=1e-3", "algo.kl_coef=0",
                    "algo.max_grad_norm=1.0", "train.iters=120"],
             "pretrain_algo": "grpo", "metric": "val/reward", "test": "test/reward", "test_sampled": None,
             "target": None},
}
QUICK = {"counting": ["train.pretrain_iters=20", "train.pretrain_batch_size=32", "train.iters=4",
                      "train.batch_size=32", "train.eval_every=2", "task.val_size=64", "task.test_size=100"],
         "gpt2": ["train.iters=4", "train.eval_every=2", "train.batch_size=16", "algo.minibatch_size=16"]}
QUICK_VARIANTS = ["dapo", "dr_grpo", "gmpo"]


def reply_cap(resolved: dict) -> int:
    """The longest reply the run's task allows (its max_tgt_len, in the policy's tokens), from a resolved config."""
    from rayseq.config import RunConfig
    from rayseq.tasks import make_task

    cfg = RunConfig.model_validate(resolved)
    return make_task(cfg.task, cfg.reward).max_tgt_len


def gpt2_setup(work: Path) -> tuple[Path, Path]:
    """benchmarks/trl_peer.py's tiny GPT-2 (made once) and chit-chat pairs: each message of the corpus's first
    conversations as a prompt, the next one as its reply, the replies of at most 8 words (so that the MLE start
    replies with lengths of its own, below the cap); a tenth each held out for validation and test."""
    from benchmarks.trl_peer import COMPLETION_LEN
    from rayseq.data import PrepareOptions, prepare
    from tests.hf_fixtures import chitchat_lines, make_tiny_hf

    model, data = work / "tiny-gpt2", work / "data"
    if not (model / "config.json").is_file():
        make_tiny_hf(model)
    if not (data / "manifest.json").is_file():
        lines = chitchat_lines(2000)
        pairs = [{"input": a, "reply": b, "conv_id": f"c{i}"} for i, (a, b) in enumerate(zip(lines, lines[1:]))
                 if len(b.split()) <= 8]
        src = work / "pairs.jsonl"
        src.write_text("".join(json.dumps(p) + "\n" for p in pairs[:600]), encoding="utf-8")
        prepare(f"jsonl:{src}", data, PrepareOptions(quiet=True, max_src_len=64, max_tgt_len=COMPLETION_LEN - 1,
                                                     valid_frac=0.1, test_frac=0.1))
    return model, data


def load(run_dir: Path, spec: dict) -> dict:
    """A run's algorithm stage: the validation curve (its start from the pretrained model's summary), per
    iteration the clip fraction and reply length, and the final test figures."""
    import pyarrow.parquet as pq

    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    first = rows[0]["iteration"] - 1 if rows else 0
    start = summary.get("pretrain_metrics", {}).get(spec["metric"])
    curve = ([(0, start)] if start is not None else []) + [
        (r["iteration"] - first, r[spec["metric"]]) for r in rows if r.get(spec["metric"]) is not None]

    def series(key):
        return [(r["iteration"] - first, r[key]) for r in rows if r.get(key) is not None]

    lengths = [v for _, v in series("rollout/len_mean")]  # mean tokens per sampled reply, per iteration
    m = summary["metrics"]
    reached = next((it for it, v in curve[1:] if spec["target"] is not None and v >= spec["target"]), None)
    return {
        "curve": curve, "clipfrac": series("policy/clipfrac"), "len_curve": series("rollout/len_mean"),
        "kept": series("policy/kept_token_frac"),
        "test": m.get(spec["test"]), "test_sampled": m.get(spec["test_sampled"]) if spec["test_sampled"] else None,
        "start": start, "final_val": curve[-1][1] if curve else None, "reached_target_at": reached,
        "clipfrac_mean": statistics.mean(v for _, v in series("policy/clipfrac")) if rows else None,
        "len_first": lengths[0] if lengths else None, "len_last": lengths[-1] if lengths else None,
        "len_min": min(lengths) if lengths else None, "len_max": max(lengths) if lengths else None,
        "iter_s_median": statistics.median(r["time/iter_s"] for r in rows) if rows else None,
    }


PER_ITERATION = ("clipfrac", "len_curve", "kept")  # plotted; the record keeps their summaries


def recorded(run: dict) -> dict:
    """What the JSON record keeps of a run: its validation curve and figures (the per-iteration series are in the
    run's metrics.parquet)."""
    kept = [v for _, v in run["kept"]]
    return {**{k: v for k, v in run.items() if k not in PER_ITERATION},
            "kept_token_frac_mean": statistics.mean(kept) if kept else None}


def rounded(value):
    """``value`` (nested dicts, lists, tuples of numbers) with its floats to 5 significant digits: the record's size."""
    if isinstance(value, float):
        return float(f"{value:.5g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def med(xs, fmt="{:.3f}") -> str:
    """The median of ``xs`` with its range: 'median (min–max)'; '-' when empty."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    if len(xs) == 1:
        return fmt.format(xs[0])
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def median_curve(curves: list[list[tuple]]) -> list[tuple]:
    """Pointwise median of curves sampled at the same iterations (those every run has)."""
    common = sorted(set.intersection(*(set(x for x, _ in c) for c in curves))) if curves else []
    by = [dict(c) for c in curves]
    return [(x, statistics.median(d[x] for d in by)) for x in common]


def report(task: str, dirs: dict, variants: list[str], seeds: list[int], out: Path, name: str, overrides: list[str],
           load_avg: tuple) -> None:
    spec = TASKS[task]
    runs = {(v, s): load(dirs[(v, s)], spec) for v in variants for s in seeds}
    per_variant = {v: [runs[(v, s)] for s in seeds] for v in variants}
    test_label = "test precision (greedy)" if task == "counting" else "test reward (sampled)"
    lengths_label = "reply length: first → last iteration (min–max over iterations)"
    head = (f"| variant | keys | {test_label} | test precision (sampled) | final {spec['metric']} | first "
            f"{spec['metric']} ≥ {spec['target']} (iteration) | clip fraction (mean) | {lengths_label} "
            "| ms / iteration |" if task == "counting" else
            f"| variant | keys | {test_label} | final {spec['metric']} | clip fraction (mean) | {lengths_label} "
            "| ms / iteration |")
    rows = [head, "|" + " --- |" * (head.count("|") - 1)]
    for v in variants:
        rs = per_variant[v]
        keys = " ".join(VARIANTS[v][0]) or "(defaults)"
        lengths = (f"{med([r['len_first'] for r in rs], '{:.2f}')} → {med([r['len_last'] for r in rs], '{:.2f}')} "
                   f"({min(r['len_min'] for r in rs):.2f}–{max(r['len_max'] for r in rs):.2f})")
        ms = med([1000 * r["iter_s_median"] for r in rs], "{:.0f}")
        if task == "counting":
            reached = [r["reached_target_at"] for r in rs]
            reach = (med(reached, "{:.0f}") if all(x is not None for x in reached)
                     else f"{sum(x is not None for x in reached)}/{len(rs)} runs")
            rows.append(f"| {v} | `{keys}` | {med([r['test'] for r in rs])} | {med([r['test_sampled'] for r in rs])} "
                        f"| {med([r['final_val'] for r in rs])} | {reach} | {med([r['clipfrac_mean'] for r in rs])} "
                        f"| {lengths} | {ms} |")
        else:
            rows.append(f"| {v} | `{keys}` | {med([r['test'] for r in rs])} | {med([r['final_val'] for r in rs])} "
                        f"| {med([r['clipfrac_mean'] for r in rs])} | {lengths} | {ms} |")
    settings = " ".join([*spec["common"], *spec["rl"], *overrides])
    command = " ".join(["python benchmarks/loss_menu.py", *(a for a in sys.argv[1:] if a != "--report-only")])
    start = med([runs[(variants[0], s)]["start"] for s in seeds])
    import yaml

    cfg = yaml.safe_load((dirs[(variants[0], seeds[0])] / "config.yaml").read_text())
    pretrain = dirs.get(("mle", seeds[0]))
    pretrain_iters = (yaml.safe_load((pretrain / "config.yaml").read_text())["train"]["pretrain_iters"]
                      if pretrain else 0)
    lines = [
        f"# The policy-loss menu on {task}",
        "",
        f"Command: `{command}`; "
        f"settings `{settings}` (the rest: "
        "`python -m rayseq.train`'s defaults); each variant adds its keys. Seeds "
        f"{', '.join(map(str, seeds))}; figures: the median over the seeds (min–max). Runs in-process, one torch "
        f"thread, 2 at a time on a 2-core machine; load average before / after: {load_avg[0]:.1f} / {load_avg[1]:.1f}.",
        "",
    ]
    if task == "counting":
        lines += [f"Every run of a seed starts from the same MLE-pretrained model: the default job's MLE stage, "
                  f"{pretrain_iters} iterations ({spec['metric']} {start} at the start; `{spec['test']}` is greedy "
                  f"decoding on {cfg['task']['test_size']} test inputs at the end, `test/precision_sampled` at "
                  f"temperature 1; {cfg['train']['iters']} GRPO iterations × {cfg['train']['batch_size']} replies, "
                  f"G = {cfg['algo']['group_size']}). Clip fraction: the share of "
                  "tokens whose ratio was outside the clip range (CISPO: capped; SAPO: the share of the on-policy "
                  "gradient its gate removed; GMPO: log-ratio outside ±ε), the mean over the update's minibatches "
                  "and iterations. Counting's replies are 3 tokens by construction (no end token), so the reply "
                  "length is 3 throughout.", ""]
    else:
        lines += [f"Every run of a seed starts from the same MLE-pretrained GPT-2 ({pretrain_iters} iterations on "
                  f"the chit-chat pairs; {spec['metric']} {start} at the start). Reward = the vowel share of the "
                  "reply's letters (benchmarks/trl_peer.py); `test/reward` is the mean sampled reward on the test "
                  "prompts at the end. Reply length: the mean number of tokens per sampled reply (end token "
                  f"included; cap {reply_cap(cfg)}, the task's longest reply).", ""]
    lines += rows
    write_report(out, name, "\n".join(lines), {
        "task": task, "seeds": seeds, "settings": [*spec["common"], *spec["rl"], *overrides],
        "variants": {v: VARIANTS[v][0] for v in variants},
        "runs": {f"{v}-s{s}": rounded(recorded(runs[(v, s)])) for v, s in runs}, "load_average": load_avg})
    plot(task, per_variant, spec, out / f"{name}.png", seeds)


def plot(task: str, per_variant: dict, spec: dict, path: Path, seeds: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    panels = ((axes[0], "curve", spec["metric"]), (axes[1], "clipfrac", "clip fraction"),
              (axes[2], "len_curve", "reply length (tokens)"))
    for ax, key, label in panels:
        for j, (v, rs) in enumerate(per_variant.items()):
            c = median_curve([r[key] for r in rs if r[key]])
            if c:
                x, y = zip(*c)
                ax.plot(x, y, color=f"C{j % 10}", ls="-" if j < 10 else "--", label=v, alpha=0.85)
        ax.set_xlabel("iteration of the GRPO stage")
        ax.set_ylabel(label)
    if spec["target"] is not None:
        axes[0].axhline(spec["target"], ls=":", c="gray")
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"{task}: GRPO with each loss variant, median over seeds {seeds}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=list(TASKS), default="counting")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--runs", type=Path, default=None, help="default: runs/loss_menu[_gpt2][_quick]")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 3 variants, seed 0, a few iterations")
    ap.add_argument("--label", default="", help="a suffix of the report's name (loss_menu[_task]_LABEL.*), for a "
                    "run of other settings than the script's (key=value overrides) beside its main one")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--fresh", action="store_true", help="run every run again (else finished ones are reused)")
    argv = sys.argv[1:] if argv is None else argv
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]  # key=value anywhere
    args = ap.parse_args([a for a in argv if a not in overrides])
    spec = TASKS[args.task]
    variants = args.variants or (QUICK_VARIANTS if args.quick else
                                 [v for v in VARIANTS if args.task in ONLY_ON.get(v, (args.task,))])
    seeds = [0] if args.quick and args.seeds == [0, 1, 2] else args.seeds
    parts = ["loss_menu", *([args.task] if args.task != "counting" else []), *([args.label] if args.label else []),
             *(["quick"] if args.quick else [])]
    name = "_".join(parts)
    runs_dir = args.runs or REPO / "runs" / name
    overrides = [*(QUICK[args.task] if args.quick else []), *overrides]
    common = [*spec["common"]]
    if args.task == "gpt2":  # made once, shared by every GPT-2 run (a run started from another's checkpoint too)
        model, data = gpt2_setup(REPO / "runs" / "loss_menu_gpt2")
        common += [f"model.path={model}", f"task.data={data}"]
    before = os.getloadavg()[0]
    dirs = {(v, s): runs_dir / f"{v}-s{s}" for v in variants for s in seeds}
    if spec["pretrain_algo"]:
        dirs.update({("mle", s): runs_dir / f"pretrain-s{s}" for s in seeds})
    if not args.report_only:
        if args.fresh:
            for d in dirs.values():
                shutil.rmtree(d, ignore_errors=True)
        per_variant = {v: [*spec["rl"], *VARIANTS[v][0], *overrides] for v in variants}
        # one MLE start per seed (counting: the default job's), every variant from it
        dirs = run_all("", [*common, *overrides], [], seeds, runs_dir, pretrain_algo=spec["pretrain_algo"],
                       jobs=args.jobs, fresh=args.fresh, variants=per_variant)
    report(args.task, dirs, variants, seeds, args.out, name, overrides, (before, os.getloadavg()[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
