"""benchmarks/driver_fanin.py's quick run: the groups' real waits on light stand-in actors, before and after, their
table, fits and JSON record."""

from __future__ import annotations

import importlib.util
import json

import pytest

from benchmarks.driver_fanin import fits, main

pytestmark = [pytest.mark.ray, pytest.mark.e2e]


def test_fits_tell_linear_from_quadratic():
    xs = [1, 10, 100, 1000, 5000]
    linear = fits(xs, [2.0 + 1.2 * x for x in xs])
    quadratic = fits(xs, [2.0 + 1.2 * x + 1e-3 * x * x for x in xs])
    assert linear["grows"] == "linearly" and linear["linear"]["coef"][1] == pytest.approx(1.2)
    assert linear["loglog_exponent"] == pytest.approx(1.0, abs=0.05)
    assert quadratic["grows"] == "quadratically" and quadratic["quadratic"]["coef"][2] == pytest.approx(1e-3)
    assert quadratic["loglog_exponent"] > 1.5


def test_quick_run_times_both_waits_on_every_path(ray_session, tmp_path):
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "driver_fanin_quick.json").read_text())
    rows = record["rows"]
    assert {(r["path"], r["impl"]) for r in rows} == {(p, i) for p in ("sample", "mc", "waits")
                                                         for i in ("before", "after")}
    assert {(r["actors"], r["per_actor"]) for r in rows} == {(n, k) for n in (1, 2, 4) for k in (1, 5)}
    assert all(r["shards"] == r["actors"] * r["per_actor"] for r in rows)
    assert all(r["cpu_ms"] > 0 and r["wall_ms"] > 0 and len(r["cpu_ms_all"]) == 3 for r in rows)
    assert set(record["fits"]) == {f"{p}/{i}" for p in ("sample", "mc", "waits")
                                   for i in ("before", "after")}
    assert all(set(f["extrapolated_ms"]) == {"1000", "5000", "50000"} for f in record["fits"].values())
    # the stand-ins are light: no torch in them
    assert record["footprint"]["actors"] == 4 and record["footprint"]["with_torch"] == 0
    assert record["commit"] and record["command"] and record["machine"]["cpus"]
    report = (tmp_path / "driver_fanin_quick.md").read_text()
    assert "| sample | 4 | 5 | 20 |" in report and "| waits | before |" in report
    assert "Commit: " in report and "Command: " in report and "Machine: " in report
    assert (tmp_path / "driver_fanin_quick.png").exists() == (importlib.util.find_spec("matplotlib") is not None)
