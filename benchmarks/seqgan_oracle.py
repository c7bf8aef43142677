"""SeqGAN on the synthetic oracle task: NLL-oracle of MLE, SeqGAN, SeqGAN-PPO and SeqGAN-PPO-dynamic
beside SeqGAN's Table 1 (Yu et al. 2017: random 10.310, MLE 9.038, SeqGAN 8.736) and its Fig. 2
(NLL-oracle against training), with SeqGAN's original oracle (pass its .npz: ``--oracle``).

Run book (from the repository root)
  python benchmarks/seqgan_oracle.py --oracle ../shared/data/seqgan_oracle.npz              # quick schedule, 3 seeds
  python benchmarks/seqgan_oracle.py --oracle PATH --config tune_configs/seqgan_oracle.yaml  # the paper's (GPU)
  python benchmarks/seqgan_oracle.py --oracle PATH --report-only                             # tables/plots again

Same start for every algorithm of a seed: one run pretrains (MLE + D pretraining, ``train.iters=0``), and
each algorithm starts from its checkpoint (``train.init_from``); the MLE row is that pretrained model.
Runs are in-process, two at a time (benchmarks/_compare.py).

``seqgan_critic`` replaces the N×T Monte-Carlo continuations by a learned critic (the SeqGAN paper's future
work); the second table gives what estimating Q costs per g-step for each algorithm (generator steps of
continuations, discriminator evaluations, measured seconds) and seqgan_oracle_wallclock.png plots NLL-oracle
against the adversarial stage's wall-clock.

Outputs in ``--out`` (default benchmarks/results): seqgan_oracle.md / .json, seqgan_oracle_nll.png,
seqgan_oracle_wallclock.png, runs under runs/seqgan_oracle/.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._compare import load_run, mean_std, parse_args, plot_curves, run_all  # noqa: E402
from benchmarks._report import write_report  # noqa: E402

ALGOS = ["seqgan", "seqgan_ppo", "seqgan_ppo_dynamic", "seqgan_critic"]
PAPER = {"random": 10.310, "mle": 9.038, "seqgan": 8.736}  # SeqGAN Table 1 (NLL-oracle)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--oracle", required=True, help="the oracle .npz (SeqGAN's: shared/data/seqgan_oracle.npz)")
    ap.add_argument("--config", default="tune_configs/seqgan_oracle_quick.yaml")
    ap.add_argument("--algos", nargs="+", default=ALGOS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--fresh", action="store_true", help="rerun finished runs too")
    args, overrides = parse_args(ap, argv)
    runs_dir = args.out / "runs" / "seqgan_oracle"
    overrides = [f"task.oracle_path={Path(args.oracle).resolve()}", *overrides]
    if not args.report_only:
        run_all(args.config, overrides, args.algos, args.seeds, runs_dir, pretrain_algo="seqgan", jobs=args.jobs,
                fresh=args.fresh)
    rows, curves, payload = [], {}, {"config": args.config, "overrides": overrides, "runs": {}}
    cost_rows, clock = [], {}
    for algo in ["mle", *args.algos]:
        if algo != "mle":
            cost = _q_cost(runs_dir, algo, args.seeds)
            if cost:
                cost_rows.append(cost["row"])
                clock[algo] = cost["clock"]
                payload.setdefault("q_cost", {})[algo] = cost["json"]
        nll, nll_test, it_s = [], [], []
        for s in args.seeds:
            d = runs_dir / (f"pretrain-s{s}" if algo == "mle" else f"{algo}-s{s}")
            if not (d / "summary.json").is_file():
                continue
            r = load_run(d, ["val/nll_oracle"])  # curves on validation; figures on the test samples, at the end
            m = r["summary"]["pretrain_metrics" if algo == "mle" else "metrics"]
            nll.append(m["test/nll_oracle"])
            nll_test.append(m["test/nll_data"])
            if algo != "mle":
                it_s.append(r["train_iter_s"])
                pre = load_run(runs_dir / f"pretrain-s{s}", ["val/nll_oracle"])["curve"]["val/nll_oracle"][-1:]
                curves.setdefault(algo, []).append(pre + r["curve"]["val/nll_oracle"])  # from the MLE end point
            else:
                curves.setdefault("mle", []).append(r["curve"]["val/nll_oracle"])
            payload["runs"][f"{algo}-s{s}"] = {"nll_oracle": nll[-1], "nll_test": nll_test[-1]}
        paper = PAPER.get(algo)
        rows.append((algo, mean_std(nll), mean_std(nll_test), f"{paper:.3f}" if paper else "-",
                     f"{statistics.median(it_s):.1f}" if it_s else "-", str(len(nll))))
    table = _table(rows, args) + "\n\n" + _cost_table(cost_rows)
    _plot(curves, args.out / "seqgan_oracle_nll.png")
    plot_curves(clock, args.out / "seqgan_oracle_wallclock.png", ylabel="NLL-oracle",
                title="NLL-oracle against adversarial wall-clock", xlabel="seconds since the adversarial stage began",
                markers=True)
    write_report(args.out, "seqgan_oracle", table, payload)
    return 0


def _table(rows, args) -> str:
    head = ("algorithm", "NLL-oracle (ours, mean ± sd)", "NLL-test", "NLL-oracle (paper)", "s / adv. iteration",
            "seeds")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines.append("")
    lines.append(f"Schedule: `{args.config}`; seeds {args.seeds}; the MLE row is the pretrained model every algorithm "
                 "of a seed starts from. Paper: SeqGAN Table 1 (random generator 10.310).")
    return "\n".join(lines)


def _q_cost(runs_dir: Path, algo: str, seeds: list[int]) -> dict | None:
    """Per g-step cost of Q: continuation steps and D evaluations (logged; for runs made before they were
    logged, SeqGAN's closed form N·B·T(T−1)/2 and N·B·(T−1) + B), and the measured seconds; plus the
    NLL-oracle against cumulative wall-clock of each seed."""
    import pyarrow.parquet as pq
    import yaml

    gen, dev, secs, clock, totals = [], [], [], [], []
    for s in seeds:
        d = runs_dir / f"{algo}-s{s}"
        if not (d / "summary.json").is_file():
            continue
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        rows = [r for r in pq.read_table(d / "metrics.parquet").to_pylist() if r["stage"] == "train"]
        N, B, T = cfg["algo"].get("mc_rollouts", 0), cfg["train"]["batch_size"], cfg["task"]["seq_len"]
        run = {"gen": 0.0, "d": 0.0, "s": 0.0}
        for r in rows:
            mc = algo != "seqgan_critic"
            g = r.get("rollout/extra_gen_steps") or (N * B * T * (T - 1) // 2 if mc else 0)
            e = r.get("rollout/d_evals") or (N * B * (T - 1) + B if mc else B)
            gen.append(g)
            dev.append(e)
            secs.append(r["time/mc_total_s"])
            if r.get("critic/warmup"):  # critic-only batches exist only to estimate Q: all of it counts
                g, sec = r["rollout/tokens"], r["time/iter_s"]
            else:
                sec = r["time/mc_total_s"]
            run = {"gen": run["gen"] + g, "d": run["d"] + e, "s": run["s"] + sec}
        totals.append(run)
        pre = load_run(runs_dir / f"pretrain-s{s}", ["val/nll_oracle"])["curve"]["val/nll_oracle"][-1:]
        t, curve = 0.0, [(0.0, pre[0][1])] if pre else []
        for r in rows:
            t += r["time/iter_s"]
            if r.get("val/nll_oracle") is not None:
                curve.append((t, r["val/nll_oracle"]))
        clock.append(curve)
    if not gen:
        return None
    med = {"gen_steps": statistics.median(gen), "d_evals": statistics.median(dev), "seconds": statistics.median(secs),
           "run_gen_steps": statistics.median(t["gen"] for t in totals),
           "run_d_evals": statistics.median(t["d"] for t in totals),
           "run_seconds": statistics.median(t["s"] for t in totals)}
    row = (algo, f"{med['gen_steps']:,.0f}", f"{med['d_evals']:,.0f}", f"{med['seconds']:.2f}",
           f"{med['run_gen_steps']:,.0f}", f"{med['run_d_evals']:,.0f}", f"{med['run_seconds']:.1f}")
    return {"row": row, "clock": clock, "json": med}


def _cost_table(rows) -> str:
    head = ("algorithm", "continuation steps / g-step", "D evaluations / g-step", "seconds for Q / g-step",
            "generator steps for Q / run", "D evaluations / run", "seconds for Q / run")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    by = {r[0]: r for r in rows}
    if "seqgan" in by and "seqgan_critic" in by:
        def num(algo, i):
            return float(by[algo][i].replace(",", ""))

        ratio = [num("seqgan", i) / max(num("seqgan_critic", i), 1e-9) for i in (4, 5, 6)]
        lines.append("")
        lines.append(f"Per run, SeqGAN-critic against Monte-Carlo SeqGAN: {ratio[0]:.0f}× fewer generator steps, "
                     f"{ratio[1]:.0f}× fewer D evaluations, {ratio[2]:.0f}× less time spent on Q. A run's Q cost is "
                     "the continuations (SeqGAN) or the critic-only warm-up batches, whole iterations (SeqGAN-critic), "
                     "plus the D evaluations of every g-step; medians over seeds. The counts are exact; the seconds "
                     "come from runs made at different times on the shared machine.")
    return "\n".join(lines)


def _plot(curves: dict, path: Path) -> None:
    plot_curves(curves, path, ylabel="NLL-oracle", title="NLL-oracle during training (SeqGAN Fig. 2 analogue)",
                hlines=[(PAPER["mle"], ":", "paper MLE 9.038"), (PAPER["seqgan"], "--", "paper SeqGAN 8.736")])


if __name__ == "__main__":
    raise SystemExit(main())
