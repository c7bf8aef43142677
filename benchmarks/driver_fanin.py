"""The driver's own cost per iteration against the number of rollout workers and shards: the fan-in of the groups'
waits, before and after they took every result from one queue.

What is timed is the real code path the driver runs in an iteration, on light stand-in actors
(``@ray.remote(num_cpus=0)``, no torch: :class:`StandIn` answers what the groups call at once, with a tiny result):

- ``sample``: ``RolloutGroup.sample`` waited for (``_sample_waited``), each shard sent on to a scorer as soon as it is
  sampled (``ScorerGroup`` scoring rollouts): ``ActorManager.as_completed`` over the sampling calls, then the scoring
  calls waited for. What an iteration runs where the driver needs the samples (an algorithm that scores them itself,
  dynamic sampling's ``sample_scored``, SeqGAN's Y ~ G).
- ``mc``: that, then ``RolloutGroup.run_on_shards`` on the shards and ``ScorerGroup.run_on_pending`` on its calls
  (SeqGAN's Monte-Carlo continuations, each shard's scored as it arrives): a second ``as_completed`` over the
  workers' calls, and the scorers' calls waited for.

- ``waits``: the fan-in alone: ``as_completed`` over the sampling calls of ``sample`` once they have all finished
  (sent and waited for untimed), what the previous and the current waits cost without the sending around them.

The default iteration (``sample(wait=False)``, the learner fetching the shards itself) does not wait on the driver at
all; what it costs the driver is the sending, which both paths include.

N actors serve both groups; ``--shards-per-actor k`` makes each group N·k members (the N actors repeated k times), so
one iteration sends N·k sampling calls and N·k scoring calls: up to 5,000 shards per iteration at N = 100, k = 50.

"before" runs the same groups with the previous waits (:class:`PreviousActorManager`, a copy of the code it
replaced, kept here as the baseline: ``as_completed`` one ``ray.wait(num_returns=1)`` over the list of calls still
out per arrival, N + (N − 1) + ... + 1 look-ups; the other waits one ``ray.get`` per call); "after" with the current
``ActorManager`` (one completion callback per call, the arrivals taken from one queue). Before and after alternate
within each repeat (which goes first alternates too); the figure is the median over repeats of the driver process's
CPU time per iteration (``time.process_time``: its Python thread and Ray's threads in it, what the driver spends;
the wall clock is recorded too, and includes the stand-ins' own time on shared cores). A linear and a quadratic fit
of CPU time against shards per iteration are reported for each, with the share of the quadratic term at the largest
size and a log-log exponent, and what the fits predict at 1,000 workers (an extrapolation: labelled so).

Run book (from the repository root):

    python benchmarks/driver_fanin.py               # sample and waits, N = 1..100, k = 1, 10, 50:
                                                    #   results/driver_fanin.{md,json,png}
    python benchmarks/driver_fanin.py --paths mc    # SeqGAN's path (about as long again)
    python benchmarks/driver_fanin.py --quick       # a smoke run of every path (tests/benchmarks run it)

Time: about 10 minutes on 2 cores for the default run; memory: ~130 MB per stand-in actor (100 of them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# the stand-in actors import this module: nothing heavier than numpy and rayseq.types at the top (no torch)


class StandIn:
    """A rollout worker and a scorer in one light actor, duck-typed to what the groups call: the two-object calls
    (``sample_shard``, ``score_rollout_shard``, ``run_shard``) answer at once with a tiny result and a small info."""

    def pid(self) -> int:
        return os.getpid()

    def footprint(self) -> dict:
        """The actor's resident memory (MB, Linux) and whether torch was ever imported in it."""
        rss = None
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024
        return {"rss_mb": rss, "torch": "torch" in sys.modules}

    def set_weights(self, weights, version: int) -> int:
        return version

    def sample_shard(self, prompts, request, score: bool = True, weights=None, version: int = -1,
                     report_score: bool = False) -> tuple:
        return prompts.src_len, {"rows": len(prompts), "sample_s": 0.0}

    def score_rollout_shard(self, rollout, sampler=None, report_score: bool = False) -> tuple:
        return rollout, {"rows": len(rollout)}

    def run_shard(self, fn, *args, weights=None, version: int = -1, **kwargs) -> tuple:
        return fn(self, *args, **kwargs)


def continuations(actor, shard, rollouts: int, seed: int | None = None) -> tuple:
    """Stand-in of an algorithm's function on a worker's shard (SeqGAN's Monte-Carlo continuations)."""
    return shard, {"rows": len(shard), "seed": seed}


def score_continuations(actor, data) -> tuple:
    """Stand-in of an algorithm's function on the scorers (SeqGAN's Q from D)."""
    return data, {"rows": len(data)}


def previous_manager_class():
    """:class:`~rayseq.distributed.groups.manager.ActorManager` with the waits it had before (kept here as the measured
    "before", as they were): ``as_completed`` a ``ray.wait`` over the list of every call still out, for each arrival;
    ``wait_all`` a ``ray.get`` per call, one after another (the groups' list of ``manager.wait(call)``)."""
    from rayseq.distributed.groups.manager import ActorManager

    class PreviousActorManager(ActorManager):
        def as_completed(self, calls: list):
            waiting = {call.refs[1]: call for call in calls}
            while waiting:
                (ready,), _ = self.ray.wait(list(waiting), num_returns=1)
                call = waiting.pop(ready)
                yield call, self.wait(call)

        def wait_all(self, calls: list) -> list:
            return [self.wait(call) for call in calls]

    return PreviousActorManager


class NoPlacement:
    """The placement a stand-in group needs only after a crash (none here): no node is lost."""

    def check_learner(self, wait_s: float = 0) -> None:
        return None

    def lost_node(self, bundle: int):
        return None


def stand_in_config(n: int, scored_remotely: bool) -> SimpleNamespace:
    """What the rollout and scorer groups read of a run's config, for ``n`` stand-in members (no algorithm, no
    task)."""
    from rayseq.config import RolloutConfig

    return SimpleNamespace(rollout=RolloutConfig(num_workers=n), algorithm=SimpleNamespace(own_reward=True),
                           rollouts_scored_remotely=scored_remotely)


def build_groups(ray, manager, actors: list, k: int):
    """A RolloutGroup and a ScorerGroup of N·k members (``actors`` repeated k times) on ``manager``, the scorers
    scoring the rollouts, with a published weights ref that every sampling call carries."""
    from rayseq.distributed.groups import RolloutGroup, ScorerGroup

    members = list(actors) * k
    cfg = stand_in_config(len(members), scored_remotely=True)
    scorer = ScorerGroup(cfg, None, manager=manager, actors=members)
    rollout = RolloutGroup(cfg, None, scorer, manager=manager, actors=members)
    rollout.publish(ray.put({"w": 0}), 1)
    return rollout, scorer


def one_iteration(path: str, rollout, scorer, prompts, request, seed: int) -> tuple[int, float, float]:
    """The driver's part of one iteration on ``path``: (the number of shards it handled, driver CPU s, wall s).
    ``sample`` and ``mc`` are timed whole; ``waits`` times only ``as_completed`` over sampling calls that have all
    finished (sent, then waited for with one untimed ``ray.wait``): the fan-in alone, without the sending."""
    c0, t0 = time.process_time(), time.perf_counter()
    if path == "waits":
        from rayseq.distributed.groups.calls import Call

        ray = rollout._manager.ray
        samples, _, _ = rollout._calls(prompts, request)
        calls = [Call(rollout, i, send(w), send) for i, (w, send) in enumerate(zip(rollout.actors, samples))]
        ray.wait([c.refs[1] for c in calls], num_returns=len(calls), fetch_local=False)
        c0, t0 = time.process_time(), time.perf_counter()
        done = sum(1 for _ in rollout._manager.as_completed(calls))
        return done, time.process_time() - c0, time.perf_counter() - t0
    shards = rollout.sample(prompts, request)
    if path == "mc":
        pending = rollout.run_on_shards(continuations, shards, 2, seed=seed)
        shards, _ = scorer.run_on_pending(score_continuations, pending)
    return len(shards), time.process_time() - c0, time.perf_counter() - t0


def measure(ray, actors: list, sizes: list[tuple[int, int]], paths: list[str], repeats: int) -> list[dict]:
    """Median driver CPU and wall ms per iteration of each (path, N, k, before/after), before and after alternating
    within each repeat (which goes first alternates too). One warm-up iteration per path and implementation first
    (the actors' first calls of each method)."""
    import numpy as np

    from rayseq.distributed.groups.manager import ActorManager
    from rayseq.types import PromptBatch, RolloutRequest

    managers = {"before": previous_manager_class()(ray, NoPlacement()), "after": ActorManager(ray, NoPlacement())}
    request = RolloutRequest(max_len=8, seed=1)

    def prompts_for(shards: int):
        return PromptBatch(np.ones((shards, 4), np.int64), np.full(shards, 4, np.int64))

    rows = []
    for path in paths:
        n, k = min(sizes, key=lambda s: s[0] * s[1])
        for m in managers.values():
            one_iteration(path, *build_groups(ray, m, actors[:n], k), prompts_for(n * k), request, 0)
        for n, k in sizes:
            shards = n * k
            prompts = prompts_for(shards)
            groups = {impl: build_groups(ray, m, actors[:n], k) for impl, m in managers.items()}
            times: dict = {impl: ([], []) for impl in managers}
            for rep in range(repeats):
                for impl in (("before", "after") if rep % 2 == 0 else ("after", "before")):
                    done, cpu, wall = one_iteration(path, *groups[impl], prompts, request, rep)
                    assert done == shards, (done, shards)
                    times[impl][0].append(cpu * 1e3)
                    times[impl][1].append(wall * 1e3)
            for impl, (cpus, walls) in times.items():
                rows.append({"path": path, "impl": impl, "actors": n, "per_actor": k, "shards": shards,
                             "cpu_ms": statistics.median(cpus), "wall_ms": statistics.median(walls),
                             "cpu_ms_all": cpus, "wall_ms_all": walls})
                print(f"{path:6s} {impl:6s} N={n:4d} k={k:3d} shards={shards:5d}  driver cpu "
                      f"{rows[-1]['cpu_ms']:9.1f} ms  wall {rows[-1]['wall_ms']:9.1f} ms", flush=True)
    return rows


def fits(xs: list[float], ys: list[float]) -> dict:
    """Least-squares fits of ``ys`` (driver ms) on ``xs`` (shards per iteration): linear (a + b·x) and quadratic
    (a + b·x + c·x²), each with R²; the quadratic term's share of the quadratic fit at the largest x; and the exponent
    p of a power law y ∝ x^p fitted in log-log over the points with x ≥ 10 (1: linear, 2: quadratic)."""
    import numpy as np

    x, y = np.asarray(xs, float), np.asarray(ys, float)
    out: dict = {}
    for name, deg in (("linear", 1), ("quadratic", 2)):
        coef = np.polyfit(x, y, deg)
        resid = y - np.polyval(coef, x)
        ss = float(((y - y.mean()) ** 2).sum()) or 1.0
        out[name] = {"coef": [float(c) for c in coef[::-1]], "r2": 1.0 - float((resid ** 2).sum()) / ss}
    a, b, c = out["quadratic"]["coef"]
    top = float(x.max())
    total = a + b * top + c * top * top
    out["quadratic_share_at_max"] = c * top * top / total if total else 0.0
    big = x >= top / 10
    out["loglog_exponent"] = (float(np.polyfit(np.log(x[big]), np.log(y[big]), 1)[0]) if big.sum() >= 2 else None)
    # the fit the data needs: the quadratic one where its x² term is a quarter or more of the cost at the largest x
    out["grows"] = "quadratically" if out["quadratic_share_at_max"] > 0.25 else "linearly"
    return out


EXTRAPOLATE = (1000, 5000, 50_000)  # shards per iteration: 1,000 workers with 1, 5 and 50 calls each


def predict(fit: dict, shards: float) -> float:
    """Driver ms at ``shards`` per iteration from the fit the data needs (``fit["grows"]``)."""
    coef = (fit["quadratic"] if fit["grows"] == "quadratically" else fit["linear"])["coef"]
    return sum(c * shards ** i for i, c in enumerate(coef))


def summarize(rows: list[dict]) -> dict:
    """Fits of driver CPU ms against shards per iteration, per path and before/after, with what they predict at
    1,000 workers (:data:`EXTRAPOLATE`: extrapolations beyond the measured actors, and beyond the measured shards at
    50,000)."""
    out = {}
    for path in sorted({r["path"] for r in rows}):
        for impl in ("before", "after"):
            pts = [r for r in rows if r["path"] == path and r["impl"] == impl]
            if len({r["shards"] for r in pts}) < 3:
                continue
            fit = fits([r["shards"] for r in pts], [r["cpu_ms"] for r in pts])
            fit["extrapolated_ms"] = {str(s): predict(fit, s) for s in EXTRAPOLATE}
            out[f"{path}/{impl}"] = fit
    return out


def table(rows: list[dict], summary: dict, footprint: dict | None = None) -> str:
    by = {(r["path"], r["actors"], r["per_actor"], r["impl"]): r for r in rows}
    repeats = max(len(r["cpu_ms_all"]) for r in rows)
    lines = [f"Driver CPU ms per iteration (median of {repeats}; wall ms in brackets) with N stand-in actors, k shards "
             "each (path `waits`: the fan-in alone, not the sending). \"before\": the previous waits (a ray.wait "
             "over the calls still out per arrival); \"after\": the current ones (one completion callback per call).",
             "",
             "| path | N actors | k per actor | shards | before ms | after ms | before / after | after ms per shard |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for path, n, k in sorted({(r["path"], r["actors"], r["per_actor"]) for r in rows},
                             key=lambda t: (t[0], t[1] * t[2], t[1])):
        b, a = by[path, n, k, "before"], by[path, n, k, "after"]
        lines.append(f"| {path} | {n} | {k} | {n * k:,} | {b['cpu_ms']:.1f} ({b['wall_ms']:.0f}) | "
                     f"{a['cpu_ms']:.1f} ({a['wall_ms']:.0f}) | {b['cpu_ms'] / max(a['cpu_ms'], 1e-9):.2f}x | "
                     f"{a['cpu_ms'] / (n * k):.2f} |")
    lines += ["", "Fits of driver CPU ms against shards per iteration S: linear a + b·S, quadratic a + b·S + c·S² "
              "(R² each; the c·S² term's share of the quadratic fit at the largest S), the log-log exponent p of "
              "ms ∝ S^p over the top decade (S ≥ max/10):", "",
              "| path | code | b: ms per shard | R² | c: ms per shard² | R² | c·S² share | p | grows |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for key, fit in summary.items():
        path, impl = key.split("/")
        lin, quad, p = fit["linear"], fit["quadratic"], fit["loglog_exponent"]
        lines.append(f"| {path} | {impl} | {lin['coef'][1]:.3f} | {lin['r2']:.3f} | {quad['coef'][2]:.2e} | "
                     f"{quad['r2']:.3f} | {fit['quadratic_share_at_max']:.0%} | "
                     f"{'–' if p is None else f'{p:.2f}'} | {fit['grows']} |")
    lines += ["", "Extrapolated from those fits (the one each row grows by) to 1,000 workers, not measured: driver CPU "
              "s per iteration at 1,000 workers with 1, 5 and 50 calls each:", "",
              "| path | code | " + " | ".join(f"{s:,} shards" for s in EXTRAPOLATE) + " |",
              "|---|---|" + "---:|" * len(EXTRAPOLATE)]
    for key, fit in summary.items():
        path, impl = key.split("/")
        lines.append(f"| {path} | {impl} | " + " | ".join(f"{fit['extrapolated_ms'][str(s)] / 1e3:.1f}"
                                                         for s in EXTRAPOLATE) + " |")
    if footprint:
        lines += ["", f"Stand-in actors: resident memory median {footprint['rss_mb_median']:.0f} MB (max "
                  f"{footprint['rss_mb_max']:.0f} MB), torch imported in {footprint['with_torch']} of "
                  f"{footprint['actors']}; {footprint['start_s']:.1f} s to start them."]
    return "\n".join(lines)


def plot(rows: list[dict], summary: dict, path_png: Path) -> bool:
    """Driver CPU ms against shards per iteration (with the fits), and ms per shard (log S), per path; False if
    matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot", flush=True)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = sorted({r["path"] for r in rows})
    fig, axes = plt.subplots(len(paths), 2, figsize=(11, 4 * len(paths)), squeeze=False)
    for (ax, ax_per), path in zip(axes, paths):
        for impl, color in (("before", "tab:red"), ("after", "tab:blue")):
            pts = sorted((r["shards"], r["cpu_ms"]) for r in rows if r["path"] == path and r["impl"] == impl)
            xs, ys = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts])
            ax.plot(xs, ys, "o", color=color, label=impl)
            ax_per.plot(xs, ys / xs, "o-", color=color, label=impl)
            if (fit := summary.get(f"{path}/{impl}")) is not None:
                grid = np.linspace(1, xs.max(), 200)
                ax.plot(grid, [predict(fit, g) for g in grid], "-", color=color, alpha=0.6,
                        label=f"{impl}: {'quadratic' if fit['grows'] == 'quadratically' else 'linear'} fit")
        ax.set(xlabel="shards per iteration (N actors × k each)", ylabel="driver CPU ms per iteration",
               title=f"{path}: the driver's time per iteration")
        ax_per.set(xscale="log", xlabel="shards per iteration", ylabel="driver CPU ms per shard",
                   title=f"{path}: per shard (flat = linear)")
        ax_per.set_ylim(bottom=0)
        ax.legend()
        ax_per.legend()
    fig.tight_layout()
    fig.savefig(path_png, dpi=110)
    plt.close(fig)
    return True


def provenance(record: dict) -> str:
    m = record["machine"]
    return "\n".join([
        f"Command: `{record['command']}`  ",
        f"Commit: {record['commit']}  ",
        f"Machine: {m['cpus']} CPUs ({m['cpu']}), {m['platform']}, Python {m['python']}  ",
        f"Date: {record['date']}"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--actors", type=int, nargs="+", default=[1, 4, 16, 32, 64, 100])
    ap.add_argument("--shards-per-actor", type=int, nargs="+", default=[1, 10, 50])
    ap.add_argument("--paths", nargs="+", default=["sample", "waits"], choices=["sample", "mc", "waits"])
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="N = 1, 2, 4; k = 1, 5; every path, 3 repeats (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.actors, args.shards_per_actor, args.paths, args.repeats = [1, 2, 4], [1, 5], ["sample", "mc", "waits"], 3
    import ray

    from benchmarks._report import write_report

    started = not ray.is_initialized()
    if started:  # a Ray of its own (address="local"), shut down at the end
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        t0 = time.perf_counter()
        actors = [ray.remote(num_cpus=0)(StandIn).remote() for _ in range(max(args.actors))]
        ray.get([a.pid.remote() for a in actors])
        start_s = time.perf_counter() - t0
        sizes = [(n, k) for k in args.shards_per_actor for n in args.actors]
        rows = measure(ray, actors, sizes, args.paths, args.repeats)
        feet = ray.get([a.footprint.remote() for a in actors])
        for a in actors:
            ray.kill(a)
    finally:
        if started:
            ray.shutdown()
    rss = [f["rss_mb"] for f in feet if f["rss_mb"] is not None] or [math.nan]
    footprint = {"actors": len(feet), "rss_mb_median": statistics.median(rss), "rss_mb_max": max(rss),
                 "with_torch": sum(f["torch"] for f in feet), "start_s": start_s}
    summary = summarize(rows)
    name = "driver_fanin" + ("_quick" if args.quick else "")
    write_report(args.out, name, table(rows, summary, footprint),
                 {"rows": rows, "fits": summary, "footprint": footprint, "repeats": args.repeats,
                  "paths": args.paths})
    record = json.loads((args.out / f"{name}.json").read_text())
    md = args.out / f"{name}.md"
    md.write_text(md.read_text() + "\n" + provenance(record) + "\n")
    plot(rows, summary, args.out / f"{name}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
