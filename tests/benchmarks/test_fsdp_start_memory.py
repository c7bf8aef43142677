"""benchmarks/fsdp_start_memory.py's quick run: two sharded learner ranks start, each reports its memory."""

from __future__ import annotations

import json

import pytest

from benchmarks.fsdp_start_memory import main

pytestmark = pytest.mark.e2e


def test_quick_run_writes_each_ranks_memory(tmp_path):
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "fsdp_start_memory_quick.md").read_text()
    assert "| after | 0 |" in table and "| after | 1 |" in table
    runs = json.loads((tmp_path / "fsdp_start_memory_quick.json").read_text())["runs"]
    assert [r["rank"] for r in runs] == [0, 1]
    assert all(r["reference_peak_mb"] >= r["start_peak_mb"] >= r["built_peak_mb"] > 0 for r in runs)
