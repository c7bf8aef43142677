"""The in-process path against Ray workers: the same config run with ``rollout.num_workers`` 0 and 1, compared
metric by metric (tests/distributed/test_ray_runtime.py, tests/hf/test_hf_ray.py)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from rayseq.distributed.driver import Trainer


def runs_in_process_and_on_a_worker(make_cfg, tmp_path) -> tuple:
    """``make_cfg(n, run_dir)`` run with 0 (in-process) and 1 rollout worker; their metrics tables (a, b)."""
    rows = {}
    for n in (0, 1):
        summary = Trainer(make_cfg(n, tmp_path / f"w{n}")).run()
        assert summary["rollout_workers"] == n
        rows[n] = pq.read_table(tmp_path / f"w{n}" / "metrics.parquet").to_pandas()
    a, b = rows[0], rows[1]
    assert list(a["iteration"]) == list(b["iteration"])
    return a, b


def assert_same_metrics(a, b, columns, rtol: float, atol: float) -> None:
    for col in columns:
        np.testing.assert_allclose(a[col].to_numpy(float), b[col].to_numpy(float), rtol=rtol, atol=atol,
                                   equal_nan=True, err_msg=col)
