"""Seeds of a run's random streams, all derived from the run's ``seed``.

Every stream that an algorithm or the runtime draws (PPO's minibatch permutations, scheduled sampling's coin
flips, ...) gets its own seed from (run seed, stream name, ids such as the iteration or the worker's shard), so
two runs with different ``seed`` never share a stream, one run's streams never collide, and the same run
seed reproduces every one of them.
"""

from __future__ import annotations

import hashlib


def derive_seed(run_seed: int, stream: str, *ids: int) -> int:
    """A seed in [0, 2^63) for ``stream`` of the run seeded ``run_seed`` at ``ids`` (e.g. the iteration)."""
    key = ":".join([str(int(run_seed)), stream, *(str(int(i)) for i in ids)]).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def set_deterministic(on: bool) -> None:
    """``deterministic=true``: only deterministic torch kernels in this process (CUDA's atomics-based backward passes,
    e.g. the embedding's, are not), and cuBLAS with a fixed workspace, which it reads when CUDA starts."""
    if not on:
        return
    import os

    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
