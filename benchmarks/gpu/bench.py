"""What the GPU buys rayseq: the device beside the CPU, in one run on one machine.

Parts (``--parts``; each writes ``<out>/<part>.md`` and ``.json``, and a plot where one says more):

  updates  seconds per algorithm update (``time/update_s``, median over the iterations after two warm-ups) for one
           algorithm of each family, on counting at batch ``--batch``, in-process, the learner on the CPU and on
           ``--device``; at rayseq's default model size and at a larger one (``--large``: a GRU of 512). Speed-up =
           CPU / device.
  mcq      Monte-Carlo Q per SeqGAN generator update at the paper's sizes (B = 64, T = 20, N = 16, V = 5,000, LSTM
           32/32, the paper's CNN D): the batched cached search, D of the B·(T−1)·N continuations (prefix-shared)
           and of Y, and Q, on the CPU (all its threads) and on the device; median of ``--repeats`` after a warm-up.
  hf_grpo  GRPO steps per second with a tiny local GPT-2 (tests/hf_fixtures.py: 2 layers, hidden 32, BPE 400) on
           the tiny chit-chat corpus, in-process, the policy on the CPU and on the device (``time/iter_s``).

  sample   :meth:`HFCausalLM.sample` tokens/s (what a rollout worker runs) on a GPT-2-shaped model built from config
           (12 layers × 768, the tiny test tokenizer), batches of 16 and 64 prompts of 16 tokens, 64 new tokens each
           (the end token banned: every row decodes them all), in float32, float32 under bf16 autocast, and bf16
           weights; median of ``--repeats`` after a warm-up.
  nograd   peak device memory of one PPO update's passes without gradients (the value baseline's inputs and the KL
           reference's log-probs, ``rayseq.algos.common.without_grad``) against batch size, in one pass and in
           micro-batches of 16 (``learner.micro_batch_size``), on GPT-2 small's shape (12 × 768, 50,257 output rows),
           replies of 64 tokens after 16 (benchmarks/learner_memory.py's measurement on the device).
  sync     one weights sync of a synthetic 1B-parameter fp32 state held by a learner actor on the device to a receiving
           actor on the device (each half of the GPU): (a) the object store as rayseq sends it (``FlatWeights.pack``
           to host, fetched, loaded onto the device); (b) rayseq's collective path (``weights.collective``
           send/receive: a gloo group, buckets of 64 MiB, checksum checked); (c) an NCCL group (two ranks on one GPU:
           refused by NCCL, recorded); (d) CUDA IPC (the colocated learners' way: the receiver copies from the
           sender's memory). Seconds per sync, median of ``--repeats``.

``--quick`` shrinks every part to a smoke test (used by ``run.sh --device cpu --quick`` in the tests).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks._report import write_report  # noqa: E402
from tests.gpu.conftest import device_overrides  # noqa: E402  (the GPU suite's keys for a run on a device)

FAMILIES = ["mle", "reinforce", "ppo", "ppo_dynamic", "grpo", "actor_critic", "seqgan_ppo_dynamic"]
LARGE = ["model.emb_dim=256", "model.hidden_dim=512"]
# SeqGAN's discriminator: small, and one short d-step per iteration (the row times the generator's update)
SMALL_D = ["disc.emb_dim=32", "disc.filter_sizes=[1,2,3,4,5]", "disc.num_filters=[32,32,32,32,32]", "disc.d_steps=1",
           "disc.epochs=1", "disc.num_negatives=256"]


def median_metric(run_dir: Path, key: str, stage: str = "train", skip: int = 2) -> float:
    import pyarrow.parquet as pq

    rows = [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r["stage"] == stage]
    vals = [r[key] for r in rows[skip:] if r.get(key) is not None] or [r[key] for r in rows]
    return statistics.median(vals)


def train(overrides: list[str], run_dir: Path) -> Path:
    from rayseq.config import build_config
    from rayseq.distributed.driver import Trainer

    Trainer(build_config(None, [*overrides, f"run_dir={run_dir}"])).run()
    return run_dir


def part_updates(args, tmp: Path) -> tuple[str, dict]:
    from rayseq.registry import algorithm_class

    iters = 4 if args.quick else 12
    batch = 32 if args.quick else args.batch
    sizes = {"default": []} if args.quick else {"default": [], "large": LARGE}
    rows = []
    for size, model in sizes.items():
        for algo in (FAMILIES[:3] + FAMILIES[-1:]) if args.quick else FAMILIES:
            stage = "mle" if algo == "mle" else "train"
            gan = (["disc.pretrain_steps=0", "algo.mc_rollouts=4", *SMALL_D]
                   if "disc" in algorithm_class(algo).sections else [])
            plan = ([f"train.pretrain_iters={iters}", "train.iters=0"] if algo == "mle" else
                    ["train.pretrain_iters=0", f"train.iters={iters}", *gan])
            base = ["rollout.num_workers=0", "progress=false", "task.test_size=100", f"algo.name={algo}",
                    f"train.batch_size={batch}", f"train.pretrain_batch_size={batch}", f"train.eval_every={iters}",
                    f"train.pretrain_eval_every={iters}", f"learner.torch_threads={args.cpu_threads}",
                    f"rollout.torch_threads={args.cpu_threads}", *model, *plan]
            t = {}
            for dev in dict.fromkeys(["cpu", args.device]):
                run = train([*base, *device_overrides(dev)], tmp / f"updates-{size}-{algo}-{dev}")
                # MLE pretraining logs the learner's step as time/learn_s (in-process: the update alone)
                t[dev] = median_metric(run, "time/learn_s" if stage == "mle" else "time/update_s", stage)
            rows.append({"size": size, "algo": algo, "cpu_s": t["cpu"], "device_s": t[args.device],
                         "speedup": t["cpu"] / t[args.device]})
            print(f"  updates {size} {algo}: cpu {t['cpu'] * 1e3:.1f} ms, {args.device} {t[args.device] * 1e3:.1f} ms",
                  flush=True)
    lines = [f"Seconds per update, counting, batch {batch}, in-process ({args.device_name}; CPU: "
             f"{args.cpu_threads} torch threads); median over {iters} iterations after 2 warm-ups", "",
             f"| model | algorithm | CPU ms | {args.device} ms | speed-up |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['size']} | {r['algo']} | {r['cpu_s'] * 1e3:.1f} | {r['device_s'] * 1e3:.1f} | "
              f"{r['speedup']:.2f}x |" for r in rows]
    plot_bars(rows, args.out / "updates.png", args.device)
    return "\n".join(lines), {"rows": rows, "batch": batch, "iters": iters, "large": LARGE}


def plot_bars(rows: list[dict], path: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{r['algo']}\n({r['size']})" for r in rows]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["cpu_s"] * 1e3 for r in rows], width=0.4, label="CPU")
    ax.bar([i + 0.2 for i in x], [r["device_s"] * 1e3 for r in rows], width=0.4, label=device)
    ax.set_xticks(list(x), labels, fontsize=7, rotation=45, ha="right")
    ax.set_ylabel("ms per update")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _mcq_once(g, d, tokens, mask, N: int, dev: str) -> tuple[float, float]:
    """Seconds of (the Monte-Carlo search, D of the continuations and of Y with Q) for one generator update."""
    import torch

    from rayseq.rewards.mc_search import mc_search, q_values

    B, T = tokens.shape
    empty, zeros = torch.zeros(B, 0, dtype=torch.long, device=dev), torch.zeros(B, dtype=torch.long, device=dev)
    lengths = mask.sum(1).long()
    _sync(dev)
    t0 = time.perf_counter()
    c = mc_search(g, empty, zeros, tokens, mask, N, generator=torch.Generator(device=dev).manual_seed(2))
    _sync(dev)
    t1 = time.perf_counter()
    with torch.no_grad():
        d_cont = d.score_shared_prefix(tokens, lengths, c.tokens, c.lengths, torch.arange(1, T, device=dev))
        q_values(d_cont, d.score(tokens, lengths), lengths)
    _sync(dev)
    return t1 - t0, time.perf_counter() - t1


def part_mcq(args, tmp: Path) -> tuple[str, dict]:
    import torch

    from rayseq.models.discriminator import build_discriminator
    from rayseq.models.generator import Seq2SeqGRU

    B, T, N, V = (8, 10, 4, 500) if args.quick else (64, 20, 16, 5000)
    torch.manual_seed(0)
    g_cpu = Seq2SeqGRU(V, emb_dim=32, hidden_dim=32, cell="lstm", conditional=False, banned_ids=(0, 1, 2, 3)).eval()
    d_cpu = (build_discriminator(V, emb_dim=16, filter_sizes=(1, 2, 3), num_filters=(8, 8, 8)) if args.quick
             else build_discriminator(V)).eval()
    empty = torch.zeros(B, 0, dtype=torch.long)
    zeros = torch.zeros(B, dtype=torch.long)
    y = g_cpu.sample(empty, zeros, T, generator=torch.Generator().manual_seed(1))
    rows = {}
    for dev in dict.fromkeys(["cpu", args.device]):
        g, d = g_cpu.to(dev), d_cpu.to(dev)
        tokens, mask = y.tokens.to(dev), y.token_mask.to(dev)
        _mcq_once(g, d, tokens, mask, N, dev)  # warm-up (CUDA kernels, caches)
        times = [_mcq_once(g, d, tokens, mask, N, dev) for _ in range(args.repeats)]
        search, score = statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
        rows[dev] = {"search_s": search, "d_s": score, "total_s": search + score}
        print(f"  mcq {dev}: search {search:.3f} s, D {score:.3f} s", flush=True)
    dev = args.device
    lines = [f"Monte-Carlo Q per SeqGAN generator update (B={B}, T={T}, N={N}, V={V}; {args.device_name}; CPU "
             f"{torch.get_num_threads()} threads); median of {args.repeats}", "",
             "| where | search s | D s | total s | vs CPU |", "| --- | --- | --- | --- | --- |"]
    for k, r in rows.items():
        lines.append(f"| {k} | {r['search_s']:.3f} | {r['d_s']:.3f} | {r['total_s']:.3f} | "
                     f"{rows['cpu']['total_s'] / r['total_s']:.2f}x |")
    return "\n".join(lines), {"rows": rows, "B": B, "T": T, "N": N, "V": V, "device": dev}


def part_hf_grpo(args, tmp: Path) -> tuple[str, dict]:
    from rayseq.data.preparation import PrepareOptions, prepare
    from tests.conftest import GREETINGS, REPLIES, TOPICS, write_corpus
    from tests.hf_fixtures import make_tiny_hf

    hf = make_tiny_hf(tmp / "tiny-gpt2", extra_lines=tuple(GREETINGS + REPLIES + TOPICS) * 5)
    corpus = tmp / "cc"
    prepare(f"jsonl:{write_corpus(tmp / 'pairs.jsonl')}", corpus,
            PrepareOptions(quiet=True, valid_frac=0.1, test_frac=0.2, seed=0))
    iters = 4 if args.quick else 20
    batch = 8 if args.quick else 64
    rows = {}
    for dev in dict.fromkeys(["cpu", args.device]):
        run = train(["task.name=pairs", f"task.data={corpus}", "task.test_size=100", "task.val_size=10",
                     "model.arch=hf", f"model.path={hf}", "algo.name=grpo", "algo.group_size=8",
                     "train.pretrain_iters=0", f"train.iters={iters}", f"train.batch_size={batch}",
                     f"algo.minibatch_size={batch}", f"train.eval_every={iters}", "rollout.num_workers=0",
                     "progress=false", f"learner.torch_threads={args.cpu_threads}",
                     f"rollout.torch_threads={args.cpu_threads}", *device_overrides(dev)], tmp / f"hf-{dev}")
        it = median_metric(run, "time/iter_s")
        rows[dev] = {"iter_s": it, "steps_per_s": 1 / it, "update_s": median_metric(run, "time/update_s")}
        print(f"  hf_grpo {dev}: {1 / it:.2f} steps/s", flush=True)
    lines = [f"GRPO with a tiny local GPT-2 (2 layers, hidden 32), {batch} replies per step (groups of 8), "
             f"in-process; {args.device_name}; median over {iters} steps after 2 warm-ups", "",
             "| where | steps/s | s per step | update s |", "| --- | --- | --- | --- |"]
    lines += [f"| {k} | {r['steps_per_s']:.2f} | {r['iter_s']:.3f} | {r['update_s']:.3f} |" for k, r in rows.items()]
    return "\n".join(lines), {"rows": rows, "batch": batch, "iters": iters}


def part_sample(args, tmp: Path) -> tuple[str, dict]:
    import torch

    from benchmarks.rollout_engines import build_model, prompts
    from rayseq.data.hf_text import HFVocab
    from rayseq.models.hf import HFCausalLM

    name = "tiny" if args.quick else "gpt2-12x768"
    path = build_model(tmp / "sample", name)
    vocab = HFVocab(str(path))
    dev = args.device
    batches, new_tokens = ((4, 8), 8) if args.quick else ((16, 64), 64)
    rows = []
    for precision in ("float32", "bf16 autocast", "bf16 weights"):
        policy = HFCausalLM(str(path), vocab.specials, vocab_size=len(vocab)).eval()
        policy.banned_ids = (*policy.banned_ids, vocab.specials.eos)  # every row decodes new_tokens
        policy.logit_bias[vocab.specials.eos] = float("-inf")
        policy = policy.to(dev, dtype=torch.bfloat16 if precision == "bf16 weights" else torch.float32)
        ctx = (lambda: torch.autocast(dev, dtype=torch.bfloat16)) if precision == "bf16 autocast" else \
            (lambda: torch.autocast(dev, enabled=False))
        for batch in batches:
            src, src_len = prompts(len(vocab), batch, seed=batch)
            src, src_len = src.to(dev), src_len.to(dev)
            times = []
            for r in range(args.repeats + 1):  # the first: warm-up
                _sync(dev)
                t0 = time.perf_counter()
                with ctx(), torch.no_grad():
                    out = policy.sample(src, src_len, new_tokens, generator=torch.Generator(dev).manual_seed(r))
                _sync(dev)
                times.append(time.perf_counter() - t0)
            tokens = float(out.token_mask.sum())
            s = statistics.median(times[1:])
            rows.append({"precision": precision, "batch": batch, "tokens": tokens, "seconds": s,
                         "tok_per_s": tokens / s})
            print(f"  sample {precision} batch {batch}: {tokens / s:.0f} tok/s", flush=True)
        del policy
    lines = [f"HFCausalLM.sample tokens/s, GPT-2 shape {name} built from config, prompts of 16 tokens, {new_tokens} "
             f"new "
             f"tokens per row; {args.device_name}; median of {args.repeats} after a warm-up", "",
             "| precision | batch | tokens/s | s per call |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['precision']} | {r['batch']} | {r['tok_per_s']:,.0f} | {r['seconds']:.3f} |" for r in rows]
    return "\n".join(lines), {"rows": rows, "model": name, "new_tokens": new_tokens}


def part_nograd(args, tmp: Path) -> tuple[str, dict]:
    from benchmarks.learner_memory import no_grad_pass, tiny_gpt2

    if args.quick:
        vocab, shape, batches = 2048, {"layers": 2, "width": 128, "heads": 4}, (16, 32)
    else:
        vocab, shape, batches = 50257, {"layers": 12, "width": 768, "heads": 12}, (64, 256, 1024)
    path = tiny_gpt2(tmp / "nograd", vocab, **shape)
    rows = []
    for batch in batches:
        for micro in (None, 16):
            r = {"batch": batch, "micro": micro, **no_grad_pass(path, vocab, batch, micro, device=args.device)}
            rows.append(r)
            print(f"  nograd batch {batch} micro {micro}: peak {r['peak_mb']:.0f} MB, {r['seconds']:.3f} s", flush=True)
    lines = [f"Peak memory of one PPO update's passes without gradients (baseline values, KL reference) on "
             f"{args.device_name}: GPT-2 shape {shape['layers']} x {shape['width']}, {vocab:,} output rows, replies "
             f"of 64 tokens after 16; the bytes held above the model's", "",
             "| batch | passes | peak MB | seconds |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['batch']} | {'one pass' if r['micro'] is None else 'micro-batches of ' + str(r['micro'])} | "
              f"{r['peak_mb']:,.0f} | {r['seconds']:.3f} |" for r in rows]
    return "\n".join(lines), {"rows": rows, "vocab": vocab, "shape": shape}


def _sync_actor(ray, num_gpus: float):
    import torch

    @ray.remote(num_cpus=1, num_gpus=num_gpus)
    class Member:
        """One end of a weights sync: holds a synthetic state (``tensors`` × ``numel`` fp32) on its device."""

        def __init__(self, device: str, tensors: int, numel: int, seed: int):
            torch.set_num_threads(4)
            self.dev = torch.device(device)
            g = torch.Generator().manual_seed(seed)
            self.state = {f"w{i}": torch.randn(numel, generator=g).to(self.dev) for i in range(tensors)}
            self.groups = {}

        def nbytes(self) -> int:
            return sum(t.numel() * t.element_size() for t in self.state.values())

        def checksum(self) -> list:
            from rayseq.distributed.weights.collective import checksum

            return checksum(self.state).tolist()

        # (a) the object store, as rayseq's learner publishes and a worker loads
        def pack(self):
            from rayseq.distributed.weights.flat import FlatWeights

            return FlatWeights.pack({"generator": self.state})

        def load(self, weights) -> float:
            from rayseq.distributed.weights.flat import as_state_dicts

            t0 = time.perf_counter()
            got = as_state_dicts(weights)["generator"]
            with torch.no_grad():
                for k, v in got.items():
                    self.state[k].copy_(v, non_blocking=True)
            _sync(self.dev.type)
            return time.perf_counter() - t0

        # (b) rayseq's weights group (rayseq.distributed.weights.collective: gloo); (c) NCCL through ray.util.collective
        @staticmethod
        def rendezvous():
            from rayseq.distributed.actors.learner import Learner

            return Learner.rendezvous()

        def join(self, backend: str, world: int, rank: int, name: str, spec=None) -> str:
            try:
                if backend == "nccl":
                    import ray.util.collective as col

                    col.init_collective_group(world, rank, backend="nccl", group_name=name)
                self.groups[name] = (rank, backend, spec)
                return ""
            except Exception as e:  # noqa: BLE001 - recorded: what this backend says on this machine
                return f"{type(e).__name__}: {e}"[:300]

        def collective(self, name: str, bucket_mb: float) -> str:
            from rayseq.distributed.weights import collective as weight_sync

            rank, backend, spec = self.groups[name]
            nbytes = int(bucket_mb * 2**20)
            try:
                if backend == "gloo" and rank == 0:
                    weight_sync.send(self.state.items(), spec, nbytes)
                elif backend == "gloo":
                    self.state = weight_sync.receive(self.state, spec, rank, nbytes, first=True)
                else:
                    import ray.util.collective as col

                    bufs = weight_sync.buckets(self.state, nbytes)
                    for b in bufs:
                        col.broadcast(b, src_rank=0, group_name=name)
                    if rank:
                        self.state = weight_sync.unpack(self.state, bufs)
                _sync(self.dev.type)
                return ""
            except Exception as e:  # noqa: BLE001
                return f"{type(e).__name__}: {e}"[:300]

        # (d) CUDA IPC: handles to the sender's memory, the receiver copies device to device
        def ipc_handles(self):
            from torch.multiprocessing.reductions import reduce_tensor

            return {k: reduce_tensor(v) for k, v in self.state.items()}

        def ipc_load(self, handles) -> float:
            t0 = time.perf_counter()
            with torch.no_grad():
                for k, (rebuild, rargs) in handles.items():
                    self.state[k].copy_(rebuild(*rargs))
            _sync(self.dev.type)
            return time.perf_counter() - t0

    return Member


def _num(x, digits: int) -> str:
    return "—" if not x else f"{x:.{digits}f}"


def part_sync(args, tmp: Path) -> tuple[str, dict]:
    import ray

    tensors, numel = (4, 1 << 18) if args.quick else (32, 1 << 25)  # quick: 1M parameters; else 1.07B (4.3 GB)
    cuda = args.device == "cuda"
    ray.init(num_cpus=4, num_gpus=1 if cuda else 0, object_store_memory=(1 << 30) if args.quick else 12 << 30,
             include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": "lo"}})
    rows = []
    try:
        Member = _sync_actor(ray, 0.5 if cuda else 0)
        learner = Member.remote(args.device, tensors, numel, 0)
        worker = Member.remote(args.device, tensors, numel, 1)
        nbytes = ray.get(learner.nbytes.remote())
        want = ray.get(learner.checksum.remote())

        def record(how, seconds, error=""):
            rows.append({"how": how, "seconds": statistics.median(seconds) if seconds else None, "error": error,
                         "GB": nbytes / 1e9})
            print(f"  sync {how}: {rows[-1]['seconds']} s {error}", flush=True)

        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            ref = learner.pack.remote()
            ray.get(worker.load.remote([ref]))
            times.append(time.perf_counter() - t0)
            del ref
        ok = ray.get(worker.checksum.remote()) == want
        record("object store (pack, fetch, load)", times, "" if ok else "checksum differs")
        def collective(backend: str) -> None:
            name = f"sync_{backend}"
            spec = None
            if backend == "gloo":
                from rayseq.distributed.weights.collective import GroupSpec

                spec = GroupSpec(name, *ray.get(learner.rendezvous.remote()), 2, 300.0)
            errs = [e for e in ray.get([m.join.remote(backend, 2, r, name, spec)
                                        for r, m in enumerate((learner, worker))],
                                       timeout=120) if e]
            times = []
            for _ in range(args.repeats if not errs else 0):
                t0 = time.perf_counter()
                try:
                    errs = [e for e in ray.get([m.collective.remote(name, 64.0) for m in (learner, worker)],
                                               timeout=300) if e]
                except ray.exceptions.GetTimeoutError:
                    errs = ["no answer in 300 s"]
                if errs:
                    break
                times.append(time.perf_counter() - t0)
                if times[-1] > 60:  # one sync is the figure: a slow path does not eat the budget
                    break
            ok = not errs and ray.get(worker.checksum.remote(), timeout=60) == want
            record(f"{backend} broadcast, 64 MiB buckets" + (" (rayseq's collective path)" if backend == "gloo"
                                                                else ""), times if not errs else [],
                   "; ".join(errs) or ("" if ok else "checksum differs"))

        collective("gloo")
        if cuda:
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                ray.get(worker.ipc_load.remote(learner.ipc_handles.remote()))
                times.append(time.perf_counter() - t0)
            ok = ray.get(worker.checksum.remote()) == want
            record("CUDA IPC (device-to-device copy)", times, "" if ok else "checksum differs")
        try:  # last: two NCCL ranks on one GPU may be refused, or may not answer
            collective("nccl")
        except Exception as e:  # noqa: BLE001
            record("nccl broadcast, 64 MiB buckets", [], f"{type(e).__name__}: {e}"[:300])
    finally:
        ray.shutdown()
    lines = [f"One weights sync of a synthetic {tensors * numel / 1e9:.2f}B-parameter fp32 state "
             f"({nbytes / 1e9:.1f} GB), learner actor to one receiving actor, both on {args.device_name}; median of "
             f"{args.repeats}", "", "| how | seconds | GB/s | note |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['how']} | {_num(r['seconds'], 2)} | {_num(r['seconds'] and r['GB'] / r['seconds'], 1)} | "
              f"{r['error']} |" for r in rows]
    return "\n".join(lines), {"rows": rows, "tensors": tensors, "numel": numel, "bytes": nbytes}


PARTS = {"sample": part_sample, "nograd": part_nograd, "sync": part_sync, "updates": part_updates, "mcq": part_mcq,
         "hf_grpo": part_hf_grpo}


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="smoke-test sizes")
    p.add_argument("--batch", type=int, default=256, help="updates: sequences per update")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cpu-threads", type=int, default=None,
                   help="torch threads of the CPU rows (default: the machine's, at most 8; --quick: 1)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu")
    args = p.parse_args(argv)
    if args.cpu_threads is None:
        args.cpu_threads = 1 if args.quick else min(torch.get_num_threads(), 8)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here (--device cpu runs the same parts on the CPU)")
    args.device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU only"
    torch.set_num_threads(args.cpu_threads)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rayseq_gpu_bench_") as tmp:
        for part in args.parts:
            t0 = time.perf_counter()
            table, payload = PARTS[part](args, Path(tmp))
            payload["wall_s"] = round(time.perf_counter() - t0, 1)
            write_report(args.out, part, table, {**payload, "device": args.device, "device_name": args.device_name,
                                                 "quick": args.quick})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
