"""Serving load test: requests/s and p50/p95/p99 latency of the chat app, with batching on and off.

Deploys :func:`rayseq.serving.app.build_app` on an embedded Ray + Serve (loopback, a free port), sends
``--requests`` POST /v1/chat requests with at most ``--concurrency`` in flight (async httpx, one
keep-alive connection per in-flight request) after ``--warmup`` uncounted ones, then deletes the app,
redeploys it with batching off and sends the same requests again. Every request is
``{"message": <1-10 random digits>, "max_tokens": 20, "temperature": 1.0, "seed": i}``.

Replies are checked, not just counted: decoding is reproducible per seed whatever the batch, so the
script decodes every (message, seed) in-process first (on the replica's ``--device``) and keeps only pairs whose
reply runs to its full length: ``max_tokens``, or a fixed-length task's reply length where that is shorter (the
counting task's replies are 3 tokens since serving stops a fixed-length reply at its length); seeds whose reply
ends early are skipped. An error is a non-200 status, a transport exception or unreadable body, a
``usage.completion_tokens`` other than that length, or a reply that differs from the in-process one (batching
must not change what a request gets). Latency percentiles and requests/s count OK requests only.

Also reported, per phase: the CPU seconds each process spent per request (load generator, Serve's
HTTP proxy, the replica(s), the rest of Ray; from /proc on Linux) and, from Serve's own Prometheus
metrics, the mean batch size and batch execution time (``n/a`` where the metrics agent is not up).
The load generator shares the machine with the proxy and the replica: on a 2-core machine the
numbers are an end-to-end measurement of everything on the box, not of the replica alone.

Without ``--checkpoint`` a checkpoint of the default counting model (1-layer GRU 128, MLE, 100
iterations, ~10 s) is trained in a temporary directory: quality does not matter here, sizes do.

Command   python benchmarks/serve_load.py [--requests 1000] [--concurrency 32] [--checkpoint PATH]
              [--replicas 1] [--max-batch-size 32] [--batch-wait-timeout-s 0.005] [--quick]
Time      about 1 minute on a 2-core machine, training included (--quick, 200 requests: about 45 s).
Writes    benchmarks/results/serve_load.md and .json (--quick: serve_load_quick.*)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import socket
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._report import write_report  # noqa: E402

APP = "rayseq-serve-load"
GOAL_REQUESTS, GOAL_CONCURRENCY, GOAL_RATIO, GOAL_P99_MS = 1000, 32, 3.0, 100.0


# -- checkpoint and workload ----------------------------------------------------------------------
def train_checkpoint(run_dir: Path) -> str:
    from rayseq.config import build_config
    from rayseq.distributed.driver import Trainer

    Trainer(build_config(None, [
        "rollout.num_workers=0", "train.pretrain_iters=100", "train.iters=0", "progress=false",
        f"run_dir={run_dir}",
    ])).run()
    return str(run_dir)


def make_workload(checkpoint: str, n: int, max_tokens: int, seed: int, torch_threads: int, device: str = "cpu"):
    """``n`` request bodies whose in-process reply is ``max_tokens`` long, and those replies (decoded on ``device``,
    the replica's: a seeded reply is drawn from that device's random stream)."""
    import torch

    from rayseq.serving.model import ChatModel, GenRequest

    threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    model = ChatModel(checkpoint, device=device)
    # a fixed-length task's replies end at its reply length (counting: 3 tokens) whatever max_tokens asks
    want = min(max_tokens, model.max_tgt_len) if model.fixed_length else max_tokens
    rng = random.Random(seed)
    bodies, replies, skipped, next_seed = [], [], 0, 0
    while len(bodies) < n:
        if skipped > 10 * n + 1000:
            raise RuntimeError(f"only {len(bodies)} of {len(bodies) + skipped} replies of {checkpoint} run to "
                               f"{want} tokens: use a counting checkpoint or a smaller --max-tokens")
        chunk = []
        for _ in range(256):
            msg = " ".join(rng.choice("0123456789") for _ in range(rng.randint(1, 10)))
            chunk.append({"message": msg, "max_tokens": max_tokens, "temperature": 1.0, "seed": next_seed})
            next_seed += 1
        results = model.generate([GenRequest(text=b["message"], temperature=1.0, max_tokens=max_tokens,
                                             seed=b["seed"]) for b in chunk])
        for b, r in zip(chunk, results):
            if r.completion_tokens != want:
                skipped += 1
            elif len(bodies) < n:
                bodies.append(b)
                replies.append(r.replies[0])
    torch.set_num_threads(threads)
    return bodies, replies, skipped, want


# -- load generator -------------------------------------------------------------------------------
async def run_load(url: str, bodies: list[dict], expected: list[str], concurrency: int, max_tokens: int,
                   timeout_s: float) -> dict:
    """Send every body with at most ``concurrency`` in flight; latency of each OK request, errors by kind."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    latencies, errors, statuses = [], Counter(), Counter()
    todo = iter(range(len(bodies)))

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout_s) as client:
        async def worker():
            for i in todo:  # shared iterator: each index is taken by exactly one worker
                t0 = time.perf_counter()
                try:
                    resp = await client.post("/v1/chat", json=bodies[i])
                    dt = time.perf_counter() - t0
                    statuses[resp.status_code] += 1
                    if resp.status_code != 200:
                        errors["status"] += 1
                        continue
                    data = resp.json()
                except (httpx.HTTPError, ValueError) as exc:
                    errors["transport"] += 1
                    errors[f"transport:{type(exc).__name__}"] += 1
                    continue
                if data.get("usage", {}).get("completion_tokens") != max_tokens:
                    errors["tokens"] += 1
                elif data.get("reply") != expected[i]:
                    errors["reply"] += 1
                else:
                    latencies.append(dt)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"latencies": latencies, "wall_s": wall, "errors": dict(errors), "statuses": dict(statuses)}


# -- what each process spent (Linux /proc) and Serve's own metrics ---------------------------------
def _role(cmdline: str) -> str:
    if "ServeReplica" in cmdline:
        return "replica"
    if "ProxyActor" in cmdline:
        return "proxy"
    return "rest of Ray"  # controller, raylet, GCS, agents, idle workers


def cpu_snapshot(root: int | None = None, client: int | None = None) -> dict[int, tuple[str, float]]:
    """pid -> (role, user + system CPU seconds) for ``client`` (default: this process) and every process
    descended from ``root`` (default: this process, which started Ray): only this run's Ray, not another
    Ray on the same machine."""
    if not Path("/proc/self/stat").exists():
        return {}
    root, client = root or os.getpid(), client or os.getpid()
    tick, stats, cmds = os.sysconf("SC_CLK_TCK"), {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmds[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
        except (OSError, ValueError, IndexError):
            continue
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    snap, todo = {}, [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            snap[pid] = (_role(cmds[pid]), stats[pid][1])
            todo.append(pid)
    if client in stats:
        snap[client] = ("load generator", stats[client][1])
    try:  # the whole machine (busy = all but idle and iowait), to show what else ran meanwhile
        cpu = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
        snap[0] = ("machine", (sum(cpu) - cpu[3] - cpu[4]) / tick)
    except (OSError, ValueError, IndexError):
        pass
    return snap


def cpu_delta(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds by role between two snapshots; "other processes" = the machine's minus this run's."""
    out = Counter()
    for pid, (role, t) in after.items():
        out[role] += t - before.get(pid, (role, 0.0))[1]
    machine = out.pop("machine", None)
    if machine is not None:
        out["other processes"] = max(machine - sum(out.values()), 0.0)
    return {k: round(v, 3) for k, v in out.items()}


ROLES = ("load generator", "proxy", "replica", "rest of Ray")
METRICS = ("ray_serve_actual_batch_size", "ray_serve_batch_execution_time_ms", "ray_serve_batch_wait_time_ms")


def scrape(port: int | None) -> dict[str, float] | None:
    """Sums and counts of Serve's batching histograms from the metrics agent, or None."""
    if port is None:
        return None
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return None
    out = Counter()
    for line in text.splitlines():
        m = re.match(r"^(\w+?)_(sum|count)\{[^}]*\} ([0-9.eE+-]+)$", line)
        if m and m.group(1) in METRICS:
            out[f"{m.group(1)}_{m.group(2)}"] += float(m.group(3))
    return dict(out)


def batch_stats(before, after) -> dict | None:
    if before is None or after is None:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    n = d.get("ray_serve_actual_batch_size_count", 0.0)
    if n <= 0:
        return None
    return {
        "batches": int(n),
        "mean_batch_size": d["ray_serve_actual_batch_size_sum"] / n,
        "mean_batch_exec_ms": d.get("ray_serve_batch_execution_time_ms_sum", 0.0) / n,
        "mean_batch_wait_ms": d.get("ray_serve_batch_wait_time_ms_sum", 0.0)
        / max(d.get("ray_serve_batch_wait_time_ms_count", 0.0), 1.0),
    }


def settled_scrape(port: int | None, interval_s: float, timeout_s: float = 20.0) -> dict | None:
    """Scrape until the batch count stops moving: the agent exports only every ``interval_s``, so a
    scrape right after a phase would miss its last batches. None where there are no metrics."""
    key = "ray_serve_actual_batch_size_count"
    last, deadline = scrape(port), time.monotonic() + timeout_s
    while last is not None and time.monotonic() < deadline:
        time.sleep(interval_s * 1.5)
        cur = scrape(port)
        if cur is None:
            return last
        if cur.get(key, 0.0) > 0 and cur.get(key) == last.get(key):
            return cur
        last = cur
    return last


# -- Serve ----------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deploy(app_args: dict, url: str, batching: bool) -> float:
    from ray import serve

    from rayseq.serving.app import build_app

    t0 = time.perf_counter()
    serve.run(build_app({**app_args, "batching": batching}), name=APP, route_prefix="/")
    deadline = time.monotonic() + 60
    while True:  # the proxy learns the route a moment after the app is up
        try:
            r = httpx.get(f"{url}/healthz", timeout=5)
            if r.status_code == 200 and r.json().get("batching") is batching:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}/healthz did not report batching={batching} within 60 s")
        time.sleep(0.2)
    return time.perf_counter() - t0


def measure(label: str, batching: bool, args, app_args: dict, url: str, metrics_port, work) -> dict:
    from ray import serve

    bodies, expected, warm_bodies, warm_expected = work
    serve.delete(APP)  # a rolling update would need a second replica's CPU on a 2-core box
    deploy_s = deploy(app_args, url, batching)
    asyncio.run(run_load(url, warm_bodies, warm_expected, args.concurrency, args.reply_tokens, args.timeout))
    m0 = settled_scrape(metrics_port, args.metrics_interval_s) if batching else None  # warm-up batches in
    c0, p0 = cpu_snapshot(), time.process_time()
    res = asyncio.run(run_load(url, bodies, expected, args.concurrency, args.reply_tokens, args.timeout))
    cpu = cpu_delta(c0, cpu_snapshot())
    client_cpu = time.process_time() - p0
    m1 = settled_scrape(metrics_port, args.metrics_interval_s) if m0 is not None else None
    lat = np.array(res["latencies"]) * 1000
    ok = len(lat)
    n_err = sum(v for k, v in res["errors"].items() if ":" not in k)
    out = {
        "label": label, "batching": batching, "requests": len(bodies), "ok": ok, "errors": n_err,
        "errors_by_kind": res["errors"], "statuses": res["statuses"], "wall_s": round(res["wall_s"], 3),
        "rps": ok / res["wall_s"],
        "latency_ms": {q: float(np.percentile(lat, int(q[1:]))) if ok else None for q in ("p50", "p95", "p99")}
        | {"mean": float(lat.mean()) if ok else None, "max": float(lat.max()) if ok else None},
        "cpu_s": cpu, "client_process_cpu_s": round(client_cpu, 3), "deploy_s": round(deploy_s, 2),
        "batching_metrics": batch_stats(m0, m1) if batching else None,
    }
    print(f"[{label}] {ok}/{len(bodies)} OK in {res['wall_s']:.2f} s = {out['rps']:.1f} req/s, "
          f"p50 {out['latency_ms']['p50'] or 0:.1f} ms, p99 {out['latency_ms']['p99'] or 0:.1f} ms, "
          f"errors {res['errors'] or 0}", flush=True)
    return out


# -- report ---------------------------------------------------------------------------------------
def fmt(v, spec=".1f"):
    return "n/a" if v is None else format(v, spec)


def report(args, results: dict) -> tuple[str, dict]:
    on, off = results.get("on"), results.get("off")
    lines = [
        f"Serve load test: {args.requests} POST /v1/chat requests at concurrency {args.concurrency} "
        f"({args.warmup} warm-up requests not counted), {args.reply_tokens}-token replies (max_tokens "
        f"{args.max_tokens}) at temperature 1.0, "
        f"{args.replicas} replica(s) on {args.device}, torch_threads={args.torch_threads}, "
        f"max_batch_size={args.max_batch_size}, "
        f"batch_wait_timeout_s={args.batch_wait_timeout_s}, max_ongoing_requests={args.max_ongoing_requests}; "
        f"load generator on the same {os.cpu_count()}-CPU machine",
        "",
        "| batching | requests/s | p50 ms | p95 ms | p99 ms | mean ms | max ms | errors | mean batch size "
        "| mean batch exec ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in (on, off):
        if r is None:
            continue
        lt, bm = r["latency_ms"], r["batching_metrics"] or {}
        lines.append(
            f"| {r['label']} | {r['rps']:.1f} | {fmt(lt['p50'])} | {fmt(lt['p95'])} | {fmt(lt['p99'])} | "
            f"{fmt(lt['mean'])} | {fmt(lt['max'])} | {r['errors']} | "
            f"{fmt(bm.get('mean_batch_size')) if r['batching'] else '1 (no batching)'} | "
            f"{fmt(bm.get('mean_batch_exec_ms'))} |"
        )
    summary = {}
    if on and off:
        ratio = on["rps"] / off["rps"] if off["rps"] else None
        summary["throughput_ratio"] = ratio
        p = {q: (off["latency_ms"][q] / on["latency_ms"][q]
                 if on["latency_ms"][q] and off["latency_ms"][q] else None) for q in ("p50", "p95", "p99")}
        lines.append(f"| on / off | {fmt(ratio, '.2f')}x | {fmt(p['p50'], '.2f')}x lower | "
                     f"{fmt(p['p95'], '.2f')}x lower | {fmt(p['p99'], '.2f')}x lower | | | | | |")

    ours = [k for k in ROLES if any(r and k in r["cpu_s"] for r in (on, off))]
    if ours:
        lines += ["", "CPU time per request (ms) by process, user + system from /proc; \"other\" is what the rest "
                  "of the machine used meanwhile (not this run: a busy machine makes every number above worse)",
                  "", "| batching | " + " | ".join(ours) + " | total (this run) | wall x CPUs | other |",
                  "| --- |" + " --- |" * (len(ours) + 3)]
        for r in (on, off):
            if r and r["ok"]:
                per = {k: r["cpu_s"].get(k, 0.0) * 1000 / r["requests"] for k in ours}
                capacity = r["wall_s"] * (os.cpu_count() or 1) * 1000 / r["requests"]
                lines.append(f"| {r['label']} | " + " | ".join(f"{per[k]:.2f}" for k in ours)
                             + f" | {sum(per.values()):.2f} | {capacity:.2f} | "
                             + f"{fmt(r['cpu_s'].get('other processes', 0.0) * 1000 / r['requests'], '.2f')} |")

    goals = []
    if on:
        n_err = {r["label"]: r["errors"] for r in (on, off) if r}
        goals.append(("zero errors", all(v == 0 for v in n_err.values()),
                      f"{args.requests} requests at concurrency {args.concurrency}: "
                      + ", ".join(f"{v} ({k})" for k, v in n_err.items())))
    if on and off:
        ratio = summary["throughput_ratio"]
        goals.append((f"batched throughput >= {GOAL_RATIO:g}x unbatched", ratio is not None and ratio >= GOAL_RATIO,
                      f"{on['rps']:.1f} / {off['rps']:.1f} req/s = {fmt(ratio, '.2f')}x"))
    if on:
        p99 = on["latency_ms"]["p99"]
        goals.append((f"p99 < {GOAL_P99_MS:g} ms, batched", p99 is not None and p99 < GOAL_P99_MS,
                      f"{fmt(p99)} ms for {args.reply_tokens}-token replies at concurrency {args.concurrency}"))
    at_goal = (args.requests >= GOAL_REQUESTS and args.concurrency == GOAL_CONCURRENCY and args.reply_tokens == 20)
    lines += ["", "Goals" + ("" if at_goal else f" (stated for {GOAL_REQUESTS} requests at concurrency "
                                                 f"{GOAL_CONCURRENCY} with 20-token replies; this run differs, "
                                                 "so PASS/FAIL is indicative only)"), ""]
    lines += [f"- {'PASS' if ok else 'FAIL'}  {name}: {detail}" for name, ok, detail in goals]
    if on and on["ok"]:
        cost = sum(on["cpu_s"].get(k, 0.0) for k in ROLES) * 1000 / on["requests"]
        need = args.concurrency / (GOAL_P99_MS / 1000)
        summary["little"] = {"rps_for_mean_below_goal": need, "cpu_ms_per_request": cost,
                             "rps_cap_from_cpu": (os.cpu_count() or 1) * 1000 / cost if cost else None}
        lines += ["", f"Little's law: with {args.concurrency} requests in flight, mean latency = "
                  f"{args.concurrency} / throughput, so even a mean under {GOAL_P99_MS:g} ms needs more than "
                  f"{need:.0f} req/s. This run's processes used {cost:.1f} ms of CPU per batched request, "
                  f"which caps throughput at {fmt(summary['little']['rps_cap_from_cpu'], '.0f')} req/s on "
                  f"{os.cpu_count()} CPUs even with the machine to itself." if cost else ""]
    summary["goals"] = {name: {"pass": ok, "detail": detail} for name, ok, detail in goals}
    summary["goal_settings"] = at_goal
    return "\n".join(lines), summary


# -- main -----------------------------------------------------------------------------------------
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=None, help="measured requests per phase (default 1000)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--warmup", type=int, default=50, help="uncounted requests before each phase")
    p.add_argument("--max-tokens", type=int, default=20)
    p.add_argument("--checkpoint", default=None, help="run directory or checkpoint file (default: train one)")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--batch-wait-timeout-s", type=float, default=0.005)
    p.add_argument("--max-ongoing-requests", type=int, default=64)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="the replica's (cuda: 1 GPU per replica)")
    p.add_argument("--batching", nargs="+", choices=["on", "off"], default=["on", "off"])
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout, seconds")
    p.add_argument("--seed", type=int, default=0, help="seed of the random messages")
    p.add_argument("--metrics-interval-s", type=float, default=1.0, help="Ray metrics export interval")
    p.add_argument("--quick", action="store_true", help="smoke test: 200 requests, writes serve_load_quick.*")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args()
    if args.requests is None:
        args.requests = 200 if args.quick else 1000
    name = "serve_load_quick" if args.quick else "serve_load"

    with tempfile.TemporaryDirectory(prefix="serve_load_") as tmp:
        t0 = time.perf_counter()
        checkpoint = args.checkpoint or train_checkpoint(Path(tmp) / "run")
        train_s = time.perf_counter() - t0 if args.checkpoint is None else 0.0
        bodies, expected, skipped, args.reply_tokens = make_workload(
            checkpoint, args.warmup + args.requests, args.max_tokens, args.seed, args.torch_threads, args.device)
        work = (bodies[args.warmup:], expected[args.warmup:], bodies[: args.warmup], expected[: args.warmup])
        print(f"checkpoint {checkpoint}" + (f" (trained in {train_s:.1f} s)" if train_s else "")
              + f"; {len(bodies)} requests, {skipped} seeds skipped (their reply ends early)", flush=True)

        import ray
        from ray import serve

        port, metrics_port = free_port(), free_port()
        url = f"http://127.0.0.1:{port}"
        ray.init(address="local", include_dashboard=False, log_to_driver=False,
                 _metrics_export_port=metrics_port,
                 _system_config={"metrics_report_interval_ms": int(args.metrics_interval_s * 1000)})
        app_args = {
            "checkpoint": checkpoint, "replicas": args.replicas, "max_batch_size": args.max_batch_size,
            "batch_wait_timeout_s": args.batch_wait_timeout_s, "max_ongoing_requests": args.max_ongoing_requests,
            "torch_threads": args.torch_threads, "device": args.device,
        }
        results = {}
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            for mode in args.batching:
                results[mode] = measure(mode, mode == "on", args, app_args, url, metrics_port, work)
        finally:
            serve.shutdown()
            ray.shutdown()

    settings = {k: v for k, v in vars(args).items() if k != "out"} | {"checkpoint": args.checkpoint or "trained",
                                                                      "train_s": round(train_s, 1),
                                                                      "skipped_seeds": skipped}
    table, summary = report(args, results)
    write_report(args.out, name, table, {"settings": settings, "results": results, **summary})


if __name__ == "__main__":
    main()
