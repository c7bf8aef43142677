"""Weights over a collective (``rollout.weight_sync=collective``): the learner (rank 0 of the group) broadcasts the
generator's trained weights to the rollout workers over ``ray.util.collective`` (gloo on CPU, NCCL on GPU), in the
model's dtype, in byte buckets of ``rollout.weight_bucket_mb``, instead of every worker pulling one packed copy from
the learner's node through the object store.

Both sides lay the same state dict (the generator's ``state_dict()``: every weight, or a LoRA policy's adapters) out
the same way (:func:`buckets`), so nothing but the bytes crosses: no spec, no pickling. The calls are queued, not
waited for: the learner's broadcast behind its update, each worker's receive ahead of its next sampling call, so a
chained iteration keeps its order with no driver round trip. The sampling calls still carry the object-store
reference of the same version, which a worker reads only when it lacks that version: after a failed broadcast (a
worker lost mid-broadcast: the others time out) the iteration completes from the object store, and the next
broadcast goes to a group rebuilt with the re-created worker (:class:`CollectiveWeights`).

References: OpenRLHF's and veRL's NCCL broadcast to the rollout engines (``_broadcast_to_vllm``; the checkpoint
engine), slime's bucketed ``update_weight_from_distributed``.
"""

from __future__ import annotations

import uuid

import torch

ALIGN = 64  # bytes: each tensor starts at a multiple of it (so that the receiver views it in place)


def _padded(nbytes: int) -> int:
    return nbytes + (-nbytes % ALIGN)


def buckets(state: dict, bucket_bytes: int) -> list[torch.Tensor]:
    """The tensors of ``state`` (in its order) as flat uint8 buckets of at least ``bucket_bytes`` each (the last one
    smaller), each tensor's bytes padded to :data:`ALIGN`: one copy."""
    out, current, size = [], [], 0
    for t in state.values():
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
        current.append(raw)
        if -raw.numel() % ALIGN:
            current.append(torch.zeros(-raw.numel() % ALIGN, dtype=torch.uint8, device=raw.device))
        size += _padded(raw.numel())
        if size >= bucket_bytes:
            out.append(torch.cat(current))
            current, size = [], 0
    if current:
        out.append(torch.cat(current))
    return out


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


def checksum(state: dict) -> torch.Tensor:
    """(2,) float64 on the CPU: Σ w and Σ |w| over the tensors of ``state`` (on whichever device they are)."""
    total = torch.zeros(2, dtype=torch.float64)
    for t in state.values():
        d = t.detach().double()
        total += torch.stack([d.sum(), d.abs().sum()]).cpu()
    return total


def send(state: dict, group_name: str, bucket_bytes: int) -> None:
    """Broadcast ``state`` from this process (rank 0 of ``group_name``): its checksum, then its buckets."""
    import ray.util.collective as col

    col.broadcast(checksum(state), src_rank=0, group_name=group_name)
    for buf in buckets(state, bucket_bytes):
        col.broadcast(buf, src_rank=0, group_name=group_name)


def receive(like: dict, group_name: str, bucket_bytes: int, join: bool = False) -> dict:
    """Receive the broadcast of a state dict shaped as ``like`` (rank > 0 of ``group_name``), checked: its checksum
    is the sender's (a RuntimeError otherwise). ``join``: the group's first broadcast, when its members connect; a
    member that is not connected at a later one is a re-created process and fails at once (connecting alone would
    wait for the others, who connected long ago)."""
    import ray.util.collective as col

    if not join and not col.is_group_initialized(group_name):
        raise RuntimeError(f"not a member of {group_name} (this worker was re-created since the group was built)")
    want = torch.zeros(2, dtype=torch.float64)
    col.broadcast(want, src_rank=0, group_name=group_name)
    bufs = [torch.empty_like(b) for b in buckets(like, bucket_bytes)]
    for buf in bufs:
        col.broadcast(buf, src_rank=0, group_name=group_name)
    state = unpack(like, bufs)
    got = checksum(state)
    # the same bytes summed on another device (a learner on a GPU, a worker on the CPU) can differ in float64's last
    # bits: a tolerance of 1e-9 of Σ|w|, where one corrupted byte moves the sums by far more
    if not torch.allclose(got, want, rtol=0.0, atol=1e-9 * float(want[1].abs()) + 1e-12):
        raise RuntimeError(f"weights broadcast over {group_name}: checksum {got.tolist()} received, "
                           f"{want.tolist()} sent")
    return state


def leave(group_name: str) -> None:
    """Destroy this process's membership of ``group_name`` (a group being replaced), if it has one."""
    import ray.util.collective as col

    if col.is_group_initialized(group_name):
        col.destroy_collective_group(group_name)


class CollectiveWeights:
    """The driver's side: one collective group of the learner (rank 0) and the rollout workers (ranks 1..n), rebuilt
    under a new name after a failed broadcast or a re-created worker; :meth:`broadcast` queues one version."""

    def __init__(self, ray, backend: str, bucket_bytes: int, timeout_s: float = 60.0):
        self.ray, self.backend, self.bucket_bytes = ray, backend, bucket_bytes
        self.timeout_ms = int(timeout_s * 1000)
        self._run = uuid.uuid4().hex[:8]
        self.generation = 0  # groups built so far
        self.group: str | None = None
        self._members: list = []
        self._pending: list = []  # the last broadcast's calls
        self._restarts = 0
        self._join = True
        self.rebuilds = 0

    def _healthy(self, restarts: int) -> bool:
        """Whether the current group can carry the next version: built, no worker re-created since, and the last
        broadcast did not fail."""
        if self.group is None or restarts != self._restarts:
            return False
        ready, _ = self.ray.wait(self._pending, num_returns=len(self._pending), timeout=0)
        for ref in ready:
            try:
                self.ray.get(ref)  # None: nothing is fetched
            except Exception:  # noqa: BLE001 - a lost worker, a gloo timeout: the group is rebuilt
                return False
        return True

    def _rebuild(self, learner, workers: list, restarts: int) -> None:
        from ray.util import collective as col

        if self.group is not None:  # free the old group where it lives
            for member in self._members:
                member.leave_weight_group.remote(self.group)
            self.close()
        self.generation += 1
        self.rebuilds += self.group is not None
        self.group = f"rayseq-weights-{self._run}-{self.generation}"
        self._members = [learner, *workers]
        col.create_collective_group(self._members, len(self._members), list(range(len(self._members))),
                                    backend=self.backend, group_name=self.group, gloo_timeout=self.timeout_ms)
        self._restarts = restarts
        self._join = True  # the next broadcast is the group's first

    def close(self) -> None:
        """Remove the current group's rendezvous record (a detached named actor ``create_collective_group`` leaves)."""
        if self.group is None:
            return
        try:
            self.ray.kill(self.ray.get_actor(f"info_{self.group}"))
        except ValueError:  # already gone
            pass

    def forget(self) -> None:
        """The learner was rebuilt: the next broadcast builds a new group."""
        self.close()
        self.group = None

    def broadcast(self, learner, workers: list, version: int, restarts: int) -> None:
        """Queue weights ``version``: the learner's send (behind its update) and each worker's receive (ahead of its
        next call). ``restarts``: the worker re-creations so far (a new one is not in the group yet)."""
        if not self._healthy(restarts):
            self._rebuild(learner, workers, restarts)
        self._pending = [learner.send_weights.remote(self.group, self.bucket_bytes),
                         *[w.receive_weights.remote(self.group, version, self.bucket_bytes, self._join)
                           for w in workers]]
        self._join = False

    def wait(self) -> None:
        """Wait for the last broadcast (tests, benchmarks); raises what it raised."""
        self.ray.get(self._pending)
