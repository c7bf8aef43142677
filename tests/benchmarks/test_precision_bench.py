"""benchmarks/precision.py's quick run: both dtypes of a case, their table and JSON record."""

from __future__ import annotations

import json

import pytest

from benchmarks.precision import main

pytestmark = pytest.mark.e2e


def test_quick_run_compares_both_dtypes(tmp_path):
    assert main(["--quick", "--seeds", "0", "--cases", "counting", "--out", str(tmp_path)]) == 0
    runs = json.loads((tmp_path / "precision_quick.json").read_text())["runs"]
    assert [r["dtype"] for r in runs] == ["float32", "bfloat16"]
    assert all(0.0 <= r["figure"] <= 1.0 and r["iter_s"] > 0 for r in runs)
    assert "| counting | bfloat16 |" in (tmp_path / "precision_quick.md").read_text()
