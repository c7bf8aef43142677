"""Who owns a sampled shard, and what the owner pays when every learner rank fetches every shard.

A Ray object returned by an actor call is owned by the caller: the driver, which submits the sampling calls, owns
every rollout shard, and each learner rank that fetches a shard asks the driver where it is (and, for an object
small enough to come back inline with the reply, under ``max_direct_call_object_size`` = 100 KiB, gets its bytes
from the driver's own memory). R ranks x N shards per update go through the driver. The alternative measured here:
the worker ``ray.put``s its shard (it owns it) and hands the ref back in its small info, which the driver reads
anyway where it waits for the samples; the ranks then ask the workers.

Light stand-ins (``num_cpus=0``, no torch): N workers return a shard of a given size; R ranks each ``ray.get`` all N
shards (as the learner ranks do, :func:`rayseq.distributed.handles.resolve`). One iteration = the N sampling calls
sent, their infos waited for, the R fetch calls sent with the N refs and waited for. Timed: the driver's CPU
(``time.process_time``: its Python thread and Ray's threads in it) over the iteration, and the wall clock; owned by
the driver and by the workers alternate within each repeat; figures are medians. Shards of 16 KiB (inline: the bytes
travel through the owner) and 1 MiB (in the object store of the worker's node: only the look-ups go to the owner).

Run book (from the repository root):

    python benchmarks/shard_owner.py            # N = 4, 16, 48 workers x R = 1, 4, 8 ranks: results/shard_owner.*
    python benchmarks/shard_owner.py --quick    # a smoke run (tests/benchmarks run it)

Time: about 5 minutes on 2 cores; memory: about 130 MB per stand-in (56 of them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.driver_fanin import StandIn  # noqa: E402  (after the path set-up)


class ShardWorker(StandIn):
    """Samples a shard of ``nbytes``: returned (the caller owns it), or put here and its ref returned in the info
    (this worker owns it)."""

    def sample(self, nbytes: int, seed: int, owned: bool) -> tuple:
        import numpy as np

        shard = np.full(nbytes // 8, seed, dtype=np.int64)
        if owned:
            import ray

            return None, {"rows": len(shard), "shard": [ray.put(shard)]}
        return shard, {"rows": len(shard)}


class Rank(StandIn):
    """A learner rank: fetches every shard of an update."""

    def fetch(self, shards: list) -> int:
        import ray

        return sum(int(s.nbytes) for s in ray.get(shards))


def one_iteration(ray, workers: list, ranks: list, nbytes: int, seed: int, owned: bool) -> tuple[float, float]:
    """Driver CPU and wall seconds of one iteration: sample on every worker, wait for the infos, every rank fetches
    every shard."""
    c0, t0 = time.process_time(), time.perf_counter()
    calls = [w.sample.options(num_returns=2).remote(nbytes, seed, owned) for w in workers]
    infos = ray.get([info for _, info in calls])
    shards = [info["shard"][0] for info in infos] if owned else [data for data, _ in calls]
    fetched = ray.get([r.fetch.remote(shards) for r in ranks])
    assert fetched == [len(workers) * (nbytes // 8) * 8] * len(ranks), fetched
    return time.process_time() - c0, time.perf_counter() - t0


def measure(ray, workers: list, ranks: list, sizes: list[tuple[int, int]], nbytes_list: list[int],
            repeats: int) -> list[dict]:
    rows = []
    for nbytes in nbytes_list:
        for n, r in sizes:
            ws, rs = workers[:n], ranks[:r]
            for owned in (False, True):  # warm-up
                one_iteration(ray, ws, rs, nbytes, 0, owned)
            times: dict = {False: ([], []), True: ([], [])}
            for rep in range(repeats):
                for owned in ((False, True) if rep % 2 == 0 else (True, False)):
                    cpu, wall = one_iteration(ray, ws, rs, nbytes, rep + 1, owned)
                    times[owned][0].append(cpu * 1e3)
                    times[owned][1].append(wall * 1e3)
            for owned, (cpus, walls) in times.items():
                owner = "workers" if owned else "driver"
                rows.append({"shard_bytes": nbytes, "workers": n, "ranks": r, "lookups": n * r, "owner": owner,
                             "cpu_ms": statistics.median(cpus), "wall_ms": statistics.median(walls),
                             "cpu_ms_all": cpus, "wall_ms_all": walls})
                print(f"{nbytes // 1024:5d} KiB N={n:3d} R={r:2d} owner={owner:7s} driver cpu "
                      f"{rows[-1]['cpu_ms']:8.1f} ms  wall {rows[-1]['wall_ms']:8.1f} ms", flush=True)
    return rows


def survival(ray, nbytes_list: list[int]) -> dict:
    """Whether a shard can still be fetched once the worker that sampled it is gone (killed, not restarted): per
    owner and shard size, "read" or the error's name."""
    out = {}
    for nbytes in nbytes_list:
        for owned in (False, True):
            worker = ray.remote(num_cpus=0, max_restarts=0)(ShardWorker).remote()
            data, info = worker.sample.options(num_returns=2).remote(nbytes, 7, owned)
            info = ray.get(info)
            shard = info["shard"][0] if owned else data
            ray.kill(worker, no_restart=True)
            time.sleep(1.0)
            try:
                ray.get(shard, timeout=60)
                result = "read"
            except ray.exceptions.RayError as exc:
                result = type(exc).__name__
            out[f"{nbytes}/{'workers' if owned else 'driver'}"] = result
            print(f"{nbytes // 1024:5d} KiB owner={'workers' if owned else 'driver':7s} after the worker's death: "
                  f"{result}", flush=True)
    return out


def summarize(rows: list[dict]) -> dict:
    """Per shard size and owner: least squares of driver CPU ms = a + b·N + c·(N·R), the cost of each shard (its
    sampling call sent and waited for) and of each look-up (a rank's fetch of a shard), with R²."""
    import numpy as np

    out = {}
    for nbytes in sorted({r["shard_bytes"] for r in rows}):
        for owner in ("driver", "workers"):
            pts = [r for r in rows if r["shard_bytes"] == nbytes and r["owner"] == owner]
            if len({(r["workers"], r["ranks"]) for r in pts}) < 4:
                continue
            x = np.array([[1.0, r["workers"], r["workers"] * r["ranks"]] for r in pts])
            y = np.array([r["cpu_ms"] for r in pts])
            (a, b, c), *_ = np.linalg.lstsq(x, y, rcond=None)
            r2 = 1.0 - float(((y - x @ (a, b, c)) ** 2).sum()) / (float(((y - y.mean()) ** 2).sum()) or 1.0)
            out[f"{nbytes}/{owner}"] = {"intercept_ms": float(a), "per_shard_ms": float(b), "per_lookup_ms": float(c),
                                        "r2": r2, "at_1000x16_ms": float(a + b * 1000 + c * 16000)}
    return out


def table_md(rows: list[dict], summary: dict, survived: dict, repeats: int) -> str:
    lines = ["# Who owns a sampled shard: the driver's CPU per iteration when R ranks fetch N shards", "",
             "`python benchmarks/shard_owner.py`: light stand-ins (`num_cpus=0`, no torch); one iteration = N sampling "
             "calls, their infos waited for, R ranks each fetching the N shards; driver CPU = `time.process_time` of "
             f"the driver process; medians of {repeats} alternating repeats.", "",
             "| shard | N workers | R ranks | owner: driver, CPU | owner: workers, CPU | ratio | owner: driver, wall "
             "| owner: workers, wall |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    by = {(r["shard_bytes"], r["workers"], r["ranks"], r["owner"]): r for r in rows}
    for nbytes, n, r in sorted({(x["shard_bytes"], x["workers"], x["ranks"]) for x in rows}):
        d, w = by[(nbytes, n, r, "driver")], by[(nbytes, n, r, "workers")]
        lines.append(f"| {nbytes // 1024} KiB | {n} | {r} | {d['cpu_ms']:.1f} ms | {w['cpu_ms']:.1f} ms "
                     f"| {d['cpu_ms'] / w['cpu_ms']:.2f} | {d['wall_ms']:.1f} ms | {w['wall_ms']:.1f} ms |")
    if summary:
        lines += ["", "Least squares of driver CPU = a + b·N + c·(N·R): what each shard and each rank's look-up of a "
                  "shard cost the driver, and the fit at 1,000 workers and 16 ranks (an extrapolation far beyond the "
                  "measured sizes); whether a shard is still read once its worker is gone (killed, not restarted):", "",
                  "| shard | owner | per shard (b) | per look-up (c) | a | R² | 1,000 × 16, extrapolated "
                  "| read after its worker died |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for key, fit in summary.items():
            nbytes, owner = key.split("/")
            lines.append(f"| {int(nbytes) // 1024} KiB | {owner} | {fit['per_shard_ms']:.2f} ms "
                         f"| {fit['per_lookup_ms']:.3f} ms | {fit['intercept_ms']:.1f} ms | {fit['r2']:.3f} "
                         f"| {fit['at_1000x16_ms'] / 1e3:.2f} s | {survived.get(key, '')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 16, 48])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a smoke run: N = 1, 2, 4, R = 1, 2, 3 repeats")
    args = ap.parse_args(argv)
    import ray

    from benchmarks._report import write_report

    if args.quick:
        args.workers, args.ranks, args.repeats = [1, 2, 4], [1, 2], 3
    nbytes_list = [16 << 10, 1 << 20]
    sizes = [(n, r) for r in args.ranks for n in args.workers]
    started = ray.is_initialized()
    if not started:
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        workers = [ray.remote(num_cpus=0)(ShardWorker).remote() for _ in range(max(args.workers))]
        ranks = [ray.remote(num_cpus=0)(Rank).remote() for _ in range(max(args.ranks))]
        ray.get([a.pid.remote() for a in workers + ranks])
        rows = measure(ray, workers, ranks, sizes, nbytes_list, args.repeats)
        with_torch = sum(f["torch"] for f in ray.get([a.footprint.remote() for a in workers + ranks]))
        for a in workers + ranks:
            ray.kill(a)
        survived = survival(ray, nbytes_list)
    finally:
        if not started:
            ray.shutdown()
    summary = summarize(rows)
    name = "shard_owner_quick" if args.quick else "shard_owner"
    write_report(args.out, name, table_md(rows, summary, survived, args.repeats),
                 {"rows": rows, "fits": summary, "survival": survived,
                  "footprint": {"actors": len(workers) + len(ranks), "with_torch": with_torch}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
