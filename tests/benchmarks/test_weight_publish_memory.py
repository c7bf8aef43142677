"""benchmarks/weight_publish_memory.py's quick run: its table, and what it shows (while two sharded learners publish,
rank 0 holds the whole model and its packed copy through the object store, about a bucket and one tensor over the
collective sync)."""

from __future__ import annotations

import json

import pytest

from benchmarks.weight_publish_memory import main

pytestmark = pytest.mark.e2e


def test_quick_run_bounds_the_collective_publish_by_the_bucket(tmp_path):
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    assert "| bfloat16 | 8.0 | collective | 0.5 |" in (tmp_path / "weight_publish_memory_quick.md").read_text()
    rows = json.loads((tmp_path / "weight_publish_memory_quick.json").read_text())["rows"]
    peak = {(r["path"], r["rank"]): r["peak_mb"] for r in rows}
    assert peak["object_store", 0] >= 15.0  # the whole bf16 model (8 MiB) and its packed copy
    assert peak["collective", 0] < 8.0  # a bucket, one tensor (2 MiB) and its gather's buffers
    assert peak["collective, gathered whole first", 0] >= 8.0
