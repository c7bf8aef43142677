"""Ports for the servers the tests start (Ray nodes, Serve, TensorBoard).

A port from ``bind(("127.0.0.1", 0))`` lies in the kernel's ephemeral range, which every later connection and
every ``bind(0)`` on the machine draws from, the worker processes of the session's own Ray included (thousands of
them over a test run): between our pick and the server's bind, another process can take it, and a Ray node whose
agent loses its port goes down with it. So ports are picked below that range, at random, each one bound once here
to see it is free and never handed out twice by this process. Also above 19999: `ray start` refuses a port inside its
default worker-port range (10002-19999).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_given: set[int] = set()
# its own generator: the global one is seeded by every training run (a run seeds Python's random with its seed), so
# two test processes that trained with the same seed would otherwise pick the same ports in the same order
_rng = random.SystemRandom()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default start of the range


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, outside the ephemeral range (from 20000 up to its start)."""
    low, high = 20000, max(_ephemeral_low(), 20001)
    for _ in range(1000):
        port = _rng.randrange(low, high)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free port in {low}-{high - 1}")
