"""`ray job submit` end to end: a local Ray head with token authentication, the training CLI submitted
with `--working-dir .`, SUCCEEDED, and the run's outputs where the job was told to write them."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.ports import free_port

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


@pytest.fixture(scope="module")
def ray_head():
    """`ray start --head --block` in its own process group, shared by this module's jobs (one at a time); torn
    down by signalling that group only (`ray stop` would also stop other Ray instances on the machine)."""
    if not Path(RAY).exists():
        pytest.skip(f"ray CLI not found next to {sys.executable}")
    env = dict(os.environ, RAY_AUTH_MODE="token")
    env.pop("RAY_ADDRESS", None)
    # rayseq as installed on a cluster: this checkout, ahead of an editable install of another one, for jobs whose
    # working dir is not the repository (a user's folder with only their data and reward)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    subprocess.run([RAY, "get-auth-token", "--generate"], env=env, check=True, capture_output=True, timeout=60)
    temp_dir = tempfile.mkdtemp(prefix="rsq", dir="/tmp")  # short: Ray's socket paths live below it
    gcs, dash = free_port(), free_port()
    # the agents get free ports too: another Ray on this machine (the session's `ray_session`) holds the
    # defaults, and a head whose job agent cannot bind refuses every submission ("No available agent")
    agents = [f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
              f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}"]
    proc = subprocess.Popen(
        [RAY, "start", "--head", "--block", f"--port={gcs}", f"--dashboard-port={dash}", *agents,
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", "--num-cpus=2",
         "--disable-usage-stats", f"--temp-dir={temp_dir}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    address = f"http://127.0.0.1:{dash}"
    deadline = time.monotonic() + 120
    while True:
        r = subprocess.run([RAY, "job", "list", "--address", address], env=env, capture_output=True,
                           text=True, timeout=60)
        if r.returncode == 0:
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"ray head did not come up: {r.stderr[-2000:]}")
        time.sleep(2)
    try:
        yield address, env
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


def submit(address: str, env: dict, *cmd: str, wait_s: float = 120, working_dir: Path = ROOT,
           cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`ray job submit --working-dir <repo> -- cmd` (run from ``cwd``). The head answers `ray job list` before its
    job agent has registered; until then a submission is refused with "No available agent" (HTTP 500, no job
    created), so that one answer is retried."""
    deadline = time.monotonic() + wait_s
    while True:
        r = subprocess.run([RAY, "job", "submit", "--address", address, "--working-dir", str(working_dir), "--",
                            *cmd], env=env, capture_output=True, text=True, timeout=900, cwd=cwd)
        if r.returncode == 0 or "No available agent" not in r.stdout + r.stderr or time.monotonic() > deadline:
            return r
        time.sleep(3)


def test_job_submit_runs_training_on_the_cluster(ray_head, tmp_path):
    address, env = ray_head
    run_dir = tmp_path / "job-run"
    r = submit(address, env, "python", "-m", "rayseq.train", "--config", "tune_configs/counting_quick.yaml",
               "train.pretrain_iters=30", "train.iters=6", "train.eval_every=3", "progress=false",
               f"run_dir={run_dir}")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "succeeded" in out.lower()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rollout_workers"] == 2 and summary["iterations"] == 36
    assert (run_dir / "metrics.parquet").exists() and list((run_dir / "checkpoints").glob("ckpt_*.pt"))
    # the job ran as a Ray job on that cluster, not in this process
    jobs = subprocess.run([RAY, "job", "list", "--address", address], env=env, capture_output=True,
                          text=True, timeout=60).stdout
    assert "SUCCEEDED" in jobs


def test_job_submit_runs_seqgan_with_scorer_actors(ray_head, tmp_path):
    """A SeqGAN experiment file through `ray job submit`: rollout workers, a scorer actor, d-steps."""
    address, env = ray_head
    run_dir = tmp_path / "seqgan-run"
    r = submit(address, env, "python", "-m", "rayseq.train", "--config", "tune_configs/seqgan_counting.yaml",
               "train.pretrain_iters=30", "train.iters=2", "train.batch_size=32", "train.eval_every=0",
               "disc.pretrain_steps=1", "disc.num_negatives=128", "algo.mc_rollouts=2", "task.test_size=200",
               "learner.num_cpus=0.5",  # learner + 2 workers + 1 scorer = 2 CPUs, what the test head offers
               "progress=false", f"run_dir={run_dir}")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algo"] == "seqgan" and summary["iterations"] == 33  # 30 MLE + 1 d-step + 2 adversarial
    assert {"val/precision", "test/precision"} <= set(summary["metrics"])


def test_job_with_a_relative_run_dir_says_where_it_writes(ray_head):
    """A relative run_dir in a job lands in Ray's temporary copy of --working-dir: the job says so at start,
    naming the absolute path. Its log is readable: a progress line per stage, not a bar's redraws."""
    from tests.conftest import TINY

    address, env = ray_head
    r = submit(address, env, "python", "-m", "rayseq.train", *[a for a in TINY if not a.startswith("progress")],
               "rollout.num_workers=0", "run_dir=runs/job-relative")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    m = re.search(r"warning: run_dir=runs/job-relative is relative: in this Ray job it is (\S+), in Ray's temporary "
                  r"copy of --working-dir", out)
    assert m, out[-4000:]
    assert m.group(1).endswith("/runs/job-relative") and "working_dir_files" in m.group(1)
    assert not (ROOT / "runs" / "job-relative").exists()  # not where the command was typed
    assert "\r" not in out
    progress = [line for line in out.splitlines() if line.startswith(("MLE pretraining ", "ppo_dynamic "))]
    assert len(progress) == 2 and progress[0].startswith("MLE pretraining 20/20 100%"), out[-4000:]


def test_job_submit_trains_on_your_own_data_and_reward(ray_head, tmp_path):
    """README's own-data example as a job: the user's folder (pairs.jsonl, my_reward.py, nothing else) is the
    working dir; the job prepares the data there, and my_reward imports on the learner and the scorer actor."""
    from tests.conftest import readme_own_data_example
    from tests.rewards.test_rewards import TINY_CLI, check_readme_run

    address, env = ray_head
    example = readme_own_data_example(ROOT)
    project = tmp_path / "project"
    project.mkdir()
    for name, content in example["files"].items():
        (project / name).write_text(content)
    cmd = example["job"]
    assert cmd[cmd.index("--working-dir") + 1] == "."
    entrypoint = cmd[cmd.index("--") + 1 :]
    run_dir = tmp_path / "pairs-run"
    # learner + 2 workers + 1 scorer = 2 CPUs, what the test head offers
    r = submit(address, env, *entrypoint, *TINY_CLI, "learner.num_cpus=0.5", f"run_dir={run_dir}",
               working_dir=Path("."), cwd=project)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    check_readme_run(run_dir)
    assert not (project / "data").exists()  # prepared inside the job's copy of the folder, not here
