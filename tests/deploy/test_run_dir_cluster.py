"""Run directories on a real multi-node cluster (a head and two worker nodes joined with `ray start --address`, runs
submitted with `ray job submit`), whose learners write their checkpoint files on their own nodes.

Node-local folders on one machine: node w2's `ray start` (its raylet, and every actor it starts) runs in a mount
namespace of its own in which the folder ``LOCAL`` is an empty tmpfs (``unshare --mount``, then ``mount -t tmpfs``:
:func:`~tests.deploy.local_cluster.node_local_prefix`). To the learner on w2 a run directory under ``LOCAL`` is the
same path on its own disk, exactly what a node-local ``run_dir`` is on a real cluster: the check sees it through the
filesystem alone (no setting tells rayseq which node is which). Every other folder, ``tmp_path`` included, is the
machine's own and so shared by the three nodes, as a shared mount is.

Both worker nodes advertise one ``learner_slot`` (the head none): ``learner.resources={learner_slot: 1}`` with two
learners puts one learner rank on each worker node, the driver on the head.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.deploy.local_cluster import RAY, LocalCluster, node_local_prefix, submit

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a three-node cluster and one to three runs: a minute or more

RUN = ["python", "-m", "rayseq.train", "model.emb_dim=16", "model.hidden_dim=32", "task.test_size=100",
       "task.val_size=20", "train.pretrain_iters=2", "train.pretrain_batch_size=16", "train.batch_size=16",
       "algo.name=ppo", "algo.minibatch_size=8", "train.eval_every=100", "train.checkpoint_every=2",
       "progress=false", "rollout.num_workers=1", "learner.num_learners=2", "learner.strategy=fsdp",
       "learner.resources={learner_slot: 1}"]


@pytest.fixture(scope="module")
def cluster():
    """The head, w1 and w2 (w2 with its own ``LOCAL``); yields (cluster, LOCAL)."""
    if not Path(RAY).exists():
        pytest.skip(f"ray CLI not found next to {RAY}")
    with tempfile.TemporaryDirectory(prefix="rayseq-node-local-") as local:
        prefix = node_local_prefix(local)
        if prefix is None:
            pytest.skip("mount namespaces are not permitted here (unshare --mount): no node-local folder")
        c = LocalCluster(num_cpus=2)
        try:
            c.start()
            c.add_node("w1", resources={"node_w1": 1, "learner_slot": 1}, wait=False)
            c.add_node("w2", resources={"node_w2": 1, "learner_slot": 1}, prefix=prefix)
            c.wait_node("w1")
            yield c, Path(local)
        finally:
            c.shutdown()


def test_a_run_dir_on_one_nodes_disk_is_refused_naming_the_node_that_does_not_see_it(cluster):
    c, local = cluster
    run_dir = local / "run"
    r = submit(c, *RUN, "train.iters=2", f"run_dir={run_dir}")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-4000:]
    w1, w2 = c.node_id("w1"), c.node_id("w2")
    assert f"error: run_dir {run_dir} is a local directory that not every learner's node shares" in out, out[-4000:]
    assert f"on node {w2} (" in out and "does not see the file the driver wrote there" in out, out[-4000:]
    assert w1 not in out  # w1 shares the folder: not named
    assert "run_dir=s3://" in out and "(NFS, EFS, a shared volume)" in out
    assert not (run_dir / "checkpoints").exists() and not (run_dir / ".rayseq-shared").exists()


def test_a_shared_run_dir_checkpoints_on_two_learners_and_resumes_on_one(cluster, tmp_path):
    """Two FSDP learners on w1 and w2 each write their shards into the shared run directory; ``--resume`` with one
    learner (on either node) reads them all, resharded, and completes the run."""
    c, _ = cluster
    run_dir = tmp_path / "shared"
    r = submit(c, *RUN, "train.iters=2", f"run_dir={run_dir}")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    shards = sorted(p.name for p in (run_dir / "checkpoints" / "ckpt_00000004.learner" / "dcp").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"], shards  # each rank's, from its own node
    r = submit(c, "python", "-m", "rayseq.train", f"run_dir={run_dir}", "--resume", "train.iters=4",
               "learner.num_learners=1")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert f"resuming {run_dir} after iteration 4 " in out and "learner.num_learners 2 -> 1" in out, out[-4000:]
    iterations = pq.read_table(run_dir / "metrics.parquet").to_pandas()["iteration"]
    assert list(iterations) == list(range(1, 7))
    assert (run_dir / "checkpoints" / "ckpt_00000006.pt").is_file()
