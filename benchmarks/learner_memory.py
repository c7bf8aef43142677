"""What a learner's update costs in memory and time, against batch size, vocabulary and learner.micro_batch_size.

The memory a pass allocates on the CPU is measured with ``torch.profiler`` (``profile_memory=True``): every
allocation and free of the process's tensors, in time order, gives the pass's peak (the most bytes held at once
above what was held before it) and its largest single allocation (:func:`allocations`). The passes measured are the
learner's:

- ``no-grad``: the passes without gradients of one PPO update with the KL penalty on an HF policy (the value
  baseline's inputs and the KL reference's log-probs over the whole batch), as the learner runs them
  (``rayseq.algos.common.without_grad``): one pass over the batch, or micro-batches of ``learner.micro_batch_size``
  rows with the lean log-prob pass (no (B, T, V) logits);
- ``update``: one whole PPO update (the no-gradient passes, then minibatches of 64 with their backward passes),
  timed too.

Run book (from the repository root; the HF models are GPT-2-shaped, built from config in a temporary folder, never
downloaded):

    python benchmarks/learner_memory.py                  # the table and plot in benchmarks/results/learner_memory.*
    python benchmarks/learner_memory.py --quick          # a smoke run (tests/benchmarks run it)
"""

from __future__ import annotations

import sys
from pathlib import Path

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
