"""What only a GPU can answer about the scale path: a learner on the GPU checkpointed and resumed by a driver that
sees no GPU (the checkpoint's head must hold no CUDA tensors: the learners write their own state), and two learner
actors sharing the one GPU making the update one learner makes (replicated), with the process group's backend chosen
by ``learner.backend=auto`` (gloo: NCCL takes one rank per GPU); sharded learners (FSDP2) sharing a GPU are refused.
``RAYSEQ_TEST_DEVICE=cpu`` runs the same on the CPU (gloo), where the sharded case runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import TINY, tiny_config
from tests.distributed.test_learner_group import assert_two_learners_make_the_update_of_one

pytestmark = pytest.mark.ray


def test_a_driver_that_sees_no_gpu_checkpoints_and_resumes_a_gpu_learner(device, tmp_path):
    """`ray start --num-gpus=1`, then `python -m rayseq.train` with ``CUDA_VISIBLE_DEVICES=`` (a CPU head's driver):
    PPO with its learner actor on the GPU and a rollout worker, a checkpoint every 2 iterations; then ``--resume``
    for 2 more. Both runs end well and the resumed one starts where the checkpoint left off."""
    from tests.deploy.local_cluster import LocalCluster

    gpus = 1 if device == "cuda" else 0
    run_dir = tmp_path / "run"
    with LocalCluster(num_cpus=4, num_gpus=gpus) as cluster:
        cluster.start()
        env = dict(cluster.env, RAY_ADDRESS=f"127.0.0.1:{cluster.gcs}", CUDA_VISIBLE_DEVICES="")
        base = [sys.executable, "-m", "rayseq.train", *TINY, "algo.name=ppo", "rollout.num_workers=1",
                "rollout.num_cpus_per_worker=1", "learner.num_cpus=1", f"learner.num_gpus={gpus}",
                f"learner.device={device}", "train.pretrain_iters=4", "train.checkpoint_every=2", "train.eval_every=0",
                f"run_dir={run_dir}"]
        for extra in (["train.iters=4"], ["--resume", "train.iters=6"]):
            r = subprocess.run([*base, *extra], env=env, capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, f"{extra}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 4 + 6
    import pyarrow.parquet as pq

    rows = [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert [r["iteration"] for r in rows][-2:] == [rows[-2]["iteration"], rows[-2]["iteration"] + 1]
    assert len(rows) == 6  # 4, then the resumed run's 2: none repeated, none lost


CASES = [("hf", "auto"), ("fsdp:hf", "auto")]  # auto: gloo, the learners sharing the GPU (NCCL would refuse)


@pytest.mark.parametrize("case, backend", CASES, ids=[f"{c}-{b}" for c, b in CASES])
def test_two_learners_sharing_the_device_make_the_update_of_one(ray_session, device, corpus, hf_dir, case, backend):
    """tests/distributed/test_learner_group.py's comparison (MLE, then a PPO update with the KL penalty and
    micro-batched passes without gradients, a Hugging Face GPT-2) with both learner actors on half of the GPU."""
    gpu = 0.5 if device == "cuda" else 0
    overrides = (f"learner.device={device}", f"learner.num_gpus={gpu}", f"learner.backend={backend}")
    if case.startswith("fsdp:") and gpu:  # sharding on one shared device is refused before any actor starts
        with pytest.raises(ValueError, match=r"learner.strategy=fsdp with learner.num_gpus=0.5: .* learner.num_gpus=1"):
            tiny_config("learner.num_learners=2", "learner.strategy=fsdp", *overrides)
        return
    assert_two_learners_make_the_update_of_one(ray_session, corpus, hf_dir, case, overrides,
                                               {"num_cpus": 0.5, "num_gpus": gpu})
