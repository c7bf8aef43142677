"""Probe: FSDP2 over gloo with two ranks on one CUDA device."""
import os, sys, traceback, queue
import torch, torch.distributed as dist, torch.multiprocessing as mp

def run(rank, world, variant, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        if variant == "ag":
            out = torch.empty(8, device=dev); dist.all_gather_into_tensor(out, torch.full((4,), rank + 1.0, device=dev))
            q.put((variant, rank, "ok", out.tolist())); return
        if variant == "rs":
            out = torch.empty(4, device=dev); dist.reduce_scatter_tensor(out, torch.arange(8.0, device=dev))
            q.put((variant, rank, "ok", out.tolist())); return
        if variant == "ar":
            t = torch.ones(4, device=dev); dist.all_reduce(t); q.put((variant, rank, "ok", t.tolist())); return
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cuda", (world,))
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(dev)
        kw = {"reshard_after_forward": False} if variant == "fsdp-noreshard" else {}
        for layer in m:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh, **kw)
        fully_shard(m, mesh=mesh, **kw)
        loss = m(torch.randn(8, 16, device=dev)).pow(2).mean()
        loss.backward()
        torch.cuda.synchronize()
        q.put((variant, rank, "ok", float(loss)))
    except Exception as e:
        tb = traceback.format_exc().splitlines()
        q.put((variant, rank, "FAIL", f"{type(e).__name__}: {str(e)[:200]} | " + " | ".join(l.strip() for l in tb[-9:-1])[:900]))

if __name__ == "__main__":
    print("torch", torch.__version__, flush=True)
    ctx = mp.get_context("spawn")
    for i, variant in enumerate(["ar", "ag", "rs", "fsdp", "fsdp-noreshard"]):
        q = ctx.Queue()
        ps = [ctx.Process(target=run, args=(r, 2, variant, 29700 + i, q)) for r in range(2)]
        [p.start() for p in ps]
        for _ in range(2):
            try:
                print(q.get(timeout=40), flush=True)
            except queue.Empty:
                print((variant, "timeout"), flush=True)
        [p.join(5) for p in ps]; [p.kill() for p in ps if p.is_alive()]
