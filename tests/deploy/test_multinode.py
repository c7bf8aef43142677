"""Multi-node, with node loss: a real local cluster (a head and two worker nodes joined with `ray start --address`,
token authentication on, each node advertising its own custom resource), runs submitted with `ray job submit`.

- A worker node is killed mid-run (its raylet, then its other processes): its rollout workers are re-created on
  the surviving nodes (the placement group re-places their bundles), their shards re-sent, and metrics.parquet
  misses no iteration.
- The learner's node is killed: the job fails naming that node; after a replacement node joins, `--resume`
  completes the run.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.deploy.local_cluster import RAY, LocalCluster, job_status, submit

pytestmark = pytest.mark.ray

# the algorithm stage lasts about 10 s on 2 cores (300 iterations): time to kill a node after its first
# checkpoint there, also on a loaded machine
PRETRAIN, ITERS, EVERY = 20, 300, 5
RUN = ["python", "-m", "rayseq.train", "model.emb_dim=16", "model.hidden_dim=32", "task.test_size=200",
       f"train.pretrain_iters={PRETRAIN}", "train.pretrain_batch_size=32", f"train.iters={ITERS}",
       "train.batch_size=64", "train.eval_every=100", f"train.checkpoint_every={EVERY}", "algo.name=reinforce",
       "progress=false", "rollout.num_workers=2", "rollout.placement_strategy=SPREAD"]


@pytest.fixture(scope="module")
def cluster():
    """One cluster for this module (starting three nodes costs most of a test's time): each test kills a different
    worker node (w2, then w1, which is replaced), finding nodes by the resource they advertise."""
    if not Path(RAY).exists():
        pytest.skip(f"ray CLI not found next to {RAY}")
    c = LocalCluster(num_cpus=2)
    try:
        c.start()
        c.add_node("w1", wait=False)  # the two join side by side
        c.add_node("w2")
        c.wait_node("w1")
        yield c
    finally:
        c.shutdown()


@pytest.fixture
def jobs(cluster):
    """Ids of the jobs a test submits and has not seen end; any still running at its end is stopped (the cluster
    outlives the test)."""
    ids: list[str] = []
    yield ids
    for job in ids:
        if job_status(cluster.address, cluster.env, job) in ("RUNNING", "PENDING"):
            subprocess.run([RAY, "job", "stop", "--address", cluster.address, job], env=cluster.env,
                           capture_output=True, timeout=120)


def job_logs(c: LocalCluster, job: str) -> str:
    """The job's output (`ray job logs`), or why it could not be read and the head's own Ray logs."""
    r = subprocess.run([RAY, "job", "logs", "--address", c.address, job], env=c.env, capture_output=True,
                       text=True, timeout=60)
    return r.stdout if r.returncode == 0 else f"ray job logs failed: {r.stderr[-1500:]}\n{c.ray_logs()}"


def start_job(c: LocalCluster, *cmd: str) -> str:
    """Submits without waiting; returns the job's id."""
    job = f"rsq-{uuid.uuid4().hex[:8]}"
    r = submit(c, *cmd, options=["--no-wait", "--submission-id", job])
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return job


def wait_job(c: LocalCluster, job: str, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while (status := job_status(c.address, c.env, job)) in ("RUNNING", "PENDING", "?"):
        assert time.monotonic() < deadline, f"job {job} still {status}: {job_logs(c, job)[-4000:]}"
        time.sleep(1)
    return status


def wait_for_checkpoint(run_dir: Path, iteration: int, c: LocalCluster, job: str, timeout: float = 240) -> int:
    """Until the run has checkpointed ``iteration`` or later (it is in its algorithm stage, mid-run); the files are
    looked at every 0.1 s, the job's status (a CLI call of seconds) only every 20 s."""
    deadline = time.monotonic() + timeout
    next_status = time.monotonic() + 20
    while (done := max([int(p.stem[5:]) for p in (run_dir / "checkpoints").glob("ckpt_*.pt")], default=0)) < iteration:
        if time.monotonic() > next_status:
            assert job_status(c.address, c.env, job) in ("RUNNING", "PENDING", "?"), job_logs(c, job)[-6000:]
            next_status = time.monotonic() + 20
        assert time.monotonic() < deadline, f"no checkpoint {iteration} yet: {job_logs(c, job)[-6000:]}"
        time.sleep(0.1)
    return done


def actor_tasks(c: LocalCluster, job: str) -> list[dict]:
    """The job's actor method calls from Ray's state API (`ray list tasks`): name (``RolloutWorker.sample``),
    actor_id, node_id (where that call ran), state…"""
    r = subprocess.run([RAY, "list", "tasks", "--address", c.address, "--detail", "--format", "json", "--limit",
                        "10000", "--filter", "type=ACTOR_TASK"], env=c.env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return [t for t in json.loads(r.stdout) if t["name"].split(".")[0] in ("Learner", "RolloutWorker")]


def check_metrics(run_dir: Path, iters: int = ITERS) -> None:
    t = pq.read_table(run_dir / "metrics.parquet").to_pandas()
    assert list(t["iteration"]) == list(range(1, PRETRAIN + iters + 1))  # nothing skipped, nothing repeated
    assert t[t.stage == "train"]["rollout/reward_mean"].notna().all()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == PRETRAIN + iters


def wait_log(c: LocalCluster, job: str, text: str, timeout: float = 180) -> str:
    """Until the job's output says ``text``; returns the output."""
    deadline = time.monotonic() + timeout
    while text not in (logs := job_logs(c, job)):
        assert time.monotonic() < deadline, f"the job never said {text!r}: {logs[-4000:]}"
        assert job_status(c.address, c.env, job) in ("RUNNING", "PENDING", "?"), logs[-4000:]
        time.sleep(2)
    return logs


def test_worker_node_lost_mid_run_the_run_completes(cluster, jobs, tmp_path):
    """SPREAD puts the two rollout workers on the worker nodes (the learner is pinned to the head); node w2 is
    killed after the first algorithm-stage checkpoint; the run completes with every iteration logged."""
    c = cluster
    run_dir = tmp_path / "spread"
    head, w1, w2 = c.node_id("head"), c.node_id("w1"), c.node_id("w2")
    job = start_job(c, *RUN, "learner.resources={node_head: 1}", f"run_dir={run_dir}")
    jobs.append(job)
    killed_after = wait_for_checkpoint(run_dir, PRETRAIN + EVERY, c, job)
    c.kill_node("w2")
    status = wait_job(c, job)
    jobs.remove(job)
    logs = job_logs(c, job)
    assert status == "SUCCEEDED", logs[-4000:]
    check_metrics(run_dir)
    # where the actors' calls ran: the learner on the head, the workers spread over w1 and w2, then w2's worker
    # re-created on a surviving node
    nodes: dict[str, list] = {}
    for task in sorted(actor_tasks(c, job), key=lambda t: t.get("start_time_ms") or ""):
        if task["node_id"]:  # (a call sent while its actor was being re-created has none)
            nodes.setdefault(task["actor_id"], []).append(task["node_id"])
    learner = [a for a, ns in nodes.items() if ns and ns[0] == head and len(set(ns)) == 1]
    assert learner and len({n for ns in nodes.values() for n in ns}) == 3, nodes
    moved = [ns for ns in nodes.values() if w2 in ns]
    assert len(moved) == 1 and moved[0][-1] in (head, w1), nodes
    t = pq.read_table(run_dir / "metrics.parquet").to_pandas()
    where = f"node killed after checkpoint {killed_after}: {logs[-4000:]}"
    assert t["rollout/worker_restarts"].max() >= 1, where  # the lost worker's shard was re-sent
    assert f"was on node {w2} (" in logs and "node_w2) and is lost" in logs, where


def test_worker_node_lost_with_no_room_the_run_goes_on_with_fewer_workers_then_grows_back(cluster, jobs, tmp_path):
    """No spare capacity: each rollout worker needs a `rollout_slot`, which only nodes w3 and w4 advertise. w4 is
    killed mid-run: its worker cannot be re-created, so after rollout.worker_grace_s the worker on w3 takes its
    shard and the batches are split over that one worker (rollout/live_workers 1); a node w5 with a slot joins, Ray
    re-creates the lost worker there and it takes shards again. The run completes, every iteration logged."""
    c = cluster
    c.add_node("w3", resources={"node_w3": 1, "rollout_slot": 1}, wait=False)
    c.add_node("w4", resources={"node_w4": 1, "rollout_slot": 1})
    c.wait_node("w3")
    run_dir, iters = tmp_path / "elastic", 1500
    job = start_job(c, *RUN, f"train.iters={iters}", "learner.resources={node_head: 1}",
                    "rollout.resources_per_worker={rollout_slot: 1}", "rollout.worker_grace_s=3", f"run_dir={run_dir}")
    jobs.append(job)
    wait_for_checkpoint(run_dir, PRETRAIN + EVERY, c, job)
    c.kill_node("w4")
    wait_log(c, job, "split over 1 of 2 workers")
    c.add_node("w5", resources={"node_w5": 1, "rollout_slot": 1})
    wait_log(c, job, "is back: the batches are split over 2 of 2 workers")
    status = wait_job(c, job, timeout=600)
    jobs.remove(job)
    logs = job_logs(c, job)
    assert status == "SUCCEEDED", logs[-4000:]
    check_metrics(run_dir, iters)
    live = pq.read_table(run_dir / "metrics.parquet").to_pandas()["rollout/live_workers"].dropna()
    assert live.iloc[0] == 2 and live.min() == 1 and live.iloc[-1] == 2, live.value_counts()


@pytest.mark.slow  # 2 min; a lost learner is rebuilt in tests/distributed/test_learner_group.py (default run)
def test_learner_node_lost_the_run_fails_naming_it_and_resume_completes(cluster, jobs, tmp_path):
    """The learner is pinned to w1 (learner.resources); node w1 is killed mid-run: the job fails with a message
    naming w1's node; a replacement node advertising the same resource joins and `--resume` completes the run."""
    c = cluster
    run_dir = tmp_path / "learner-lost"
    w1 = c.node_id("w1")
    job = start_job(c, *RUN, "learner.resources={node_w1: 1}", f"run_dir={run_dir}")
    jobs.append(job)
    wait_for_checkpoint(run_dir, PRETRAIN + EVERY, c, job)
    c.kill_node("w1")
    assert wait_job(c, job) == "FAILED"
    jobs.remove(job)
    logs = job_logs(c, job)
    assert f"error: lost node {w1} (" in logs and "node_w1" in logs and "it held the learner" in logs, logs[-4000:]
    assert f"python -m rayseq.train run_dir={run_dir} --resume" in logs, logs[-4000:]
    c.add_node("w1b", resources={"node_w1": 1})  # a replacement node
    r = submit(c, "python", "-m", "rayseq.train", f"run_dir={run_dir}", "--resume")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert f"resuming {run_dir} after iteration " in out, out[-4000:]
    check_metrics(run_dir)
