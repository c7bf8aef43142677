"""Stopping what rayseq starts leaves nothing behind: `kill PID` (SIGTERM) or Ctrl-C (SIGINT) of `python -m
rayseq.serve` and of a run stops every Ray process it started (the dashboard and runtime-env agents ignore SIGTERM and
used to stay), quietly (no native stack dump, no "graceful_shutdown failed"); and an embedded Ray leaves the dashboard
agent's port 52365 to a user's `ray start --head`. The real CLI, processes counted before and after."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import TINY, signal_when_ready
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
NOISE = ("SIGTERM received", "graceful_shutdown failed", "Traceback", "killed by `ray.kill`", "PytorchStreamReader")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _stop_and_count(proc: subprocess.Popen, sig: int, ready, timeout_s: float = 300) -> tuple[dict, list, str]:
    """Wait for ``ready()``, note the process's descendants (Ray's processes), send ``sig``; (descendants before,
    those alive 5 s after it exited, its stderr)."""
    before, err = signal_when_ready(proc, sig, ready, timeout_s)
    deadline = time.monotonic() + 5
    while _alive(before) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _alive(before)
    for pid in left:  # (so that a failure leaves nothing running either)
        os.kill(pid, signal.SIGKILL)
    return before, [f"{pid} {before[pid]}" for pid in left], err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    from rayseq.distributed.driver import Trainer
    from tests.conftest import tiny_config

    run = tmp_path_factory.mktemp("signals") / "run"
    Trainer(tiny_config("rollout.num_workers=0", "train.iters=1", run_dir=run)).run()
    return run


@pytest.mark.ray
@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_stopping_a_server_leaves_no_process_and_prints_nothing_alarming(run_dir, tmp_path, sig):
    out = tmp_path / "serve.out"  # redirected, as `python -m rayseq.serve ... > serve.out &`: the line is flushed
    with open(out, "w") as stdout:
        proc = subprocess.Popen([sys.executable, "-m", "rayseq.serve", "--checkpoint", str(run_dir), "--port",
                                 str(free_port())], cwd=ROOT, env=_env(), stdout=stdout, stderr=subprocess.PIPE,
                                text=True)
        before, left, err = _stop_and_count(proc, sig, lambda: "serving " in out.read_text())
    names = set(before.values())
    assert {"raylet", "gcs_server"} <= names and any("Dashboard" in n for n in names), names
    assert proc.returncode == 0, err[-3000:]
    assert left == [], f"left running after {signal.Signals(sig).name}: {left}"
    assert not [n for n in NOISE if n in err], err[-3000:]


@pytest.mark.ray
def test_sigterm_of_a_run_checkpoints_and_leaves_no_process(tmp_path):
    from rayseq.checkpoint import list_checkpoints

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "rayseq.train", *TINY, "train.pretrain_iters=2000", "rollout.num_workers=1",
           "train.checkpoint_every=5", f"run_dir={run}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    before, left, err = _stop_and_count(proc, signal.SIGTERM, lambda: bool(list_checkpoints(run)))
    assert "raylet" in set(before.values())
    assert proc.returncode == 130 and "--resume" in err, err[-3000:]
    assert left == [], f"left running after SIGTERM: {left}"
    assert not [n for n in NOISE if n in err], err[-3000:]


@pytest.mark.ray
def test_an_embedded_ray_leaves_the_dashboard_agent_port_free(tmp_path):
    """`ray job submit` to a user's `ray start --head` needs its agent on 52365 ("No available agent to submit job"
    while another instance holds it): rayseq's embedded Ray gives its agent a free port instead."""
    code = ("import json, ray\nfrom rayseq.distributed.runtime import init_ray\ninit_ray()\n"
            "print(json.dumps([n['DashboardAgentListenPort'] for n in ray.nodes()]))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ports = [int(p) for p in r.stdout.strip().splitlines()[-1].strip("[]").split(",")]
    assert len(ports) == 1 and ports[0] not in (52365, 0, -1), ports
