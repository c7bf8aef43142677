"""benchmarks/loss_menu.py's quick run: a short MLE start, then three loss variants (token mean, Dr.GRPO's constant
denominator, GMPO) from it; the table, the JSON record with every run's curves, the plot."""

from __future__ import annotations

import json

import pytest

from benchmarks.loss_menu import main

pytestmark = pytest.mark.e2e


def test_quick_run_trains_each_variant_from_one_start_and_reports_it(tmp_path):
    assert main(["--quick", "--out", str(tmp_path), "--runs", str(tmp_path / "runs")]) == 0
    table = (tmp_path / "loss_menu_quick.md").read_text()
    for row in ("| dapo | `(defaults)` |", "| dr_grpo | `algo.loss_type=dr_grpo algo.scale_rewards=none` |",
                "| gmpo | `algo.loss_type=gmpo algo.eps=0.4` |"):
        assert row in table
    record = json.loads((tmp_path / "loss_menu_quick.json").read_text())
    runs = record["runs"]
    assert set(runs) == {"dapo-s0", "dr_grpo-s0", "gmpo-s0"}
    starts = {r["start"] for r in runs.values()}
    assert len(starts) == 1  # one MLE start for every variant of the seed
    for r in runs.values():
        assert r["curve"][0][0] == 0 and len(r["curve"]) >= 2 and 0 <= r["test"] <= 1
        assert r["len_first"] == r["len_last"] == 3.0  # counting: 3-token replies
        assert r["clipfrac_mean"] is not None and r["iter_s_median"] > 0
    assert (tmp_path / "loss_menu_quick.png").stat().st_size > 0
