"""benchmarks/accumulation_memory.py's quick run: its table, and what it shows (micro-batches and activation
checkpointing lower the update's peak memory)."""

from __future__ import annotations

import json

import pytest

from benchmarks.accumulation_memory import main

pytestmark = pytest.mark.e2e


def test_quick_run_writes_the_table_and_lowers_the_peak(tmp_path):
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "accumulation_memory_quick.md").read_text()
    assert "| reinforce | 16 | 4 | yes |" in table and "none (one pass)" in table
    rows = json.loads((tmp_path / "accumulation_memory_quick.json").read_text())["updates"]
    peak = {(r["algo"], r["micro"], r["checkpointing"]): r["peak_mb"] for r in rows}
    for algo in ("reinforce", "mle"):
        assert peak[algo, 4, False] < peak[algo, None, False]  # a micro-batch's activations, not the batch's
        assert peak[algo, None, True] < peak[algo, None, False]  # the layers' inputs, not their insides
