"""benchmarks/scaling.py runs end to end at a tiny size through a real embedded Ray and reports consistent figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.ray
@pytest.mark.slow  # 47 s: a benchmark script, run by `pytest -m slow tests/benchmarks`
def test_scaling_tiny_run_reports_speedup_and_efficiency(tmp_path):
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # the script's own embedded Ray, never a cluster this shell points at
    r = subprocess.run(
        [sys.executable, "benchmarks/scaling.py", "--workers", "1", "2", "--iters", "3", "--repeats", "1",
         "--tasks", "counting", "--batch", "64", "--out", str(tmp_path), "--name", "tiny"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "tiny.json").read_text())
    assert data["ray"]["mode"] == "embedded" and data["ray"]["resources"]["CPU"] >= 1
    assert data["machine"]["cpus"] == os.cpu_count()
    rows = data["results"]["counting"]
    assert [row["workers"] for row in rows] == [1, 2]
    for row in rows:
        assert row["repeats"] == 1 and len(row["runs"]) == 1 and row["runs"][0]["workers"] == row["workers"]
        assert 0 < row["rollout_ms"] / 1000 < row["iter_s"]
        assert row["rollout_seq_per_s"] == pytest.approx(64 / (row["rollout_ms"] / 1000))
        assert row["iter_seq_per_s"] == pytest.approx(64 / row["iter_s"])
        for kind in ("rollout", "iter"):
            speedup = row[f"{kind}_seq_per_s"] / rows[0][f"{kind}_seq_per_s"]
            assert row[f"{kind}_speedup"] == pytest.approx(speedup)
            assert row[f"{kind}_efficiency"] == pytest.approx(speedup / row["workers"])
    assert rows[0]["rollout_speedup"] == 1.0 and rows[0]["rollout_marginal"] is None
    # the one added worker's marginal gain is the 2-worker throughput less the 1-worker one, per 1-worker throughput
    assert rows[1]["iter_marginal"] == pytest.approx(rows[1]["iter_speedup"] - 1)
    md = (tmp_path / "tiny.md").read_text()
    assert f"{os.cpu_count()} CPU cores" in md
    table = [line for line in md.splitlines() if line.startswith("| counting")]
    assert len(table) == 2 and all(line.count("|") == 13 for line in table)
    assert (tmp_path / "tiny.png").stat().st_size > 0
