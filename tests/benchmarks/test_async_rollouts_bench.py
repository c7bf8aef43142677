"""benchmarks/async_rollouts.py's quick run: the synchronous run and one sampled ahead, with and without the
straggler, on their own embedded Ray; the table, the JSON record and the plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.ray
@pytest.mark.slow  # about a minute: a benchmark script, run by `pytest -m slow tests/benchmarks`
def test_quick_run_times_k0_and_k2_with_and_without_a_straggler(tmp_path):
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # the script's own embedded Ray, never a cluster this shell points at
    r = subprocess.run([sys.executable, "benchmarks/async_rollouts.py", "--quick", "--cases", "counting", "--seeds",
                        "0", "--ks", "0", "2", "--slow", "10", "--out", str(tmp_path)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = json.loads((tmp_path / "async_rollouts_quick.json").read_text())["runs"]
    assert [(r["k"], r["slow"]) for r in runs] == [(0, 1.0), (2, 1.0), (0, 10.0), (2, 10.0)]
    by = {(r["k"], r["slow"]): r for r in runs}
    assert by[0, 1.0]["staleness"] == 0 and by[2, 1.0]["staleness"] > 0  # the first batch is fresh, then k
    assert all(0 < r["learner_busy"] <= 1 and 0 < r["workers_busy"] <= 1 for r in runs)
    # the synchronous iteration waits for the straggler (it sleeps 9 times its sampling time after each call)
    assert by[0, 10.0]["s_per_iter"] > by[0, 1.0]["s_per_iter"]
    text = (tmp_path / "async_rollouts_quick.md").read_text()
    assert "| counting | worker 0 × 10 | 2 |" in text and "| counting | none | 0 |" in text
    assert (tmp_path / "async_rollouts_quick.png").stat().st_size > 0
