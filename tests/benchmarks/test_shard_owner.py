"""benchmarks/shard_owner.py's quick run: shards owned by the driver and by the workers, fetched by light ranks; the
fits of the driver's CPU per shard and per look-up; which owner's shard outlives its worker."""

from __future__ import annotations

import json

import pytest

from benchmarks.shard_owner import main

pytestmark = [pytest.mark.ray, pytest.mark.e2e]


def test_quick_run_times_both_owners_and_finds_which_shard_outlives_its_worker(ray_session, tmp_path):
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "shard_owner_quick.json").read_text())
    rows = record["rows"]
    assert {(r["shard_bytes"], r["workers"], r["ranks"], r["owner"]) for r in rows} == {
        (b, n, r, o) for b in (16 << 10, 1 << 20) for n in (1, 2, 4) for r in (1, 2) for o in ("driver", "workers")}
    assert all(r["cpu_ms"] > 0 and r["wall_ms"] > 0 and len(r["cpu_ms_all"]) == 3 for r in rows)
    assert set(record["fits"]) == {f"{b}/{o}" for b in (16 << 10, 1 << 20) for o in ("driver", "workers")}
    # a shard the driver owns is read after the worker that sampled it is gone; a 1 MiB one its worker owned is lost
    # with it (a small one may have travelled with its reference: either answer)
    survival = record["survival"]
    assert survival[f"{16 << 10}/driver"] == survival[f"{1 << 20}/driver"] == "read"
    assert survival[f"{1 << 20}/workers"] == "OwnerDiedError"
    assert survival[f"{16 << 10}/workers"] in ("read", "OwnerDiedError")
    assert record["footprint"] == {"actors": 6, "with_torch": 0}
