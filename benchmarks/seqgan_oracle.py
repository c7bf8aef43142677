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

Outputs in ``--out`` (default benchmarks/results): seqgan_oracle.md / .json, seqgan_oracle_nll.png,
runs under runs/seqgan_oracle/.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._compare import load_run, mean_std, plot_curves, run_all  # noqa: E402
from benchmarks._report import write_report  # noqa: E402

ALGOS = ["seqgan", "seqgan_ppo", "seqgan_ppo_dynamic"]
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
    args, overrides = ap.parse_known_args(argv)
    runs_dir = args.out / "runs" / "seqgan_oracle"
    overrides = [f"task.oracle_path={Path(args.oracle).resolve()}", *overrides]
    if not args.report_only:
        run_all(args.config, overrides, args.algos, args.seeds, runs_dir, pretrain_algo="seqgan", jobs=args.jobs,
                fresh=args.fresh)
    rows, curves, payload = [], {}, {"config": args.config, "overrides": overrides, "runs": {}}
    for algo in ["mle", *args.algos]:
        nll, nll_test, it_s = [], [], []
        for s in args.seeds:
            d = runs_dir / (f"pretrain-s{s}" if algo == "mle" else f"{algo}-s{s}")
            if not (d / "summary.json").is_file():
                continue
            r = load_run(d, ["eval/nll_oracle"])
            m = r["summary"]["pretrain_metrics" if algo == "mle" else "metrics"]
            nll.append(m["eval/nll_oracle"])
            nll_test.append(m["eval/nll_test"])
            if algo != "mle":
                it_s.append(r["train_iter_s"])
                pre = load_run(runs_dir / f"pretrain-s{s}", ["eval/nll_oracle"])["curve"]["eval/nll_oracle"][-1:]
                curves.setdefault(algo, []).append(pre + r["curve"]["eval/nll_oracle"])  # from the MLE end point
            else:
                curves.setdefault("mle", []).append(r["curve"]["eval/nll_oracle"])
            payload["runs"][f"{algo}-s{s}"] = {"nll_oracle": nll[-1], "nll_test": nll_test[-1]}
        paper = PAPER.get(algo)
        rows.append((algo, mean_std(nll), mean_std(nll_test), f"{paper:.3f}" if paper else "-",
                     f"{statistics.median(it_s):.1f}" if it_s else "-", str(len(nll))))
    table = _table(rows, args)
    _plot(curves, args.out / "seqgan_oracle_nll.png")
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


def _plot(curves: dict, path: Path) -> None:
    plot_curves(curves, path, ylabel="NLL-oracle", title="NLL-oracle during training (SeqGAN Fig. 2 analogue)",
                hlines=[(PAPER["mle"], ":", "paper MLE 9.038"), (PAPER["seqgan"], "--", "paper SeqGAN 8.736")])


if __name__ == "__main__":
    raise SystemExit(main())
