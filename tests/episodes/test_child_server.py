"""A server an environment starts (the OpenEnv adapter's) ends with the process that started it, even one killed with
SIGKILL, when no exit handler runs (rayseq.episodes.child_server)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from rayseq.episodes import child_server

APP = "tests.episodes.health_app:app"  # a FastAPI app answering /health

STARTER = f"""
import os, sys, time
from rayseq.episodes.adapters import serve_openenv, _SERVERS
url = serve_openenv({APP!r}, startup_timeout_s=60)
print(url, _SERVERS[{APP!r}][0].pid, flush=True)
time.sleep(600)
"""


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)  # reaps it if it is ours (it is not: its parent was the killed process)
        except ChildProcessError:
            pass
        if not child_server.alive(pid):
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:  # a zombie awaiting its reaper has ended
                if f.read().split()[2] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.2)
    return False


def test_server_ends_when_its_starter_is_killed():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        url, pid = starter.stdout.readline().split()
        pid = int(pid)
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            assert r.status == 200
        os.kill(starter.pid, signal.SIGKILL)  # no atexit, no clean-up: as ray.kill or a lost node
        starter.wait(timeout=10)
        assert _gone(pid, within_s=15), f"the server (pid {pid}) outlived the process that started it"
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/health", timeout=2)
    finally:
        starter.kill()


def test_watch_ends_a_process_whose_parent_is_gone():
    """The watch itself: a child told to watch a pid that has ended exits at once, whatever it was doing."""
    code = ("import time; from rayseq.episodes.child_server import watch_parent; "
            "watch_parent(2 ** 22 + 7, poll_s=0.05); time.sleep(60)")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], timeout=30)
    assert proc.returncode == 0 and time.monotonic() - t0 < 20


def test_alive():
    assert child_server.alive(os.getpid())
    assert not child_server.alive(2 ** 22 + 7)  # above the kernel's pid limit: never a process
