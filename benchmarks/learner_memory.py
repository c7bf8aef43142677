"""What a learner holds and allocates, against batch size, vocabulary, learner.micro_batch_size and the number of
learners, replicated or sharded (FSDP).

Part 1, the passes without gradients of one PPO update with the KL penalty on a Hugging Face policy (the value
baseline's inputs and the KL reference's log-probs over the whole batch), run as the learner runs them
(``rayseq.algos.common.without_grad``): one pass over the batch (``micro_batch_size`` none), or micro-batches of 16 rows
with the lean log-prob pass (no (B, T, V) logits). Their memory on the CPU is measured with ``torch.profiler``
(``profile_memory=True``): every allocation and free of the pass's tensors, in time order, gives its peak (the most
bytes held at once above what was held before it) and its largest single allocation (:func:`allocations`). The
policies are GPT-2-shaped (2 layers, 128 wide) with a 2,048- or a 16,384-token vocabulary, built from config in a
temporary folder; replies of 64 tokens after prompts of 16.

Part 2, N learner actors on Ray (one process group, gloo) with ``learner.strategy`` replicated or fsdp, on the same
GPT-2 shape (2 x 128, 16,384 output rows): the elements of parameters and of Adam's moments each rank holds
(``Learner.shard_sizes``), as bytes at fp32, and the median time of a PPO update of 64 replies (each rank its rows
of every minibatch).

Run book (from the repository root):

    python benchmarks/learner_memory.py            # both parts: benchmarks/results/learner_memory.md, .json, .png
    python benchmarks/learner_memory.py --quick    # a smoke run (tests/benchmarks run it)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def allocations(fn) -> tuple[int, int]:
    """(peak bytes, largest single allocation in bytes) of the tensors ``fn()`` allocates on the CPU: the profiler's
    allocation and free events in time order (each op's own, its children's counted where they happen)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    held = peak = largest = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        held += e.self_cpu_memory_usage
        peak = max(peak, held)
        largest = max(largest, e.self_cpu_memory_usage)
    del torch
    return peak, largest


def tiny_gpt2(out: Path, vocab: int, layers: int = 2, width: int = 128, heads: int = 4) -> Path:
    """A GPT-2-shaped causal LM with random weights, saved in ``out`` (no tokenizer: the passes take token ids)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=256, n_embd=width, n_layer=layers, n_head=heads)
                    ).save_pretrained(out)
    return out


def no_grad_pass(path: Path, vocab: int, batch: int, micro: int | None, S: int = 16, T: int = 64,
                 device: str = "cpu") -> dict:
    """Peak and largest allocation (MB) and seconds of the baseline's and the reference's passes over ``batch``
    replies. On ``device="cuda"`` the peak is CUDA's allocator's (the most bytes held at once during the passes
    above what was held before them) and the largest allocation is not measured (None)."""
    import torch

    from rayseq.algos.common import LearnerState, policy_pass, without_grad
    from rayseq.models.baseline import ValueBaseline
    from rayseq.models.hf import HFCausalLM

    dev = torch.device(device)
    gen = HFCausalLM(str(path), SimpleNamespace(pad=0, bos=1, eos=2), vocab_size=vocab).to(dev).eval()
    baseline = ValueBaseline(gen.state_dim).to(dev)
    state = LearnerState(generator=gen, gen_opt=None, device=dev,
                         micro_batch=micro)
    g = torch.Generator().manual_seed(batch)
    src = torch.randint(3, vocab, (batch, S), generator=g).to(dev)
    src_len = torch.full((batch,), S).to(dev)
    tokens = torch.randint(3, vocab, (batch, T), generator=g).to(dev)

    def passes(src, src_len, tokens, lean):
        logp, states = policy_pass(gen, src, src_len, tokens, lean)
        return logp, baseline(states)

    def run():
        return without_grad(state, passes, src, src_len, tokens)

    if dev.type == "cuda":
        run()  # warm-up: kernels chosen, the allocator's blocks settled
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = run()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        peak, largest = torch.cuda.max_memory_allocated() - before, None
        del out
    else:
        peak, largest = allocations(run)
        t0 = time.perf_counter()
        run()
        seconds = time.perf_counter() - t0
    return {"peak_mb": peak / 2**20, "largest_mb": None if largest is None else largest / 2**20, "seconds": seconds}


def ranks(path: Path, strategy: str, n: int, updates: int) -> dict:
    """Per-rank held elements and a PPO update's median seconds with ``n`` learners of ``strategy`` on Ray."""
    import numpy as np
    import ray

    from rayseq.config import build_config
    from rayseq.distributed.actors.worker import RolloutWorker
    from rayseq.distributed.groups import LearnerGroup
    from rayseq.distributed.groups.manager import ActorManager
    from rayseq.types import RolloutRequest

    corpus, hf = path / "prepared", path / "tiny-gpt2"
    cfg = build_config(None, ["task.name=pairs", f"task.data={corpus}", "model.arch=hf", f"model.path={hf}",
                              "task.test_size=100", "task.val_size=10", "algo.name=ppo", "algo.minibatch_size=32",
                              "train.batch_size=64", "rollout.num_workers=1", f"learner.num_learners={n}",
                              f"learner.strategy={strategy}", "learner.micro_batch_size=16"])
    group = LearnerGroup(cfg, manager=ActorManager(ray, None), actor_options=[{"num_cpus": 0.5}] * n)
    try:
        group.start_stage("train")
        worker = RolloutWorker(cfg, 0)
        worker.set_weights(group.get_weights(), 0)
        prompts = worker.task.sample_prompts(np.random.default_rng(0), 64)
        rollout = worker.sample(prompts, RolloutRequest(max_len=16, seed=1))
        rollout.score = np.linspace(0, 1, len(rollout)).astype(np.float32)
        rollout.rewards[np.arange(len(rollout)), np.maximum(rollout.token_mask.sum(1).astype(int) - 1, 0)] = \
            rollout.score
        times = []
        for i in range(updates + 1):
            t0 = time.perf_counter()
            group.update([rollout], i)
            times.append(time.perf_counter() - t0)
        sizes = [ray.get(a.shard_sizes.remote()) for a in group.actors]
    finally:
        for a in group.actors:
            ray.kill(a)
    held = max(s["params"][0] + s["optimizer"][0] for s in sizes)
    whole = sizes[0]["params"][1] + sizes[0]["optimizer"][1]
    return {"held_mb": held * 4 / 2**20, "whole_mb": whole * 4 / 2**20, "update_s": statistics.median(times[1:])}


def hf_fixture(root: Path, vocab: int | None = None) -> Path:
    """The tests' tiny chit-chat corpus (``root/prepared``) and a policy that reads it (``root/tiny-gpt2``): the tests'
    tiny GPT-2 and its tokenizer, or with ``vocab`` a GPT-2 shape of 2 x 128 with that many output rows (random
    weights) and the same tokenizer (the rows beyond the tokenizer's are never sampled)."""
    import shutil

    from rayseq.data.preparation import PrepareOptions, prepare
    from tests.conftest import GREETINGS, REPLIES, TOPICS, write_corpus
    from tests.hf_fixtures import make_tiny_hf

    root.mkdir(parents=True, exist_ok=True)
    prepare(f"jsonl:{write_corpus(root / 'pairs.jsonl')}", root / "prepared",
            PrepareOptions(quiet=True, valid_frac=0.1, test_frac=0.2, seed=0))
    small = make_tiny_hf(root / ("tokenizer" if vocab else "tiny-gpt2"),
                         extra_lines=tuple(GREETINGS + REPLIES + TOPICS) * 5)
    if vocab:
        model = tiny_gpt2(root / "tiny-gpt2", vocab)
        for f in small.iterdir():
            if "token" in f.name or f.name == "special_tokens_map.json":
                shutil.copy(f, model / f.name)
    return root


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, vocab in zip(axes, sorted({r["vocab"] for r in rows})):
        for micro, style in ((None, "o-"), (16, "s--")):
            pts = [(r["batch"], r["peak_mb"]) for r in rows if r["vocab"] == vocab and r["micro"] == micro]
            ax.plot(*zip(*pts), style, label="one pass" if micro is None else f"micro-batches of {micro}")
        ax.set(xscale="log", yscale="log", xlabel="replies in the batch", ylabel="peak MB of the passes",
               title=f"vocabulary {vocab:,}")
        ax.legend()
    fig.suptitle("Passes without gradients (baseline values, KL reference): peak memory")
    fig.tight_layout()
    fig.savefig(out / "learner_memory.png", dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--quick", action="store_true", help="small batches, one vocabulary, no Ray part")
    args = ap.parse_args(argv)
    import torch

    from benchmarks._report import write_report

    torch.set_num_threads(1)
    vocabs, batches = ((2048,), (16, 32)) if args.quick else ((2048, 16384), (16, 64, 256))
    rows = []
    with tempfile.TemporaryDirectory(prefix="rayseq-memory-") as tmp:
        for vocab in vocabs:
            path = tiny_gpt2(Path(tmp) / f"gpt2-{vocab}", vocab)
            for batch in batches:
                for micro in (None, 16):
                    rows.append({"vocab": vocab, "batch": batch, "micro": micro,
                                 **no_grad_pass(path, vocab, batch, micro)})
        lines = ["| vocabulary | batch | micro-batch | peak MB | largest allocation MB | seconds |",
                 "|---:|---:|---|---:|---:|---:|"]
        lines += [f"| {r['vocab']:,} | {r['batch']} | {r['micro'] or 'none (one pass)'} | {r['peak_mb']:.1f} | "
                  f"{r['largest_mb']:.1f} | {r['seconds']:.2f} |" for r in rows]
        table = "\n".join(["Passes without gradients of one PPO update with the KL penalty (HF GPT-2 shape, 2 x 128, "
                           "replies of 64 tokens after 16):", "", *lines])
        learners = []
        if not args.quick:
            import ray

            ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
            try:
                fixture = hf_fixture(Path(tmp) / "hf", vocab=16384)
                for strategy, n in (("replicated", 1), ("replicated", 2), ("fsdp", 2)):
                    learners.append({"strategy": strategy, "learners": n, **ranks(fixture, strategy, n, updates=3)})
            finally:
                ray.shutdown()
            lines = ["| strategy | learners | per-rank parameters + Adam MB | of the whole MB | update s (median) |",
                     "|---|---:|---:|---:|---:|"]
            lines += [f"| {r['strategy']} | {r['learners']} | {r['held_mb']:.1f} | {r['whole_mb']:.1f} | "
                      f"{r['update_s']:.2f} |" for r in learners]
            table += "\n\n" + "\n".join(["What each learner holds, and a PPO update of 64 replies (HF GPT-2 shape, "
                                          "2 x 128, 16,384 output rows; micro-batches of 16):", "", *lines])
    write_report(args.out, "learner_memory" + ("_quick" if args.quick else ""), table,
                 {"passes": rows, "learners": learners})
    if not args.quick:
        plot(rows, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
