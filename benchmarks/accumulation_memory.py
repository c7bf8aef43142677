"""What gradient accumulation (``learner.micro_batch_size``) and activation checkpointing
(``learner.activation_checkpointing``) save in one update of the built-in Transformer, and what they cost in time.

One REINFORCE update (SeqGAN's g-step with the value baseline and the entropy bonus, on rewards given on each
reply's last token) and one MLE pretraining update of a decoder-only Transformer
(``model.arch=transformer``: 4 layers, 128 wide, feed-forward 512, 4 heads) on the oracle task (vocabulary 5,000,
sequences of 64 tokens), run through the learner as a run runs it (``Learner.update``): the whole batch in one pass,
or micro-batches of 32 and 8 rows, each with and without activation checkpointing. Memory on the CPU is measured with
``torch.profiler`` (:func:`benchmarks.learner_memory.allocations`: the most bytes held at once above what was held
before the update, after a first update has allocated Adam's moments); time is the median of 3 further updates.

Run book (from the repository root):

    python benchmarks/accumulation_memory.py            # benchmarks/results/accumulation_memory.md, .json
    python benchmarks/accumulation_memory.py --quick    # a smoke run (tests/benchmarks run it)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MODEL = ["model.arch=transformer", "model.hidden_dim=128", "model.num_layers=4", "model.ff_dim=512", "model.n_heads=4",
         "model.max_positions=80"]


def learner_and_batch(algo: str, batch: int, seq_len: int, micro: int | None, checkpointing: bool):
    """A learner with the settings, and a batch for ``algo``: ``reinforce``, SeqGAN's g-step (REINFORCE, Eq. 8) on
    sampled sequences rewarded on their last token; ``mle``, the pretraining stage's update on the task's
    sequences."""
    import numpy as np

    from rayseq.config import build_config
    from rayseq.distributed.actors.learner import Learner
    from rayseq.distributed.actors.worker import RolloutWorker
    from rayseq.types import RolloutRequest

    cfg = build_config(None, [*MODEL, "task.name=oracle", f"task.seq_len={seq_len}", "task.num_train=1000",
                              "task.eval_samples=100", "task.test_size=100", "rollout.num_workers=0", "progress=false",
                              "algo.name=seqgan", "algo.use_baseline=true", "algo.entropy_coef=0.01",
                              f"learner.activation_checkpointing={str(checkpointing).lower()}",
                              *([f"learner.micro_batch_size={micro}"] if micro else [])])
    learner = Learner(cfg)
    rng = np.random.default_rng(0)
    if algo == "mle":
        return learner, learner.task.sample_prompts(rng, batch, with_targets=True)
    learner.start_stage("train")
    worker = RolloutWorker(cfg)
    worker.set_weights(learner.get_weights(), learner.version)
    rollout = worker.sample(learner.task.sample_prompts(rng, batch), RolloutRequest(max_len=seq_len, seed=1))
    rollout.score = rng.normal(size=batch).astype(np.float32)
    rollout.rewards = np.zeros_like(rollout.rewards)
    rollout.rewards[np.arange(batch), np.maximum(rollout.token_mask.sum(1).astype(int) - 1, 0)] = rollout.score
    return learner, rollout


def measure(algo: str, batch: int, seq_len: int, micro: int | None, checkpointing: bool, repeats: int) -> dict:
    """Peak MB of one update and the median seconds of ``repeats`` more."""
    from benchmarks.learner_memory import allocations

    learner, data = learner_and_batch(algo, batch, seq_len, micro, checkpointing)
    learner.update(data, 0)  # Adam's moments allocated: the measured update holds the activations and gradients
    peak, _ = allocations(lambda: learner.update(data, 1))
    seconds = []
    for i in range(repeats):
        t0 = time.perf_counter()
        learner.update(data, i + 2)
        seconds.append(time.perf_counter() - t0)
    return {"algo": algo, "batch": batch, "micro": micro, "checkpointing": checkpointing, "peak_mb": peak / 2**20,
            "update_s": statistics.median(seconds)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--quick", action="store_true", help="a batch of 16 rows of 16 tokens, one repeat")
    args = ap.parse_args(argv)
    import torch

    from benchmarks._report import write_report

    torch.set_num_threads(1)
    batch, seq_len, repeats, micros = (16, 16, 1, (None, 4)) if args.quick else (128, 64, 3, (None, 32, 8))
    rows = [measure(algo, batch, seq_len, micro, ckpt, repeats)
            for algo in ("reinforce", "mle") for micro in micros for ckpt in (False, True)]
    lines = ["| update | batch | micro-batch | activation checkpointing | peak MB | update s (median) |",
             "|---|---:|---|---|---:|---:|"]
    lines += [f"| {r['algo']} | {r['batch']} | {r['micro'] or 'none (one pass)'} | "
              f"{'yes' if r['checkpointing'] else 'no'} | {r['peak_mb']:.1f} | {r['update_s']:.3f} |" for r in rows]
    table = "\n".join([f"One update of a decoder-only Transformer (4 x 128, feed-forward 512, vocabulary 5,000) on "
                       f"{batch} sequences of {seq_len} tokens, through the learner:", "", *lines])
    write_report(args.out, "accumulation_memory" + ("_quick" if args.quick else ""), table, {"updates": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
