"""benchmarks/learner_memory.py's quick run: its table, and what it shows (the micro-batched passes' largest
allocation does not grow with the batch; one pass's does)."""

from __future__ import annotations

import json

import pytest

from benchmarks.learner_memory import main

pytestmark = pytest.mark.e2e


def test_quick_run_writes_the_table_and_bounds_the_micro_batched_passes(tmp_path):
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "learner_memory_quick.md").read_text()
    assert "| 2,048 | 32 | 16 |" in table and "none (one pass)" in table
    rows = json.loads((tmp_path / "learner_memory_quick.json").read_text())["passes"]
    largest = {(r["batch"], r["micro"]): r["largest_mb"] for r in rows}
    assert largest[32, 16] == largest[16, 16] < largest[32, None]  # bounded by the micro-batch, not the batch
    assert largest[32, None] > largest[16, None]  # one pass: grows with the batch
