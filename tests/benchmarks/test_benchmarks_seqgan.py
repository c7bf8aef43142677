"""The SeqGAN benchmark scripts run end to end at tiny sizes (as cleanrl's tests run each script briefly)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.ray
@pytest.mark.slow  # 45 s: a benchmark script, run by `pytest -m slow tests/benchmarks`
def test_rollout_throughput_quick_writes_every_row_and_a_speedup(tmp_path):
    out = tmp_path / "rollout_throughput.json"
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # the script's own embedded Ray, never a cluster this shell points at
    r = subprocess.run(
        [sys.executable, "benchmarks/rollout_throughput.py", "--quick", "--repeats", "1", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    labels = {row["label"] for row in data["rows"]}
    assert labels == {"(a) plain loop", "(b) batched cached, in-process", "(c) batched, Ray actors",
                      "(d) lower bound"}
    for row in data["rows"]:
        assert row["name"] and 0 < row["min_s"] <= row["median_s"]
    assert data["speedup_vs_plain_loop"] > 0
    assert data["sizes"]["quick"] and data["sizes"]["continuations"] == 8 * 19 * 4  # B·(T−1)·N
    # every oracle sequence has T tokens, so each row's Q ends in the same D(Y) (same D weights everywhere)
    assert data["q_last_column_max_abs_diff"] < 1e-5
    assert all(0 < q < 1 for q in data["q_mean"].values())
    assert "| (a) plain loop |" in (tmp_path / "rollout_throughput.md").read_text()
