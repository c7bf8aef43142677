"""After a search: the trials table (best first), ``results.csv``, ``best.json``, the metric-against-iteration
plot, and the best trial's final checkpoint exported as a run directory that ``python -m rayseq.serve``
and :class:`rayseq.serving.model.ChatModel` load. Everything is written through
:class:`~rayseq.storage.RunStore`, so the experiment may live on a URI.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

import yaml

from rayseq.checkpoint import checkpoint_files, load_checkpoint
from rayseq.runlog import to_json
from rayseq.storage import RunStore
from rayseq.tuning.spec import Experiment
from rayseq.tuning.trainable import checkpoint_file

PLOT = "metric_vs_iteration.png"


def _finite(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def curve(exp: Experiment, trial_id: str, result):
    """A trial's evaluations of the metric against ``time_attr``, one row per value: from its run
    directory's metrics.parquet (the whole lineage of a PBT trial: its own rows up to a restored checkpoint,
    then the continuation), else from Tune's results. With ``algo_iteration`` the pretraining rows all have
    x = 0 and the last one wins: the evaluation that ends pretraining."""
    metric, x = exp.search.metric, exp.time_attr
    run = RunStore(f"{exp.path}/runs/{trial_id}")
    df = run.read_table("metrics.parquet").to_pandas() if run.exists("metrics.parquet") else None
    if df is not None and metric in df and not df.empty:
        train = df["stage"] == "train"
        first = df.loc[train, "iteration"].min() if train.any() else None
        df["algo_iteration"] = 0 if first is None else (df["iteration"] - first + 1).where(train, 0)
    else:
        df = result.metrics_dataframe
        if df is None or df.empty or metric not in df or x not in df:
            return None
        if "tune/eval_fresh" in df:
            df = df[df["tune/eval_fresh"] == 1.0]
    df = df[df[metric].notna()].drop_duplicates(x, keep="last").sort_values(x)
    return None if df.empty else df


def trial_rows(exp: Experiment, grid) -> list[dict]:
    """One row per trial, best first (trials without a finite metric last)."""
    metric, sign = exp.search.metric, (1 if exp.search.mode == "max" else -1)
    rows = []
    for r in grid:
        m = r.metrics or {}
        cfg_params = r.config or {}
        params = {k: cfg_params[k] for k in exp.param_columns() if k in cfg_params}
        params.update({k: cfg_params.get(src) for k, src in exp.ties.items()})
        trial_id = m.get("trial_id") or Path(r.path).name.removeprefix("trial_")
        df = curve(exp, trial_id, r)
        vals = [] if df is None else [v for v in df[metric].tolist() if _finite(v)]
        best = (max(vals) if sign > 0 else min(vals)) if vals else math.nan
        try:
            total = exp.trial_config(cfg_params, trial_id).train_stage_iters
        except Exception:  # a trial whose config cannot be rebuilt still gets its row
            total = None
        if r.error is not None:
            status = "ERROR"
        elif not m.get("done"):
            status = "UNFINISHED"
        elif total is not None and m.get("stage") == "train" and m.get("algo_iteration", 0) >= total:
            status = "COMPLETED"
        elif m.get("stage") != "train" and total == 0:
            status = "COMPLETED"
        else:
            status = "STOPPED EARLY"
        rows.append({
            "trial_id": trial_id, "status": status, **params,
            metric: m.get(metric, math.nan), f"best {metric}": best,
            "iteration": m.get("iteration"), "algo_iteration": m.get("algo_iteration"),
            "time_total_s": round(float(m.get("time_total_s", math.nan)), 1),
            "run_dir": f"{exp.path}/runs/{trial_id}", "tune_dir": r.path,
            "error": str(r.error).splitlines()[0][:200] if r.error is not None else "",
        })
    rows.sort(key=lambda row: (not _finite(row[metric]), -sign * row[metric] if _finite(row[metric]) else 0.0))
    for i, row in enumerate(rows, 1):
        row["rank"] = i
    return rows


def format_table(exp: Experiment, rows: list[dict]) -> str:
    metric = exp.search.metric
    cols = ["rank", "trial_id", *exp.param_columns(), metric, "iteration", "status"]

    def cell(v) -> str:
        if isinstance(v, float):
            return f"{v:.4g}" if math.isfinite(v) else "-"
        return "-" if v is None else str(v)

    table = [cols] + [[cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(t, widths)) for t in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_csv(store: RunStore, rows: list[dict]) -> None:
    if not rows:
        return
    keys = ["rank"] + [k for k in rows[0] if k != "rank"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    store.write_text("results.csv", buf.getvalue())


def plot_curves(exp: Experiment, grid, store: RunStore, best_trial: str | None) -> str | None:
    """The metric at each evaluation against the schedulers' clock (``time_attr``), one line per trial (the
    best one bold)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric, x = exp.search.metric, exp.time_attr
    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = 0
    for r in grid:
        trial_id = (r.metrics or {}).get("trial_id") or Path(r.path).name.removeprefix("trial_")
        df = curve(exp, trial_id, r)
        if df is None:
            continue
        best = trial_id == best_trial
        ax.plot(df[x], df[metric], marker=".", lw=2.5 if best else 1.0, alpha=1.0 if best else 0.6,
                label=f"{trial_id}{' (best)' if best else ''}", zorder=3 if best else 2)
        drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("algorithm iteration (0: the end of pretraining)" if x == "algo_iteration"
                  else "iteration (pretraining, then the algorithm)")
    ax.set_ylabel(metric)
    ax.set_title(f"{exp.name}: {metric} ({exp.search.mode}) per trial")
    ax.grid(alpha=0.3)
    if drawn <= 20:
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    store.write_bytes(PLOT, buf.getvalue())
    return store.display(PLOT)


def export_best(exp: Experiment, result, trial_id: str) -> str:
    """``<experiment>/best/``: the best trial's final checkpoint as a run directory (config.yaml,
    checkpoints/ckpt_*.pt, and summary.json / metrics.parquet when the trial wrote them)."""
    dest = RunStore(f"{exp.path}/best")
    if dest.exists():
        dest.fs.delete_dir_contents(dest.root, missing_dir_ok=True)
    with result.checkpoint.as_directory() as d:
        f = checkpoint_file(Path(d), result.checkpoint.path)
        for file in checkpoint_files(RunStore(f.parent), f.name):  # the head, its digests, the learner's files
            dest.write_bytes(f"checkpoints/{file}", (f.parent / file).read_bytes())
    ck = load_checkpoint(dest.display("checkpoints", f.name), training_state=False)
    dest.write_text("config.yaml", yaml.safe_dump(ck["config"], sort_keys=False))
    run = RunStore(f"{exp.path}/runs/{trial_id}")
    for name in ("summary.json", "metrics.parquet"):
        if run.exists(name):
            dest.write_bytes(name, run.read_bytes(name))
    dest.write_text("tune_trial.json", to_json({
        "experiment": exp.path, "trial_id": trial_id, "metric": exp.search.metric,
        "value": (result.metrics or {}).get(exp.search.metric), "iteration": ck["driver"]["iteration"],
        "tune_checkpoint": result.checkpoint.path,
    }))
    return dest.display()


def summarize(exp: Experiment, grid) -> dict:
    """Print the table, write results.csv, best.json, the plot and best/; returns best.json's content.

    The best trial is chosen on the search's ``val/*`` metric; then, once, its exported checkpoint is evaluated
    on the test set (``best.test``), printed beside the choice: reported, never selected on."""
    store = RunStore(exp.path)
    rows = trial_rows(exp, grid)
    print(format_table(exp, rows))
    write_csv(store, rows)
    metric = exp.search.metric
    best_row = rows[0] if rows and _finite(rows[0][metric]) else None
    plot = plot_curves(exp, grid, store, best_row["trial_id"] if best_row else None)
    out: dict = {"experiment": exp.path, "metric": metric, "mode": exp.search.mode, "trials": len(rows),
                 "results_csv": store.display("results.csv"), "plot": plot}
    if best_row is None:
        out["best"] = None
        store.write_text("best.json", to_json(out))
        return out
    result = next(r for r in grid if Path(r.path).name.removeprefix("trial_") == best_row["trial_id"]
                  or (r.metrics or {}).get("trial_id") == best_row["trial_id"])
    params = {k: best_row[k] for k in exp.param_columns() if k in best_row}
    out["best"] = {"trial_id": best_row["trial_id"], "value": best_row[metric], "params": params,
                   "iteration": best_row["iteration"], "status": best_row["status"],
                   "run_dir": best_row["run_dir"], "config": None, "export": None}
    if result.checkpoint is not None:
        from rayseq.distributed.actors.learner import evaluate_checkpoint

        out["best"]["export"] = export_best(exp, result, best_row["trial_id"])
        out["best"]["config"] = yaml.safe_load(RunStore(out["best"]["export"]).read_text("config.yaml"))
        out["best"]["test"] = evaluate_checkpoint(out["best"]["export"], "test")[0]
        print(format_best(exp, out["best"]))
    store.write_text("best.json", to_json(out))
    return out


def format_best(exp: Experiment, best: dict) -> str:
    """The chosen trial: its validation metric (what chose it) beside its test figures (what is reported)."""
    test = best.get("test") or {}
    shown = ", ".join(f"{k} = {v:.4g}" for k, v in test.items()
                      if _finite(v) and not re.search(r"_n\d+$", k))  # per-length counting metrics: in best.json
    return (f"best trial {best['trial_id']} (chosen on {exp.search.metric} = {best['value']:.4g}); "
            f"its test set: {shown or 'not evaluated'}")
