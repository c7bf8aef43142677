"""Credit over turns: does a turn-level advantage learn an episode task in fewer episodes than the trajectory-level
one, where the intermediate turns carry rewards of their own?

Two environments whose intermediate turns matter, each a policy trained from nothing (a Transformer of width 64, one
token per action):

- ``guess_warmer``: guess-the-number, 0-7 in 3 guesses (binary search wins 7 of 8), with the warmer/colder reward
  (``env.kwargs.warmer``: +0.1 for a guess nearer the secret than the one before, −0.1 otherwise) beside the hit's 1;
  targets 40% and 50% validation success in 200 iterations (a policy that guesses 3 distinct numbers at random:
  37.5%);
- ``gridworld``: a 3 × 3 text grid world from a random start to the far corner, 0.05 per move, 1 at the goal, at most
  6 moves; targets 80% and 90% in 80 iterations.

The estimators (``algo.turn_credit``, docs/algorithms/turn-credit.md), each at the same episodes per iteration:
RLOO with the trajectory-level advantage (every turn gets the episode's return minus the other episodes' mean: the
reference), RLOO with turn-level returns and the per-turn group baseline, RLOO with GiGPO's step grouping, the
actor-critic with turn-level GAE (its turn critic), and the actor-critic with its own token-level GAE (the control
for the critic: what turn-level GAE adds over the same algorithm's default). ``val/success`` on fixed episodes
every ``--eval-every`` iterations; the table gives, per environment, the median over seeds of the episodes sampled
until validation success first reached each target, the final test success, and whether each turn-level estimator
beat its control, the same algorithm's own credit (at the highest target either reached: the target reached by a
larger share of seeds, or as large a share in fewer episodes).

Run book (from the repository root)
  python benchmarks/turn_credit.py                          # 2 environments x 5 estimators x 3 seeds (results/)
  python benchmarks/turn_credit.py --seeds 0 --iters 40     # a quick look
  python benchmarks/turn_credit.py --report-only            # the table and plot again from the runs

Outputs in ``--out`` (default benchmarks/results): turn_credit.md (table), turn_credit.json (every run's curve,
command, commit, machine), turn_credit.png (validation success against episodes, mean over seeds); the runs in
``runs/turn_credit/``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks._compare import load_run, run_all  # noqa: E402
from benchmarks._report import write_report  # noqa: E402

ENVS = {  # name -> (overrides, target validation successes, iterations)
    "guess_warmer": (["env.name=guess_number", "env.kwargs.lo=0", "env.kwargs.hi=7", "env.kwargs.max_guesses=3",
                      "env.kwargs.warmer=0.1"], (0.4, 0.5), 200),
    "gridworld": (["env.name=gridworld", "env.kwargs.size=3", "env.kwargs.step_cost=0.05", "env.kwargs.max_steps=6",
                   "env.max_turns=6"], (0.8, 0.9), 80),
}
ESTIMATORS = {  # label -> overrides
    "trajectory (rloo)": ["algo.name=rloo", "algo.turn_credit=trajectory"],
    "turn_returns (rloo)": ["algo.name=rloo", "algo.turn_credit=turn_returns"],
    "gigpo (rloo)": ["algo.name=rloo", "algo.turn_credit=gigpo"],
    "turn_gae (actor_critic)": ["algo.name=actor_critic", "algo.turn_credit=turn_gae", "algo.gae_lambda=0.95"],
    # the actor-critic's own credit (GAE over tokens, its critic read at every token): the control for turn_gae
    "token_gae (actor_critic)": ["algo.name=actor_critic", "algo.turn_credit=trajectory", "algo.gae_lambda=0.95"],
}


def slug(label: str) -> str:
    """The run folder's name of an estimator: ``trajectory``, ``turn_gae``, ..."""
    return label.split()[0]
# each turn-level estimator against the same algorithm's own credit
CONTROL = {"turn_returns (rloo)": "trajectory (rloo)", "gigpo (rloo)": "trajectory (rloo)",
           "turn_gae (actor_critic)": "token_gae (actor_critic)"}


def base(args) -> list[str]:
    return ["env.max_action_tokens=1", "model.arch=transformer", "model.hidden_dim=64", "model.ff_dim=128",
            f"algo.lr={args.lr}", f"train.batch_size={args.batch}", f"train.eval_every={args.eval_every}",
            "train.checkpoint_every=0", f"task.val_size={args.val_size}", f"task.test_size={args.val_size}",
            *args.extra]


def variants(args) -> dict[str, list[str]]:
    """One run label per environment and estimator (``--estimators``): ``<env>__<estimator>``."""
    out = {}
    for env, (env_args, _, iters) in ENVS.items():
        for label, algo in ESTIMATORS.items():
            if args.estimators and slug(label) not in args.estimators:
                continue
            group = [f"algo.group_size={args.group}"] if "rloo" in label else []
            out[f"{env}__{slug(label)}"] = [*env_args, *algo, *group, f"train.iters={args.iters or iters}"]
    return out


def curve(run_dir: Path) -> dict:
    """Validation success at every evaluation (iteration 0: before the first update), test success."""
    r = load_run(run_dir, ["val/success"])
    start = r["summary"].get("pretrain_metrics", {}).get("val/success")
    val = [(0, float(start))] if start is not None else []
    val += [(int(i), float(v)) for i, v in r["curve"]["val/success"]]
    return {"val": val, "test_success": r["summary"]["metrics"].get("test/success")}


def episodes_to(run: dict, target: float, batch: int) -> int | None:
    return next((it * batch for it, v in run["val"] if v >= target), None)


def summarise(args, runs: dict) -> tuple[str, dict]:
    lines = ["# Credit over turns: episodes to a target success, turn-level against trajectory-level", ""]
    verdicts = {}
    for env, (_, targets, iters) in ENVS.items():
        iters = args.iters or iters
        head = ["estimator", "seeds", *[f"episodes to {t:.0%} (median; seeds that reached it)" for t in targets],
                "final val success", "test success", "beats its control?"]
        lines += [f"## {env} (targets: val success {', '.join(f'{t:.0%}' for t in targets)})", "",
                  "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        rows = {}
        for label in ESTIMATORS:
            mine = [runs[(env, label, s)] for s in args.seeds if (env, label, s) in runs]
            if not mine:
                continue
            rows[label] = {"n": len(mine), "final": statistics.mean(r["val"][-1][1] for r in mine),
                           "test": statistics.mean(r["test_success"] for r in mine if r["test_success"] is not None)}
            for t in targets:
                got = [x for x in (episodes_to(r, t, args.batch) for r in mine) if x is not None]
                rows[label][t] = (statistics.median(got) if got else None, len(got))
        for label, r in rows.items():
            verdict = beats(r, rows.get(CONTROL[label]), targets) if label in CONTROL else "(control)"
            verdicts[(env, label)] = verdict
            cells = [label, str(r["n"])]
            for t in targets:
                median, reached = r[t]
                cells.append(f"{median:,.0f} ({reached}/{r['n']})" if median is not None
                             else f"not within {iters * args.batch:,} (0/{r['n']})")
            lines.append("| " + " | ".join([*cells, f"{r['final']:.3f}", f"{r['test']:.3f}", verdict]) + " |")
        lines.append("")
    budget = ", ".join(f"{e} {args.iters or it}" for e, (_, _, it) in ENVS.items())
    lines += ["Beats its control: against the same algorithm's own credit (RLOO's trajectory level for turn_returns "
              "and gigpo, the actor-critic's token-level GAE for turn_gae), at the highest target either reached: a "
              "larger share of seeds reached it, or as large a share in fewer episodes (median over the seeds that "
              "did).", "",
              f"Budget: iterations ({budget}) of {args.batch} episodes (RLOO: groups of {args.group} from one seed; "
              f"the actor-critic: {args.batch} independent episodes), algo.lr={args.lr:g}, a Transformer of width 64 "
              f"from scratch, one token per action; val/success on {args.val_size} fixed episodes every "
              f"{args.eval_every} iterations, sampling at temperature 1; medians over seeds "
              f"{' '.join(map(str, args.seeds))}.", "",
              f"Runs: `python benchmarks/turn_credit.py --seeds {' '.join(map(str, args.seeds))}"
              + (f" --iters {args.iters}" if args.iters else "")
              + f" --batch {args.batch} --group {args.group} --lr {args.lr:g} --eval-every {args.eval_every}`."]
    return "\n".join(lines), {f"{e}/{label}": v for (e, label), v in verdicts.items()}


def beats(r: dict, ref: dict | None, targets: tuple) -> str:
    """Whether an estimator beat its control, at the highest target either reached: a larger share of its seeds
    reached it, or as large a share in fewer episodes (the median)."""
    if ref is None:
        return "-"
    for t in sorted(targets, reverse=True):
        (mine, n_mine), (theirs, n_theirs) = r[t], ref[t]
        if not n_mine and not n_theirs:
            continue
        at = f" (at {t:.0%})"
        share, their_share = n_mine / r["n"], n_theirs / ref["n"]
        if share != their_share:
            return ("yes" if share > their_share else "no") + at
        return ("tie" if mine == theirs else "yes" if mine < theirs else "no") + at
    return f"neither reached {min(targets):.0%}"


def plot(args, runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ENVS), figsize=(5.5 * len(ENVS), 4))
    for ax, (env, (_, targets, _)) in zip(axes, ENVS.items()):
        for j, label in enumerate(ESTIMATORS):
            mine = [runs[(env, label, s)]["val"] for s in args.seeds if (env, label, s) in runs]
            if not mine:
                continue
            its = [it for it, _ in mine[0]]
            mean = [statistics.mean(dict(c).get(it, float("nan")) for c in mine) for it in its]
            ax.plot([it * args.batch for it in its], mean, "-o", ms=3, color=f"C{j}", label=label)
        for t in targets:
            ax.axhline(t, ls="--", c="gray", lw=0.8)
        ax.set_title(env)
        ax.set_xlabel("episodes sampled")
        ax.set_ylabel("val/success (mean over seeds)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iters", type=int, default=None, help="iterations of every run (default: each environment's)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--val-size", type=int, default=128)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--estimators", nargs="+", choices=[slug(label) for label in ESTIMATORS],
                   help="run only these (default: all); the report reads every run there is")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--runs", type=Path, default=REPO / "runs" / "turn_credit")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--fresh", action="store_true", help="run again the runs that finished")
    p.add_argument("extra", nargs="*", help="more overrides for every run (key=value)")
    args = p.parse_args(argv)

    if not args.report_only:
        run_all("", base(args), [], args.seeds, args.runs, pretrain_algo=None, jobs=args.jobs, fresh=args.fresh,
                variants=variants(args))
    runs = {}
    for env in ENVS:
        for label in ESTIMATORS:
            for s in args.seeds:
                d = args.runs / f"{env}__{slug(label)}-s{s}"
                if (d / "summary.json").is_file():
                    runs[(env, label, s)] = curve(d)
    text, verdicts = summarise(args, runs)
    args.out.mkdir(parents=True, exist_ok=True)
    if runs:
        plot(args, runs, args.out / "turn_credit.png")
    write_report(args.out, "turn_credit", text, {
        "runs": [{"env": e, "estimator": label, "seed": s, **r} for (e, label, s), r in runs.items()],
        "verdicts": verdicts, "targets": {e: t for e, (_, t, _) in ENVS.items()},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}})
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
