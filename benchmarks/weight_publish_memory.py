"""What learner rank 0 holds while two sharded learners (``learner.strategy=fsdp``, FSDP2 over gloo) publish one
weights version, against ``rollout.weight_bucket_mb``: through the object store (every rank gathers each tensor, rank 0
keeps them all, then packs one buffer: ``Learner.get_flat_weights``) or over the collective sync (rank 0 streams the
buckets as each fills, a rollout worker receiving: ``Learner.send_weights``); and, for comparison, a collective send of
weights gathered whole first (what a sender that does not stream would hold).

Three processes on this machine: learner ranks 0 and 1 (each holding half of every parameter) and one rollout worker,
member 1 of the weights group. The model is a stack of square linear layers (``--layers`` x ``--width``), published
in the model dtype (``--dtypes``; bfloat16 halves the bytes: each rank casts its shard before the gather).

Each rank's memory during one publish is its peak resident set above what it held before (Linux: the high-water mark
``VmHWM``, reset through ``/proc/self/clear_refs``, with glibc mapping every block of 64 KiB or more on its own, so that
a freed tensor leaves the resident set at once): what the gathers, the casts, the buckets, the packed copy and gloo's
buffers take, together. (``torch.profiler``'s allocation events miss frees made on gloo's threads here, and count
about the whole model on rank 1, which keeps nothing.) Each figure is the median over ``--repeats`` publishes, after a
first one left out (what a process does once: imports, the group's connections), as is the time of one publish.

Run book (from the repository root):

    python benchmarks/weight_publish_memory.py           # benchmarks/results/weight_publish_memory.md, .json
    python benchmarks/weight_publish_memory.py --quick   # a smoke run (tests/benchmarks run it)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MIB = 1 << 20


def _model(layers: int, width: int):
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def _plan(args) -> list[tuple[str, str, float | None]]:
    """(dtype, path, bucket MiB) of each measured publish, in the order every process runs them."""
    plan = []
    for dtype in args.dtypes:
        plan.append((dtype, "object_store", None))
        plan += [(dtype, "collective", mb) for mb in args.buckets_mb]
        plan.append((dtype, "collective, gathered whole first", min(args.buckets_mb)))
    return plan


def _status(key: str) -> int:
    """A byte count of this process's ``/proc/self/status`` (``VmRSS:``, ``VmHWM:``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _measure(fn) -> tuple[int, float]:
    """(peak resident bytes above those held before, seconds) of one ``fn()``: the high-water mark reset first
    (``/proc/self/clear_refs``), every block of 64 KiB or more mapped on its own and returned when freed
    (``MALLOC_MMAP_THRESHOLD_``, set for the processes by :func:`main`), so the mark follows what is held."""
    base = _status("VmRSS:")
    Path("/proc/self/clear_refs").write_text("5")
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    return _status("VmHWM:") - base, seconds


def _member(rank: int, args, ports: tuple[int, int], out_dir: str) -> None:
    """Ranks 0, 1: the sharded learners; rank 2: the rollout worker (member 1 of the weights group)."""
    import torch
    import torch.distributed as dist

    from rayseq.distributed.actors.strategies import FSDP
    from rayseq.distributed.weights import collective as weight_sync
    from rayseq.distributed.weights.flat import FlatWeights

    torch.set_num_threads(1)
    model = _model(args.layers, args.width)
    spec = weight_sync.GroupSpec("rayseq-bench-weights", "127.0.0.1", ports[1], 2, 300.0)
    plan = [p for p in _plan(args) if p[1] != "object_store"]
    if rank == 2:
        first = True
        for dtype, _, mb in plan:
            like = {k: v.to(getattr(torch, dtype)) for k, v in model.state_dict().items()}
            for _ in range(1 + args.repeats):  # a first publish, then the measured ones
                weight_sync.receive(like, spec, 1, int(mb * MIB), first=first)
                first = False
        return
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[0]))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    rows = []
    try:
        for dtype in args.dtypes:
            held = _model(args.layers, args.width)
            strategy = FSDP(torch.device("cpu"), getattr(torch, dtype))
            strategy.wrap(rank, 2, {"generator": held}, {"opt": torch.optim.Adam(held.parameters())})
            for _, path, mb in [p for p in _plan(args) if p[0] == dtype]:

                def publish(path=path, mb=mb, held=held, strategy=strategy):
                    state = held.state_dict()
                    if path == "object_store":  # Learner.get_flat_weights
                        FlatWeights.pack(strategy.whole({"generator": state}))
                    elif path == "collective":  # Learner.send_weights
                        weight_sync.send(strategy.whole_tensors(state), spec, int(mb * MIB), root=rank == 0)
                    else:
                        whole = strategy.whole({"generator": state}).get("generator", {})
                        weight_sync.send(whole.items(), spec, int(mb * MIB), root=rank == 0)

                publish()  # first: what a process does once (imports, the group's connections) left out
                runs = [_measure(publish) for _ in range(args.repeats)]
                rows.append({"dtype": dtype, "path": path, "bucket_mb": mb, "rank": rank,
                             "peak_mb": statistics.median(r[0] for r in runs) / MIB,
                             "seconds": statistics.median(r[1] for r in runs)})
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(rows))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    import torch.multiprocessing as mp

    from benchmarks._report import write_report

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--buckets-mb", type=float, nargs="+", default=[1.0, 4.0, 16.0])
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="4 layers of 1,024 in bfloat16, buckets of 0.5 MiB, once")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = p.parse_args(argv)
    name = "weight_publish_memory"
    if args.quick:
        args.layers, args.buckets_mb, args.dtypes, args.repeats, name = 4, [0.5], ["bfloat16"], 1, f"{name}_quick"
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(64 << 10)  # read by the spawned processes' glibc (_measure)
    with tempfile.TemporaryDirectory(prefix="rayseq-bench-") as tmp:
        mp.start_processes(_member, args=(args, (_free_port(), _free_port()), tmp), nprocs=3, start_method="spawn")
        rows = [r for rank in (0, 1) for r in json.loads(Path(tmp, f"rank{rank}.json").read_text())]
    model_mb = {dtype: sum(p.numel() for p in _model(args.layers, args.width).parameters())
                * (2 if dtype == "bfloat16" else 4) / MIB for dtype in args.dtypes}
    lines = [f"Two FSDP learners (gloo, CPU) publish a {args.layers} x {args.width} linear stack; rank 0's memory "
             f"during one publish, resident bytes above those held before (median of {args.repeats}).", "",
             "| dtype | model MiB | path | bucket MiB | rank 0 peak MiB | rank 1 peak MiB | s |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for r in (r for r in rows if r["rank"] == 0):
        other = next(o for o in rows if o["rank"] == 1 and (o["dtype"], o["path"], o["bucket_mb"])
                     == (r["dtype"], r["path"], r["bucket_mb"]))
        bucket = "—" if r["bucket_mb"] is None else f"{r['bucket_mb']:g}"
        lines.append(f"| {r['dtype']} | {model_mb[r['dtype']]:.1f} | {r['path']} | {bucket} | {r['peak_mb']:.1f} | "
                     f"{other['peak_mb']:.1f} | {r['seconds']:.3f} |")
    write_report(Path(args.out), name, "\n".join(lines),
                 {"layers": args.layers, "width": args.width, "repeats": args.repeats, "model_mb": model_mb,
                  "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
