"""Probe: the collectives FSDP2 uses, and a small model under ``fully_shard``, with two ranks over gloo on one CUDA
device (the layout of learners sharing a GPU). Prints one line per rank and probe: ``(probe, rank, ok|FAIL, value)``.

    python benchmarks/gpu/probe_fsdp_gloo.py     # on a machine with a CUDA device

Probes: ``ar`` all-reduce, ``ag`` all-gather, ``rs`` reduce-scatter of CUDA tensors; ``fsdp`` a three-layer model
(each Linear sharded, then the root) forward and backward; ``fsdp-noreshard`` the same keeping the parameters whole
after forward. Findings from a run are in ``benchmarks/results/gpu/FINDINGS.md``.
"""

from __future__ import annotations

import os
import queue
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PROBES = ("ar", "ag", "rs", "fsdp", "fsdp-noreshard")


def collective(probe: str, rank: int, dev: torch.device) -> list[float]:
    if probe == "ar":
        t = torch.ones(4, device=dev)
        dist.all_reduce(t)
        return t.tolist()
    if probe == "ag":
        out = torch.empty(8, device=dev)
        dist.all_gather_into_tensor(out, torch.full((4,), rank + 1.0, device=dev))
        return out.tolist()
    out = torch.empty(4, device=dev)
    dist.reduce_scatter_tensor(out, torch.arange(8.0, device=dev))
    return out.tolist()


def sharded_step(probe: str, world: int, dev: torch.device) -> float:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cuda", (world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(dev)
    kw = {"reshard_after_forward": False} if probe == "fsdp-noreshard" else {}
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    loss = model(torch.randn(8, 16, device=dev)).pow(2).mean()
    loss.backward()
    torch.cuda.synchronize()
    return loss.item()


def run(rank: int, world: int, probe: str, port: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        value = collective(probe, rank, dev) if probe in ("ar", "ag", "rs") else sharded_step(probe, world, dev)
        q.put((probe, rank, "ok", value))
    except Exception as e:  # the probe's answer: what failed, where
        where = " | ".join(line.strip() for line in traceback.format_exc().splitlines()[-9:-1])
        q.put((probe, rank, "FAIL", f"{type(e).__name__}: {str(e)[:200]} | {where[:900]}"))


def main() -> None:
    print("torch", torch.__version__, flush=True)
    ctx = mp.get_context("spawn")
    for i, probe in enumerate(PROBES):
        q = ctx.Queue()
        procs = [ctx.Process(target=run, args=(r, 2, probe, 29700 + i, q)) for r in range(2)]
        for p in procs:
            p.start()
        for _ in procs:
            try:
                print(q.get(timeout=40), flush=True)
            except queue.Empty:
                print((probe, "timeout"), flush=True)
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()


if __name__ == "__main__":
    main()
