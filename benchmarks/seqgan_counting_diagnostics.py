"""Why SeqGAN on counting (Tuan et al. 2018, Table 1 lower block) does or does not improve on its MLE model.

Runs SeqGAN-family configurations on the counting task in-process and, every ``--probe-every`` adversarial
iterations (and once before the first g-step), probes the learner's generator G_θ, rollout policy G_β and
discriminator D on a fixed probe set of VALIDATION inputs (never test):

- D(real) on reference pairs of the probe inputs, D(fake) on samples of G_θ, D's balanced accuracy at 0.5;
- whether D rewards correctness: D on the correct samples, on the wrong ones, and the AUC of D between them
  (0.5: D's reward says nothing about what the task calls correct);
- SeqGAN's Monte-Carlo Q (Eq. 4, the run's N and G_β, scored by the run's D) per token t = 1, 2, 3: its mean,
  its spread over the batch (what the policy gradient learns from), the Monte-Carlo noise (std over the N
  continuations of one prefix, t < 3) and the AUC of Q_t between correct and wrong samples;
- the sampled precision on the probe set and the y1 distribution (total variation to the truth, mean over N);
- from the run's own metrics: D's training accuracy / D(real) / D(fake) of each d-step, val/precision.

Run book (from the repository root; times on the 2-core machine with other runs beside these, so shorter alone)
  python benchmarks/seqgan_counting_diagnostics.py --pretrain-only --variants short wide_d   # 2 x 30 min
      # the short schedule's start (MLE 1000 + 10 d-steps), its D and a wide one, probed: diag_runs/pre-*/
  python benchmarks/seqgan_counting_diagnostics.py --disc-study diag_runs/pre-XXXX-s0/checkpoints/ckpt_00001010.pt \
      --disc-steps 15 --disc-settings "short, l2 0"          # D alone on that generator, ~20 min per setting
  python benchmarks/seqgan_counting_diagnostics.py --disc-study CKPT --disc-steps 20 \
      --disc-settings "short, paper budget"   # the paper's 10,000 + 10,000 pairs x 3 epochs a d-step: 384 s
  python benchmarks/seqgan_counting_diagnostics.py --disc-sanity  # D against wrong-on-purpose negatives, ~10 min
  python benchmarks/seqgan_counting_diagnostics.py --variants short baseline --seeds 0 1   # adversarial runs, probed
  python benchmarks/seqgan_counting_diagnostics.py --report-only         # table and plot from the JSON files
  python benchmarks/seqgan_counting_diagnostics.py --y1-ties RUN_DIR ...   # why greedy precision jumps, ~20 s a run

Outputs in ``--out`` (default benchmarks/results/counting_seqgan): diagnostics.md, diagnostics.json,
diagnostics.png, one JSON per (variant, seed) under diag_runs/; disc_study_*.md/json; disc_sanity.md/json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

BASE = ["task.name=counting", "rollout.num_workers=0", "progress=false", "train.eval_every=20"]
# the shortened schedule under which D learns nothing (benchmarks/results/counting_seqgan/FINDINGS.md, sections 1-8)
SHORT = ["disc.emb_dim=32", "disc.filter_sizes=[1,2,3,4,5]", "disc.num_filters=[32,32,32,32,32]",
         "disc.pretrain_steps=10", "disc.d_steps=1", "disc.epochs=1", "disc.num_negatives=2000", "disc.lr=1e-3",
         "algo.mc_rollouts=8", "train.iters=60"]
# a D whose widest window spans a whole (input, sep, reply) pair (<= 10 + 1 + 3 tokens), as the paper's (up to 20)
WIDE_D = ["disc.filter_sizes=[1,2,3,4,5,10,15]", "disc.num_filters=[32,32,32,32,32,64,64]"]
BASELINE = ["algo.use_baseline=true"]  # Tuan et al. Supp. C: A_t = Q_t − b(s_t), b trained as Ranzato et al.
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "short": ("seqgan", SHORT),  # the short schedule
    "baseline": ("seqgan", [*SHORT, *BASELINE]),
    "wide_d_baseline": ("seqgan", [*SHORT, *WIDE_D, *BASELINE]),
    "short_ppo_dynamic": ("seqgan_ppo_dynamic", SHORT),
    "wide_d": ("seqgan", [*SHORT, *WIDE_D]),
    "wide_d_baseline_ppo_dynamic": ("seqgan_ppo_dynamic", [*SHORT, *WIDE_D, *BASELINE]),
    "long_mle": ("seqgan", [*SHORT, *BASELINE, "train.pretrain_iters=3000"]),
    "n16": ("seqgan", [*SHORT, *BASELINE, "algo.mc_rollouts=16"]),
    "wide_d_5_dsteps": ("seqgan", [*SHORT, *WIDE_D, *BASELINE, "disc.d_steps=5"]),  # the paper's d-steps
}


def auc(pos, neg) -> float | None:
    """P(a random ``pos`` score > a random ``neg`` score) + ½ P(tie) (Mann-Whitney); None if a side is empty."""
    import numpy as np

    pos, neg = np.asarray(pos, dtype=np.float64), np.asarray(neg, dtype=np.float64)
    if not len(pos) or not len(neg):
        return None
    allv = np.concatenate([pos, neg])
    order = allv.argsort(kind="stable")
    ranks = np.empty(len(allv))
    ranks[order] = np.arange(1, len(allv) + 1)
    for v in np.unique(allv):  # average ranks of ties
        sel = allv == v
        if sel.sum() > 1:
            ranks[sel] = ranks[sel].mean()
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def probe(trainer, n_probe: int, seed: int) -> dict:
    """The probe measurements of the in-process learner's G_θ, G_β and D now (see the module docstring)."""
    import numpy as np
    import torch

    from rayseq.algos.seqgan import mc_continuations, score_continuations
    from rayseq.types import PromptBatch, RolloutRequest

    groups, task, cfg = trainer.groups, trainer.task, trainer.cfg  # in-process: one worker, one scorer
    groups.rollout.sync_weights()
    groups.scorer.sync_weights()
    worker, scorer = groups.rollout.local, groups.scorer.local
    src, src_len = (a[:n_probe] for a in task.split("val"))
    rollout = worker.sample(PromptBatch(src, src_len), RolloutRequest(max_len=task.max_tgt_len, temperature=1.0,
                                                                      seed=seed))
    correct = rollout.score > 0.5  # the worker scored the samples with the task's 0/1 reward
    batch, _ = worker.run_shard(mc_continuations, rollout, cfg.algo.mc_rollouts, 1.0, seed=seed + 1)
    q, _ = scorer.run_shard(score_continuations, batch)  # (B, 3) Q of Eq. 4
    disc = scorer.modules["disc"]
    with torch.no_grad():
        s, sl = torch.from_numpy(src), torch.from_numpy(src_len)
        tgt = torch.from_numpy(task.sample_targets(np.random.default_rng(seed), src, src_len))
        d_real = disc.score(tgt, torch.full((len(src),), 3), s, sl).numpy()
        d_cont = disc.score_shared_prefix(torch.from_numpy(batch.tokens), torch.from_numpy(batch.lengths),
                                          torch.from_numpy(batch.cont.astype(np.int64)),
                                          torch.from_numpy(batch.cont_len), torch.arange(1, 3), s, sl).numpy()
    d_fake = q[:, -1]
    out = {
        "d_real": float(d_real.mean()), "d_fake": float(d_fake.mean()),
        "d_acc": float(0.5 * ((d_real > 0.5).mean() + (d_fake < 0.5).mean())),
        "d_fake_correct": float(d_fake[correct].mean()) if correct.any() else None,
        "d_fake_wrong": float(d_fake[~correct].mean()) if (~correct).any() else None,
        "d_auc_correct": auc(d_fake[correct], d_fake[~correct]),
        "precision_sampled": float(correct.mean()),
    }
    for t in range(3):
        out[f"q{t + 1}_mean"] = float(q[:, t].mean())
        out[f"q{t + 1}_std"] = float(q[:, t].std())
        out[f"q{t + 1}_auc_correct"] = auc(q[correct, t], q[~correct, t])
        if t < 2:
            out[f"q{t + 1}_mc_std"] = float(d_cont[:, t].std(-1).mean())
    # y1: the first output's distribution against the truth (uniform over 0..N−1)
    y1 = rollout.tokens[:, 0] - task.digit0
    tvs = []
    for n in range(1, 11):
        sel = src_len == n
        if sel.sum() < 5:
            continue
        hist = np.bincount(np.clip(y1[sel], 0, 9), minlength=10) / sel.sum()
        tvs.append(0.5 * np.abs(hist - np.where(np.arange(10) < n, 1 / n, 0)).sum())
    out["y1_tv_sampled"] = float(np.mean(tvs))
    return out


# keys that shape the pretrained start (MLE, then D pretraining): variants that agree on them share one pretraining
PRETRAIN_KEYS = ("train.pretrain_iters", "disc.emb_dim", "disc.filter_sizes", "disc.num_filters", "disc.pretrain_steps",
                 "disc.num_negatives", "disc.lr", "disc.epochs")


def _pretrain_overrides(overrides: list[str]) -> list[str]:
    return [o for o in overrides if o.split("=", 1)[0] in PRETRAIN_KEYS]


def pretrain(overrides: list[str], seed: int, out_dir: str, n_probe: int) -> str:
    """One pretraining (MLE, then D pretraining; ``train.iters=0``) that variants start from (``train.init_from``),
    with the probe of its end (iteration 0 of every variant that starts from it); returns its run directory."""
    import hashlib

    from rayseq.config import build_config
    from rayseq.distributed.driver import Trainer

    key = hashlib.sha1(" ".join(sorted(overrides)).encode()).hexdigest()[:8]
    run_dir = Path(out_dir) / "diag_runs" / f"pre-{key}-s{seed}"
    if (run_dir / "probe0.json").exists():
        return str(run_dir)
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = build_config(None, [*BASE, *SHORT, *overrides, "algo.name=seqgan", "train.iters=0",
                              "train.pretrain_eval_every=0", f"seed={seed}", f"run_dir={run_dir}"])
    probes = []

    def report(row, trainer):
        if trainer.stage == "algo_pretrain" and trainer.stage_iter == cfg.disc.pretrain_steps:
            probes.append(probe(trainer, n_probe, 10_000 + seed))

    Trainer(cfg, report=report).run()
    (run_dir / "probe0.json").write_text(json.dumps(probes[0]) + "\n")
    return str(run_dir)


def run_variant(name: str, seed: int, out_dir: str, n_probe: int, probe_every: int, extra: list[str]) -> str:
    """Trains variant ``name`` for ``seed`` from its shared pretraining, with probes; writes and returns its JSON."""
    import shutil

    import pyarrow.parquet as pq

    from rayseq.config import build_config, config_to_dict
    from rayseq.distributed.driver import Trainer

    algo, overrides = VARIANTS[name]
    pre = Path(pretrain(_pretrain_overrides([*overrides, *extra]), seed, out_dir, n_probe))
    run_dir = Path(out_dir) / "diag_runs" / f"{name}-s{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = build_config(None, [*BASE, *overrides, *extra, f"algo.name={algo}", f"seed={seed}", f"run_dir={run_dir}",
                              f"train.init_from={pre}"])
    probe0 = json.loads((pre / "probe0.json").read_text())
    probes, t0 = [], time.time()

    def report(row, trainer):
        it = trainer.stage_iter
        if it % probe_every == 0 or it == cfg.train.iters:
            p = probe(trainer, n_probe, 10_000 + seed)
            p["iteration"] = it
            p["val_precision"] = row.get("val/precision")
            probes.append(p)

    summary = Trainer(cfg, report=report).run()
    probe0.update(iteration=0, val_precision=summary["pretrain_metrics"].get("val/precision"))
    cols = ["stage", "iteration", "disc/accuracy", "disc/d_real", "disc/d_fake", "val/precision", "rollout/q_mean",
            "policy/grad_norm"]
    table = pq.read_table(run_dir / "metrics.parquet")
    rows = [{k: r.get(k) for k in cols} for r in table.select([c for c in cols if c in table.column_names]).to_pylist()]
    res = {
        "variant": name, "algo": algo, "seed": seed, "overrides": [*overrides, *extra], "pretrained_from": str(pre),
        "resolved": {k: config_to_dict(cfg)[k] for k in ("algo", "disc")},
        "pretrain_val_precision": summary["pretrain_metrics"].get("val/precision"),
        "pretrain_test_precision": summary["pretrain_metrics"].get("test/precision"),
        "final_val_precision": summary["metrics"].get("val/precision"),
        "final_test_precision": summary["metrics"].get("test/precision"),
        "wall_s": round(time.time() - t0, 1), "probes": [probe0, *probes], "metrics": rows,
    }
    path = Path(out_dir) / "diag_runs" / f"{name}-s{seed}.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the weights are not needed for the report
    return str(path)


def _fmt(x, spec=".3f") -> str:
    return "–" if x is None else format(x, spec)


def table(results: list[dict]) -> str:
    head = ("| variant | seed | it | val prec | sampled prec | D(real) | D(fake) | D acc | D fake correct / wrong "
            "| D AUC correct | Q1 std (MC std) | Q1 AUC | Q2 std (MC std) | Q2 AUC | y1 TV |")
    lines = [head, "|" + "---|" * 15]
    for r in results:
        for p in r["probes"]:
            lines.append(
                f"| {r['variant']} | {r['seed']} | {p['iteration']} | {_fmt(p['val_precision'])} "
                f"| {p['precision_sampled']:.3f} | {p['d_real']:.3f} | {p['d_fake']:.3f} | {p['d_acc']:.3f} "
                f"| {_fmt(p['d_fake_correct'])} / {_fmt(p['d_fake_wrong'])} | {_fmt(p['d_auc_correct'])} "
                f"| {p['q1_std']:.3f} ({p['q1_mc_std']:.3f}) | {_fmt(p['q1_auc_correct'])} "
                f"| {p['q2_std']:.3f} ({p['q2_mc_std']:.3f}) | {_fmt(p['q2_auc_correct'])} | {p['y1_tv_sampled']:.3f} |"
            )
    return "\n".join(lines)


def summary_table(results: list[dict]) -> str:
    """Per variant: pretrained and final validation precision (mean over seeds), D's AUC at the start and end."""
    by: dict[str, list[dict]] = {}
    for r in results:
        by.setdefault(r["variant"], []).append(r)
    lines = ["| variant | algo | seeds | val prec pretrained | val prec final | Δ (pp) | D AUC correct start → end "
             "| Q1 AUC start → end | wall s |", "|" + "---|" * 9]
    for v, rs in by.items():
        pre = statistics.fmean(r["pretrain_val_precision"] for r in rs)
        fin = statistics.fmean(r["final_val_precision"] for r in rs)

        def m(key, i, rs=rs):
            xs = [r["probes"][i][key] for r in rs if r["probes"][i][key] is not None]
            return statistics.fmean(xs) if xs else None

        lines.append(f"| {v} | {rs[0]['algo']} | {len(rs)} | {100 * pre:.2f} | {100 * fin:.2f} "
                     f"| {100 * (fin - pre):+.2f} | {_fmt(m('d_auc_correct', 0))} → {_fmt(m('d_auc_correct', -1))} "
                     f"| {_fmt(m('q1_auc_correct', 0))} → {_fmt(m('q1_auc_correct', -1))} "
                     f"| {statistics.median(r['wall_s'] for r in rs):.0f} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("val_precision", "val precision (greedy)"), ("d_auc_correct", "AUC of D: correct vs wrong samples"),
            ("d_real", "D(real)"), ("d_fake", "D(fake)"), ("q1_std", "std of Q at y1 over the batch"),
            ("y1_tv_sampled", "y1 TV to the truth (samples)")]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (k, label) in zip(axes.flat, keys):
        for r in results:
            xs = [p["iteration"] for p in r["probes"] if p.get(k) is not None]
            ys = [p[k] for p in r["probes"] if p.get(k) is not None]
            ax.plot(xs, ys, marker=".", label=f"{r['variant']} s{r['seed']}")
        ax.set_title(label)
        ax.set_xlabel("adversarial iteration")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("SeqGAN on counting: probes on validation inputs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS)[:4], choices=list(VARIANTS),
                    help="default: the first four (the short schedule, the baseline, the wide D, PPO-dynamic)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--probe", type=int, default=1000, help="probe inputs (the first of the validation set)")
    ap.add_argument("--probe-every", type=int, default=20)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "counting_seqgan")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--disc-study", metavar="CHECKPOINT", help="train D alone on this pretrained generator instead")
    ap.add_argument("--disc-steps", type=int, default=20)
    ap.add_argument("--disc-settings", nargs="+", choices=list(DISC_SETTINGS), help="default: all")
    ap.add_argument("--disc-sanity", action="store_true", help="D against negatives made wrong on purpose")
    ap.add_argument("--y1-ties", nargs="+", metavar="RUN", help="greedy precision against y1's near-ties, per run")
    ap.add_argument("--pretrain-only", action="store_true",
                    help="only the variants' pretrainings and their probe at the start of the adversarial stage")
    args, extra = ap.parse_known_args(argv)
    if args.disc_sanity:
        rows = disc_sanity()
        text = "\n".join(["| negatives | minibatches | D(real) | D(fake) | D acc |", "|---|---|---|---|---|"] + [
            f"| {r['negatives']} | {r['steps']} | {r['d_real']:.3f} | {r['d_fake']:.3f} | {r['d_acc']:.3f} |"
            for r in rows])
        print(text)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "disc_sanity.md").write_text(text + "\n")
        (args.out / "disc_sanity.json").write_text(json.dumps(rows, indent=1) + "\n")
        return 0
    if args.y1_ties:
        rows = [y1_ties(r) for r in args.y1_ties]
        text = y1_ties_table(rows)
        print(text)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "y1_ties.md").write_text(text + "\n")
        (args.out / "y1_ties.json").write_text(json.dumps(rows, indent=1) + "\n")
        return 0
    if args.disc_study:
        study = disc_study(args.disc_study, args.disc_steps, args.probe, settings=args.disc_settings)
        text = disc_table(study)
        print(text)
        args.out.mkdir(parents=True, exist_ok=True)
        tag = "_".join(n.replace(" ", "").replace(",", "").replace("(", "").replace(")", "")
                       for n in study["settings"])
        (args.out / f"disc_study_{tag}.md").write_text(text + "\n")
        (args.out / f"disc_study_{tag}.json").write_text(json.dumps(study, indent=1) + "\n")
        return 0
    (args.out / "diag_runs").mkdir(parents=True, exist_ok=True)
    jobs = [(v, s) for v in args.variants for s in args.seeds]
    if not args.report_only:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
            pres = {(tuple(_pretrain_overrides([*VARIANTS[v][1], *extra])), s) for v, s in jobs}
            for f in [pool.submit(pretrain, list(o), s, str(args.out), args.probe) for o, s in sorted(pres)]:
                print("pretrained", f.result(), flush=True)
            if args.pretrain_only:
                return 0
            futs = [pool.submit(run_variant, v, s, str(args.out), args.probe, args.probe_every, extra)
                    for v, s in jobs]
            for f in futs:
                print("wrote", f.result(), flush=True)
    results = []
    for v, s in jobs:
        p = args.out / "diag_runs" / f"{v}-s{s}.json"
        if p.exists():
            results.append(json.loads(p.read_text()))
    text = "## Summary\n\n" + summary_table(results) + "\n\n## Probes\n\n" + table(results)
    print(text)
    (args.out / "diagnostics.md").write_text(text + "\n")
    (args.out / "diagnostics.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, args.out / "diagnostics.png")
    return 0



# -- D alone: can the discriminator learn what is correct, and what stops it -----------------------------------------
DISC_SETTINGS = {  # disc.* overrides on the short D (SHORT), trained from scratch on one pretrained G
    "short (issue)": [],
    "short, l2 0": ["disc.l2_reg=0"],
    "wide": WIDE_D,
    "wide, l2 0": [*WIDE_D, "disc.l2_reg=0"],
    "short, l2 0, 3 epochs": ["disc.l2_reg=0", "disc.epochs=3"],  # the paper's k = 3 epochs per d-step
    "wide, l2 0, 3 epochs": [*WIDE_D, "disc.l2_reg=0", "disc.epochs=3"],
    # the paper's D budget per d-step (Yu et al. Sec. 5 / Tuan et al. Supp. C): 10,000 + 10,000 pairs, k = 3 epochs
    "short, paper budget": ["disc.num_negatives=10000", "disc.epochs=3"],
    "short, l2 0, paper budget": ["disc.l2_reg=0", "disc.num_negatives=10000", "disc.epochs=3"],
    "wide, l2 0, paper budget": [*WIDE_D, "disc.l2_reg=0", "disc.num_negatives=10000", "disc.epochs=3"],
}


def disc_study(checkpoint: str, steps: int, n_probe: int, seed: int = 0, settings: list[str] | None = None) -> dict:
    """D trained alone for ``steps`` d-steps (the run's disc.* per step) on one pretrained generator (a checkpoint),
    for each of DISC_SETTINGS; every 5 d-steps its probe on validation inputs: D(real), D(fake), accuracy, AUC
    between correct and wrong samples."""
    import numpy as np
    import torch

    from rayseq.algos.seqgan import d_step
    from rayseq.checkpoint import load_checkpoint
    from rayseq.config import RunConfig, build_config
    from rayseq.distributed.actors.worker import RolloutWorker
    from rayseq.models import make_discriminator
    from rayseq.tasks import make_task
    from rayseq.types import PromptBatch, RolloutRequest

    ck = load_checkpoint(checkpoint)
    base = RunConfig.model_validate(ck["config"])
    task = make_task(base.task, base.reward)
    worker = RolloutWorker(base, 0)
    worker.set_weights({"generator": ck["learner"]["generator"], "rollout_policy": None}, 1)
    src, src_len = (a[:n_probe] for a in task.split("val"))
    probe_rollout = worker.sample(PromptBatch(src, src_len), RolloutRequest(max_len=3, temperature=1.0, seed=seed))
    correct = probe_rollout.score > 0.5
    s, sl = torch.from_numpy(src), torch.from_numpy(src_len)
    tgt = torch.from_numpy(task.sample_targets(np.random.default_rng(seed), src, src_len))
    out = {"checkpoint": checkpoint, "probe_precision_sampled": float(correct.mean()), "settings": {}}
    for name in settings or list(DISC_SETTINGS):
        overrides = DISC_SETTINGS[name]
        cfg = build_config(None, [*BASE, *SHORT, *overrides, "algo.name=seqgan", f"seed={seed}"])
        torch.manual_seed(seed)
        disc = make_discriminator(cfg, task)
        opt = torch.optim.Adam(disc.parameters(), lr=cfg.disc.lr)
        rng = np.random.default_rng(seed)
        curve, t0 = [], time.time()
        for k in range(1, steps + 1):
            n = cfg.disc.num_negatives
            neg = worker.sample(task.sample_prompts(rng, n), RolloutRequest(max_len=3, temperature=1.0, seed=seed + k))
            m = d_step(disc, opt, task.sample_prompts(rng, n, with_targets=True), neg, cfg.disc, task.specials.pad,
                       torch.device("cpu"), seed + k)
            if k % 5 == 0 or k == steps:
                with torch.no_grad():
                    three = torch.full((len(src),), 3)
                    d_fake = disc.score(torch.from_numpy(probe_rollout.tokens), three, s, sl).numpy()
                    d_real = disc.score(tgt, three, s, sl).numpy()
                curve.append({"d_steps": k, "train_accuracy": m["disc/accuracy"], "d_real": float(d_real.mean()),
                              "d_fake": float(d_fake.mean()),
                              "d_acc": float(0.5 * ((d_real > 0.5).mean() + (d_fake <= 0.5).mean())),
                              "d_fake_correct": float(d_fake[correct].mean()),
                              "d_fake_wrong": float(d_fake[~correct].mean()),
                              "d_std_fake": float(d_fake.std()),
                              "d_auc_correct": auc(d_fake[correct], d_fake[~correct])})
                print(name, curve[-1], flush=True)
        out["settings"][name] = {"overrides": overrides, "curve": curve, "wall_s": round(time.time() - t0, 1)}
    return out


def disc_table(study: dict) -> str:
    lines = ["| D | d-steps | D(real) | D(fake) | D acc | D on correct / wrong samples | std of D(fake) "
             "| AUC correct vs wrong |", "|" + "---|" * 8]
    for name, r in study["settings"].items():
        for p in r["curve"]:
            lines.append(f"| {name} | {p['d_steps']} | {p['d_real']:.3f} | {p['d_fake']:.3f} | {p['d_acc']:.3f} "
                         f"| {p['d_fake_correct']:.3f} / {p['d_fake_wrong']:.3f} | {p['d_std_fake']:.3f} "
                         f"| {_fmt(p['d_auc_correct'])} |")
    return "\n".join(lines)


def disc_sanity(steps: int = 300, seed: int = 0) -> list[dict]:
    """Can the short D (no L2) learn the counting rule at all? It is trained for ``steps`` minibatches of
    32 + 32 against negatives made wrong on purpose: the whole reply random, y2 ≠ x_t, or y3 ≠ N − t; then its
    accuracy on 1,000 + 1,000 fresh pairs."""
    import numpy as np
    import torch

    from rayseq.config import build_config
    from rayseq.losses import discriminator_loss
    from rayseq.models import make_discriminator
    from rayseq.tasks import make_task

    cfg = build_config(None, [*BASE, *SHORT, "algo.name=seqgan", "disc.l2_reg=0"])
    task = make_task(cfg.task, cfg.reward)
    rng = np.random.default_rng(seed)

    def batch(n: int, kind: str):
        p = task.sample_prompts(rng, n, with_targets=True)
        y = p.tgt.copy()
        shift = task.digit0 + 1 + rng.integers(0, 9, size=n)  # a different digit
        if kind == "random reply":
            y = rng.integers(0, 10, size=y.shape) + task.digit0
        elif kind == "wrong y2":
            y[:, 1] = (y[:, 1] - task.digit0 + shift - task.digit0) % 10 + task.digit0
        elif kind == "wrong y3":
            y[:, 2] = (y[:, 2] - task.digit0 + shift - task.digit0) % 10 + task.digit0
        return torch.from_numpy(p.src), torch.from_numpy(p.src_len), torch.from_numpy(y), torch.full((n,), 3)

    rows = []
    for kind in ("random reply", "wrong y2", "wrong y3"):
        torch.manual_seed(seed)
        disc = make_discriminator(cfg, task)
        opt = torch.optim.Adam(disc.parameters(), lr=cfg.disc.lr)
        for _ in range(steps):
            (s1, l1, yr, n1), (s2, l2, yf, n2) = batch(32, "real"), batch(32, kind)
            loss, _ = discriminator_loss(disc(yr, n1, s1, l1), disc(yf, n2, s2, l2))
            opt.zero_grad()
            loss.backward()
            opt.step()
        (s1, l1, yr, n1), (s2, l2, yf, n2) = batch(1000, "real"), batch(1000, kind)
        d_real, d_fake = disc.score(yr, n1, s1, l1).numpy(), disc.score(yf, n2, s2, l2).numpy()
        rows.append({"negatives": kind, "steps": steps, "d_real": float(d_real.mean()), "d_fake": float(d_fake.mean()),
                     "d_acc": float(0.5 * ((d_real > 0.5).mean() + (d_fake <= 0.5).mean()))})
        print(rows[-1], flush=True)
    return rows


# -- greedy precision and y1's near-ties ----------------------------------------------------------------------------
def y1_ties(run: str) -> dict:
    """On the validation inputs, for a run's generator (its newest checkpoint): the greedy reply's correctness after
    each forced y1 = k (y2, y3 greedy), the top-2 margin of π(y1 | x), and the greedy precision that results; a
    generator that knows the rule as well but breaks y1's near-ties differently has the same per-y1 accuracy and a
    different greedy precision."""
    import numpy as np
    import torch

    from rayseq.checkpoint import load_checkpoint
    from rayseq.config import RunConfig
    from rayseq.models import make_generator
    from rayseq.tasks import make_task

    ck = load_checkpoint(run)
    cfg = RunConfig.model_validate(ck["config"])
    task = make_task(cfg.task, cfg.reward)
    g = make_generator(cfg, task)
    g.load_state_dict(ck["learner"]["generator"])
    g.eval()
    src, src_len = task.split("val")
    n = len(src_len)
    with torch.no_grad():
        lens = torch.from_numpy(src_len)
        logits, _, state = g.decode_step(torch.full_like(lens, g.bos_id), g.encode(torch.from_numpy(src), lens))
        p1 = torch.softmax(logits, -1)[:, task.digit0 : task.digit0 + 10].numpy()
        correct = np.zeros((n, 10), dtype=bool)  # correct[i, k]: the greedy reply after y1 = k is right
        for k in range(10):
            y1 = torch.full((n,), task.digit0 + k)
            l2, _, s2 = g.decode_step(y1, state)
            y2 = l2.argmax(-1)
            y3 = g.decode_step(y2, s2)[0].argmax(-1)
            tokens = torch.stack([y1, y2, y3], 1).numpy()
            correct[:, k] = task.score(src, src_len, tokens, np.ones(tokens.shape, dtype=np.float32)) > 0.5
    order = np.argsort(p1, 1)
    first, second = order[:, -1], order[:, -2]
    margin = p1[np.arange(n), first] - p1[np.arange(n), second]
    tie = margin < 0.05
    return {"run": run, "iteration": int(ck["driver"]["iteration"]),
            "greedy_precision": float(correct[np.arange(n), first].mean()),
            "precision_second_y1": float(correct[np.arange(n), second].mean()),
            "share_margin_below_0.02": float((margin < 0.02).mean()), "share_margin_below_0.05": float(tie.mean()),
            "flips_among_ties": float((correct[np.arange(n), first] != correct[np.arange(n), second])[tie].mean()),
            "accuracy_given_y1": [float(correct[src_len > k, k].mean()) for k in range(10)]}


def y1_ties_table(rows: list[dict]) -> str:
    lines = ["| run | greedy precision | with the 2nd-likeliest y1 | margin < 0.02 / < 0.05 | correctness flips "
             "between the top-2 y1 (margin < 0.05) | greedy reply correct given y1 = 0, 1, ..., 9 |", "|" + "---|" * 6]
    for r in rows:
        name = "/".join(Path(r["run"]).parts[-2:])
        lines.append(f"| {name} | {r['greedy_precision']:.3f} | {r['precision_second_y1']:.3f} "
                     f"| {r['share_margin_below_0.02']:.2f} / {r['share_margin_below_0.05']:.2f} "
                     f"| {r['flips_among_ties']:.2f} | {' '.join(f'{a:.2f}' for a in r['accuracy_given_y1'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
