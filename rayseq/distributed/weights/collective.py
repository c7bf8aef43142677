"""Weights over a collective (``rollout.weight_sync=collective``): the learner (rank 0 of the group) broadcasts the
generator's trained weights to the rollout workers over a gloo process group of their own, in the model's dtype, in
byte buckets of ``rollout.weight_bucket_mb``, instead of every worker pulling one packed copy from the learner's node
through the object store.

The group is a standalone ``ProcessGroupGloo`` (its own TCP store at the learner, its own timeout), not a
``torch.distributed`` default group: a process may already have one (the learners' data-parallel group, a vLLM
engine's), and a group rebuilt after a lost worker must not reuse the old one's members. (``ray.util.collective``'s
gloo backend builds its groups on the process's default group, once per process and without its timeout: a rebuilt
group then waits forever for the lost member.)

Both sides lay the same state dict (the generator's ``state_dict()``: every weight, or a LoRA policy's adapters) out the
same way (:func:`buckets`), so nothing but the bytes crosses: no spec, no pickling. The calls are queued, not waited
for: the learner's broadcast behind its update, each worker's receive ahead of its next sampling call, so an iteration
whose next batch goes out behind the update keeps its order with no driver round trip. The sampling calls still carry
the object-store reference of the same version, which a worker reads only when it lacks that version: after a failed
broadcast (a worker lost mid-broadcast: the others time out) the iteration completes from the object store, and the next
broadcast goes to a group rebuilt with the re-created worker (the driver's side:
:class:`~rayseq.distributed.weights.transport.CollectiveTransport`).

The sender streams (:func:`send`): it makes each bucket as its tensors come, sends it and drops it, then sends the
checksum it summed on the way. A sharded learner (``learner.strategy=fsdp``) makes each whole tensor only when the
stream asks for it: every rank casts its shard to the model dtype and takes part in that tensor's all-gather
(``DTensor.full_tensor()``), and rank 0 alone keeps it, for the bucket. So while publishing rank 0 holds, beyond its
shards, about two buckets (a bucket's tensors and their copy into it) and one tensor's gather, never the whole model,
and the other ranks one tensor's gather (``benchmarks/weight_publish_memory.py``).

References: OpenRLHF's and veRL's NCCL broadcast to the rollout engines (``_broadcast_to_vllm``; the checkpoint
engine), slime's bucketed ``update_weight_from_distributed``.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

ALIGN = 64  # bytes: each tensor starts at a multiple of it (so that the receiver views it in place)


@dataclass(frozen=True)
class GroupSpec:
    """One weights group: its name, the learner's store (``address:port``, rank 0 listens), its size and the timeout
    of its joining and of each broadcast."""

    name: str
    address: str
    port: int
    world: int
    timeout_s: float


_GROUPS: dict = {}  # this process's memberships: (group name, rank) -> ProcessGroupGloo


def join(spec: GroupSpec, rank: int):
    """This process's member ``rank`` of ``spec``'s group (made when first asked: every member must join within
    ``spec.timeout_s``)."""
    import ray
    import torch.distributed as dist

    if (spec.name, rank) not in _GROUPS:
        timeout = datetime.timedelta(seconds=spec.timeout_s)
        store = dist.TCPStore(spec.address, spec.port, spec.world, rank == 0, timeout, wait_for_workers=False)
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=ray.util.get_node_ip_address())]
        _GROUPS[spec.name, rank] = dist.ProcessGroupGloo(store, rank, spec.world, options)
    return _GROUPS[spec.name, rank]


def _broadcast(group, tensor: torch.Tensor) -> None:
    group.broadcast(tensor, 0).wait()  # from rank 0


def _padded(nbytes: int) -> int:
    return nbytes + (-nbytes % ALIGN)


def _bucketed(tensors: Iterable[torch.Tensor], bucket_bytes: int) -> Iterator[torch.Tensor]:
    """``tensors`` (in order, taken one at a time) as flat uint8 buckets of at least ``bucket_bytes`` each (the last
    one smaller), each tensor's bytes padded to :data:`ALIGN`. A bucket is made as soon as it is full, and its tensors
    are let go before it is yielded: a consumer that drops each bucket before asking for the next holds one bucket,
    or the tensors of the next and their copy into it, never the whole state."""
    current, size = [], 0
    for t in tensors:
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
        current.append(raw)
        if -raw.numel() % ALIGN:
            current.append(torch.zeros(-raw.numel() % ALIGN, dtype=torch.uint8, device=raw.device))
        size += _padded(raw.numel())
        del raw, t
        if size >= bucket_bytes:
            bucket = torch.cat(current)
            current, size = [], 0
            yield bucket
            del bucket
    if current:
        yield torch.cat(current)


def buckets(state: dict, bucket_bytes: int) -> list[torch.Tensor]:
    """The tensors of ``state`` (in its order) as flat uint8 buckets of at least ``bucket_bytes`` each (the last one
    smaller), each tensor's bytes padded to :data:`ALIGN`: one copy (the layout :func:`send` streams)."""
    return list(_bucketed(state.values(), bucket_bytes))


def unpack(like: dict, bufs: list[torch.Tensor]) -> dict:
    """The state dict whose bytes :func:`buckets` laid out in ``bufs``, with ``like``'s names, dtypes and shapes."""
    flat = torch.cat(bufs) if len(bufs) > 1 else bufs[0]
    out, offset = {}, 0
    for name, t in like.items():
        n = t.numel() * t.element_size()
        out[name] = flat[offset : offset + n].view(t.dtype).reshape(t.shape)
        offset += _padded(n)
    if offset != flat.numel():
        raise ValueError(f"weights broadcast: {flat.numel()} bytes received, the generator holds {offset}")
    return out


SUM_CHUNK = 1 << 16  # elements: a checksum's float64 copy of a tensor is made this many at a time (512 KiB)


def _sums(t: torch.Tensor) -> torch.Tensor:
    """(2,) float64 on ``t``'s device: Σ t and Σ |t|, in chunks of :data:`SUM_CHUNK` elements (a float64 copy of a
    whole tensor would take 4x a bf16 tensor's bytes beside it, more than a bucket)."""
    total = torch.zeros(2, dtype=torch.float64, device=t.device)
    for part in t.detach().reshape(-1).split(SUM_CHUNK):
        d = part.to(torch.float64, copy=True)  # a copy even of float64 (made absolute in place)
        total[0] += d.sum()
        total[1] += d.abs_().sum()
    return total


def checksum(state: dict) -> torch.Tensor:
    """(2,) float64 on the CPU: Σ w and Σ |w| over the tensors of ``state`` (on whichever device they are)."""
    total = torch.zeros(2, dtype=torch.float64)
    for t in state.values():
        total = total.to(t.device) + _sums(t)  # one copy to the host, at the end
    return total.cpu()


def send(items: Iterable[tuple[str, torch.Tensor]], spec: GroupSpec, bucket_bytes: int, root: bool = True) -> None:
    """Broadcast a state dict's tensors in its order (``items``: its ``(name, tensor)`` items, or a stream that makes
    each one when asked: a sharded learner's gathers, ``LearnerStrategy.whole_tensors``) from this process, rank 0 of
    ``spec``'s group (joined here if new), when ``root``: each bucket as it fills (one held at a time, dropped once
    sent; each tensor let go once copied into its bucket), then their checksum.

    Every learner rank whose stream is a collective calls it, ``root`` on rank 0 alone: the others take their part in
    each gather and send nothing. The stream is drained whatever the broadcast does (a member lost, a timeout: raised
    once drained), so that every rank takes part in every gather and the learners' collectives stay in step."""
    items = iter(items)
    try:
        if root:
            group = join(spec, 0)
            total = torch.zeros(2, dtype=torch.float64)

            def summed():
                nonlocal total
                for _, t in items:
                    total = total.to(t.device) + _sums(t)
                    yield t
                    del t  # before the next one is made

            for buf in _bucketed(summed(), bucket_bytes):
                _broadcast(group, buf)
                del buf  # before the next bucket is made
            _broadcast(group, total.cpu())
    finally:
        for _ in items:  # the gathers left (none once the broadcast completed)
            pass


def receive(like: dict, spec: GroupSpec, rank: int, bucket_bytes: int, first: bool = False,
            device: torch.device | str | None = None) -> dict:
    """Receive the broadcast of a state dict shaped as ``like`` (member ``rank`` > 0 of ``spec``'s group), checked:
    its buckets, then the sender's checksum, which the received bytes must match (a RuntimeError otherwise).
    ``first``: the group's first broadcast, when its members join; a member that has not joined at a later one is a
    re-created process and fails at once (joining alone would wait for the others, who joined long ago).
    ``device``: where the received buffers live (None: ``like``'s; a ``like`` of meta tensors, names and shapes
    alone, needs one)."""
    if not first and (spec.name, rank) not in _GROUPS:
        raise RuntimeError(f"not a member of {spec.name} (this worker was re-created since the group was built)")
    group = join(spec, rank)
    bufs = [torch.empty_like(b, device=device) for b in buckets(like, bucket_bytes)]
    for buf in bufs:
        _broadcast(group, buf)
    want = torch.zeros(2, dtype=torch.float64)
    _broadcast(group, want)  # the sender's, summed as it streamed the buckets
    state = unpack(like, bufs)
    got = checksum(state)
    # the same bytes summed on another device (a learner on a GPU, a worker on the CPU) can differ in float64's last
    # bits: a tolerance of 1e-9 of Σ|w|, where one corrupted byte moves the sums by far more
    if not torch.allclose(got, want, rtol=0.0, atol=1e-9 * float(want[1].abs()) + 1e-12):
        raise RuntimeError(f"weights broadcast over {spec.name}: checksum {got.tolist()} received, "
                           f"{want.tolist()} sent")
    return state


def memberships() -> list[str]:
    """The names of the weights groups this process is a member of (diagnostics)."""
    return sorted({name for name, _ in _GROUPS})


def leave(group_name: str) -> None:
    """Drop this process's membership of ``group_name`` (a group being replaced), if it has one."""
    for key in [k for k in _GROUPS if k[0] == group_name]:
        del _GROUPS[key]
