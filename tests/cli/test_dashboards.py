"""The dashboards README promises: ``tensorboard --logdir runs`` works from the install and shows a run's
curves, and ``python -m rayseq.tune`` names the folder that holds them (not Ray's temporary staging folder)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from rayseq.distributed.driver import Trainer
from rayseq.tune import TensorBoardHint, tensorboard_hint_at
from tests.conftest import tiny_config
from tests.ports import free_port


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real run, in-process: 20 MLE + 2 PPO-dynamic iterations (~3 s)."""
    run = tmp_path_factory.mktemp("tb") / "run"
    Trainer(tiny_config("rollout.num_workers=0", "train.iters=2", run_dir=run)).run()
    return run


def tensorboard_exe() -> str:
    beside = Path(sys.executable).with_name("tensorboard")  # the venv the tests run in
    return str(beside) if beside.exists() else shutil.which("tensorboard")


def test_tensorboard_is_installed_with_rayseq():
    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "tensorboard"]
    assert callable(ep.load())
    assert tensorboard_exe(), "the tensorboard command is not on PATH"


def test_tensorboard_reads_the_runs_scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"loss/nll", "loss/policy", "time/iter_s"} <= tags
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    for tag in ("loss/nll", "loss/policy"):  # one event per iteration that logged the metric, same values
        logged = {r["iteration"]: r[tag] for r in rows if r.get(tag) is not None}
        events = {e.step: e.value for e in acc.Scalars(tag)}
        assert events.keys() == logged.keys() and logged
        assert all(events[k] == pytest.approx(v, rel=1e-5, abs=1e-6) for k, v in logged.items())


def test_tensorboard_command_serves_the_run(run_dir):
    """``tensorboard --logdir <run>`` as README says: it starts and lists the run's scalars over HTTP."""
    port = free_port()
    proc = subprocess.Popen([tensorboard_exe(), "--logdir", str(run_dir), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline, tags = time.monotonic() + 60, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                tags = httpx.get(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5).json()
                if tags.get("tb"):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.3)
        assert proc.poll() is None, proc.stdout.read()
        assert tags and "loss/nll" in tags["tb"], tags
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


def test_tunes_tensorboard_hint_names_the_experiment_folder():
    """Ray Tune's start-up hint names its staging folder; rayseq rewrites that one line and nothing else,
    also when it arrives in pieces (print writes the text and the newline separately)."""
    out = io.StringIO()
    hint = TensorBoardHint(out, "/data/tune/exp")
    ray_line = ("To visualize your results with TensorBoard, run: "
                "`tensorboard --logdir /tmp/ray/session_1/artifacts/2026/exp/driver_artifacts`")
    hint.write("\nView detailed results here: /data/tune/exp\n")
    hint.write(ray_line[:20])
    assert out.getvalue().endswith("/data/tune/exp\n")  # held: it may still be the hint
    hint.write(ray_line[20:])
    hint.write("\n")
    hint.write("WARNING something real happened\n")
    hint.write("progress 50%")  # a partial line that cannot be the hint is written at once
    assert out.getvalue().endswith("progress 50%")
    hint.flush()
    assert out.getvalue().splitlines() == [
        "", "View detailed results here: /data/tune/exp",
        "To visualize your results with TensorBoard, run: `tensorboard --logdir /data/tune/exp`",
        "WARNING something real happened", "progress 50%",
    ]

    captured = io.StringIO()
    real = sys.stdout
    sys.stdout = captured
    try:
        with tensorboard_hint_at("/x/exp"):
            print(ray_line)
            print("other")
    finally:
        sys.stdout = real
    assert captured.getvalue() == ("To visualize your results with TensorBoard, run: `tensorboard --logdir /x/exp`\n"
                                   "other\n")
