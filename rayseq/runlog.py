"""Run outputs: ``metrics.parquet`` (one row per iteration), TensorBoard events, JSON/YAML files."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: str | Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


class MetricsLog:
    """Collects one row per iteration: ``stage``, ``iteration``, then metric columns (sorted).

    Rows are kept in memory and the Parquet file is rewritten (atomically) on ``flush``;
    TensorBoard scalars are written as rows arrive.
    """

    def __init__(self, run_dir: str | Path, rows: list[dict] | None = None, tensorboard: bool = True):
        self.path = Path(run_dir) / "metrics.parquet"
        self.rows: list[dict] = list(rows or [])
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(Path(run_dir) / "tb"), flush_secs=10)

    @classmethod
    def read_rows(cls, run_dir: str | Path) -> list[dict]:
        path = Path(run_dir) / "metrics.parquet"
        return pq.read_table(path).to_pylist() if path.exists() else []

    def log(self, stage: str, iteration: int, metrics: dict) -> None:
        row = {"stage": stage, "iteration": int(iteration)}
        row.update({k: float(v) for k, v in metrics.items()})
        self.rows.append(row)
        if self._tb is not None:
            for k, v in metrics.items():
                if math.isfinite(float(v)):
                    self._tb.add_scalar(k, float(v), iteration)

    def flush(self) -> None:
        if not self.rows:
            return
        keys = sorted({k for r in self.rows for k in r} - {"stage", "iteration"})
        columns = {
            "stage": pa.array([r["stage"] for r in self.rows], pa.string()),
            "iteration": pa.array([r["iteration"] for r in self.rows], pa.int64()),
        }
        for k in keys:
            columns[k] = pa.array([r.get(k) for r in self.rows], pa.float64())
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        pq.write_table(pa.table(columns), tmp)
        os.replace(tmp, self.path)
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        self.flush()
        if self._tb is not None:
            self._tb.close()
