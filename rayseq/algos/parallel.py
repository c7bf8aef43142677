"""Data-parallel updates (``learner.num_learners``): how N learner ranks make the update one learner makes.

Every rank holds the whole batch (the learner group sends each the same rollout) and draws the same minibatch
permutation (seeded); rank r computes the loss on its part of each minibatch (:meth:`DataParallel.part`:
``torch.tensor_split`` of the minibatch's rows) and the ranks' gradients are summed (one all-reduce of a flat
buffer) before clipping and the optimizer step, so every rank applies the same step to the same weights and its
Adam moments stay equal to the others'.

The losses are means over the minibatch (over its unmasked tokens, or its examples): L = Σ_i f_i / D. A rank's
own mean L_r = Σ_{i∈r} f_i / D_r, scaled by its share w_r = D_r / D (:meth:`DataParallel.share`), sums over the
ranks to L exactly, so the summed gradient is the one-learner gradient (up to float rounding), whatever the split
of tokens among the ranks — unlike averaging each rank's mean (DDP's and RLlib's default), which weighs a rank's
short replies like another's long ones. A loss whose terms have different denominators scales each term by its
own share (PPO's policy and entropy terms over the sampled tokens; MIXER's over all tokens).

The forward passes without gradients that make the update's inputs (advantages' baseline values, the KL
reference's log-probs) are split by rows too: each rank computes its part, in micro-batches of
``learner.micro_batch_size`` rows, and the parts are all-gathered (:func:`rows_without_grad`), so N ranks do 1/N of
that work each. Diagnostics are the share-weighted sums of the ranks' (:meth:`DataParallel.reduce`): exact for
means, the ranks' weighted average for ratios of means (explained variance). Dropout draws from each rank's own
torch RNG, so with dropout N ranks are equivalent in distribution, not bit for bit.

References: RLlib ``LearnerGroup`` (Learners on Ray actors, gradients reduced by torch DDP), OpenRLHF and veRL
(torch.distributed ranks inside Ray actors; veRL's "token-mean" loss aggregation over the data-parallel group).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist


def is_dtensor(tensor) -> bool:
    """Whether ``tensor`` is a shard of a distributed tensor (a sharded learner's parameter or gradient:
    rayseq.distributed.actors.sharding), whose reduction FSDP does."""
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


class DataParallel:
    """This process's rank of ``world`` in the default torch.distributed process group (set up by the learner
    group before the first update)."""

    def __init__(self, rank: int, world: int, device: torch.device | str = "cpu"):
        self.rank = rank
        self.world = world
        self.device = torch.device(device)  # where collectives' buffers live (NCCL: the GPU)

    def part(self, idx: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a minibatch ``idx`` (M,): the r-th of ``world`` contiguous parts (sizes differ by at
        most one; the config check keeps M >= world, so none is empty)."""
        if len(idx) < self.world:
            raise ValueError(f"a minibatch of {len(idx)} rows cannot give each of {self.world} learners one")
        return torch.tensor_split(idx, self.world)[self.rank]

    @staticmethod
    def share(part: torch.Tensor, whole: torch.Tensor) -> float:
        """w_r = D_r / D: this rank's part of a mean's denominator (a mask's sum, or a count), with the
        denominators clamped at 1 as :func:`rayseq.losses.masked_mean` clamps them."""
        f64 = torch.float64  # exact counts (a bool mask's too)
        return float(part.sum(dtype=f64).clamp(min=1.0) / whole.sum(dtype=f64).clamp(min=1.0))

    def all_reduce_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum the ranks' gradients (each already scaled by its share) into every rank's ``.grad``, in one
        all-reduce of a flat buffer. Parameters without a gradient (outside the loss's graph: the same ones on
        every rank) are left out. (A sharded learner's ranks sum their gradient shards in backward instead: its
        rank's ``all_reduce_grads`` does nothing.)"""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n

    def gather_rows(self, part: torch.Tensor, n: int) -> torch.Tensor:
        """The rows of every rank: ``part`` is this rank's :meth:`part` of ``n`` rows (its leading dimension);
        returns the (n, ...) concatenation in rank order (one all-gather, the parts padded to equal size)."""
        sizes = [len(p) for p in torch.tensor_split(torch.arange(n), self.world)]
        padded = torch.zeros((max(sizes), *part.shape[1:]), dtype=part.dtype, device=self.device)
        padded[: len(part)] = part.to(self.device)
        gathered = [torch.empty_like(padded) for _ in range(self.world)]
        dist.all_gather(gathered, padded)
        return torch.cat([g[:k] for g, k in zip(gathered, sizes)]).to(part.device)

    def reduce(self, values: dict[str, float]) -> dict[str, float]:
        """The sum over the ranks of each value (each rank's already weighted by its share): one all-reduce."""
        if not values:
            return {}
        keys = sorted(values)
        flat = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        return dict(zip(keys, flat.tolist()))


def rows_without_grad(fn, n: int, micro_batch: int | None = None, dp: DataParallel | None = None) -> tuple:
    """``fn(rows) -> tensors`` for every row 0..n−1, without gradients: this rank's rows (all of them with one
    learner), ``micro_batch`` at a time (None: in one call), then, with several ranks, every rank's gathered
    (:meth:`DataParallel.gather_rows`). The largest tensor ``fn`` makes is bounded by the micro-batch, not by n.

    Args:
        fn: rows (m,) int64 -> a tuple of tensors whose leading dimension is m.
        n: the number of rows.
        micro_batch: rows per call (``learner.micro_batch_size``).
        dp: this learner's rank, or None.

    Returns:
        A tuple of (n, ...) tensors: every row's results, in row order.
    """
    rows = torch.arange(n)
    if dp is not None:
        rows = torch.tensor_split(rows, dp.world)[dp.rank]
    step = micro_batch or max(len(rows), 1)
    with torch.no_grad():
        if len(rows):
            parts = [fn(rows[i : i + step]) for i in range(0, len(rows), step)]
            out = tuple(torch.cat(column) for column in zip(*parts))
        else:  # fewer rows than ranks: an empty part, shaped as fn's results
            out = tuple(t[:0] for t in fn(torch.arange(1)))
    return out if dp is None else tuple(dp.gather_rows(t, n) for t in out)
