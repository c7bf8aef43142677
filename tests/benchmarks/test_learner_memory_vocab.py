"""benchmarks/learner_memory_vocab.py's quick run: one PPO update per process, its table, JSON and plot."""

from __future__ import annotations

import json

import pytest

from benchmarks.learner_memory_vocab import main

pytestmark = pytest.mark.e2e


def test_quick_run_writes_the_table(tmp_path):
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "learner_memory_vocab_quick.md").read_text()
    assert "| after | 4 | 1 | reply, chunked |" in table and "- command:" in table and "- date:" in table
    runs = json.loads((tmp_path / "learner_memory_vocab_quick.json").read_text())["runs"]
    assert len(runs) == 4 and all(r["update_mb"] > 0 and r["peak_mb"] > r["update_mb"] for r in runs)
    assert (tmp_path / "learner_memory_vocab_quick.png").stat().st_size > 0
