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
