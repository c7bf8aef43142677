"""`ray job submit` end to end: a local Ray head with token authentication, the training CLI submitted
with `--working-dir .`, SUCCEEDED, and the run's outputs where the job was told to write them."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.deploy.local_cluster import RAY, ROOT
from tests.deploy.local_cluster import submit_job as submit

pytestmark = pytest.mark.ray


def test_job_submit_runs_training_on_the_cluster_and_says_where_a_relative_run_dir_is(ray_head):
    """The counting experiment file as a Ray job with 2 rollout workers. Its relative run_dir lands in Ray's
    temporary copy of --working-dir: the job says so at start, naming the absolute path, where the run's outputs
    are. Its log is readable: a progress line per stage, not a bar's redraws."""
    address, env = ray_head
    r = submit(address, env, "python", "-m", "rayseq.train", "--config", "tune_configs/counting_quick.yaml",
               "train.pretrain_iters=30", "train.iters=6", "train.eval_every=3",
               "progress_every=600",  # a line at the end of each stage only, however loaded the machine
               "run_dir=runs/job-relative")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "succeeded" in out.lower()
    m = re.search(r"warning: run_dir=runs/job-relative is relative: in this Ray job it is (\S+), in Ray's temporary "
                  r"copy of --working-dir", out)
    assert m, out[-4000:]
    assert m.group(1).endswith("/runs/job-relative") and "working_dir_files" in m.group(1)
    assert not (ROOT / "runs" / "job-relative").exists()  # not where the command was typed
    run_dir = Path(m.group(1))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rollout_workers"] == 2 and summary["iterations"] == 36
    assert (run_dir / "metrics.parquet").exists() and list((run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert "\r" not in out
    progress = [line for line in out.splitlines() if line.startswith(("MLE pretraining ", "ppo_dynamic "))]
    assert len(progress) == 2 and progress[0].startswith("MLE pretraining 30/30 100%"), out[-4000:]
    # the job ran as a Ray job on that cluster, not in this process
    jobs = subprocess.run([RAY, "job", "list", "--address", address], env=env, capture_output=True,
                          text=True, timeout=60).stdout
    assert "SUCCEEDED" in jobs


@pytest.mark.slow  # SeqGAN on rollout workers and a scorer actor: tests/algos/test_seqgan.py, on the tests' Ray
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


def test_job_submit_trains_on_your_own_data_and_reward(ray_head, tmp_path):
    """The own-data guide's example as a job: the user's folder (pairs.jsonl, my_reward.py, nothing else) is the
    working dir; the job prepares the data there, and my_reward imports on the learner and the scorer actor."""
    from tests.doc_examples import own_data_example
    from tests.rewards.test_rewards import TINY_CLI, check_own_data_run

    address, env = ray_head
    example = own_data_example(ROOT)
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
    check_own_data_run(run_dir)
    assert not (project / "data").exists()  # prepared inside the job's copy of the folder, not here


@pytest.mark.slow  # the tests' own harness: what keeps a loaded machine's lost job head from failing the job tests
def test_a_job_head_that_went_away_is_started_again_and_the_job_submitted_again():
    """The head's dashboard killed (as a loaded machine's can go): the next submission finds the connection refused,
    starts the head again on the same ports, prints the old head's logs, and the job runs there."""
    import psutil

    from tests.deploy.local_cluster import LocalCluster

    with LocalCluster(num_cpus=1) as cluster:
        cluster.start()
        address = cluster.address
        (dashboard,) = [p for p in psutil.Process(cluster.procs["head"].pid).children(recursive=True)
                        if "dashboard/dashboard.py" in " ".join(p.cmdline())]
        dashboard.kill()
        r = submit(address, cluster.env, "python", "-c", "print('ran on the new head')",
                   working_dir=ROOT / "tests" / "deploy")
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        assert "ran on the new head" in r.stdout and cluster.address == address and cluster.alive()
