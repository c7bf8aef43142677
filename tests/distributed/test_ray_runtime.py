"""The Ray path for real: actors in one placement group, weight sync once per version, parity with the
in-process path (same seed -> same rollouts and updates), and worker-crash recovery."""

from __future__ import annotations

import os
import pickle
import signal

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayseq.checkpoint import load_checkpoint
from rayseq.distributed.driver import Interrupted, Trainer
from rayseq.distributed.groups import ActorGroups
from rayseq.types import RolloutRequest
from tests.conftest import tiny_config
from tests.parity import assert_same_metrics, runs_in_process_and_on_a_worker

pytestmark = pytest.mark.ray


def test_actors_share_one_placement_group_and_receive_weights(ray_session):
    ray = ray_session
    cfg = tiny_config("rollout.num_workers=2", "rollout.num_cpus_per_worker=0.5", "learner.num_cpus=1")
    rt = ActorGroups(cfg)
    try:
        assert not rt.learner.is_local and not rt.rollout.is_local and len(rt.rollout.actors) == 2
        table = ray.util.placement_group_table(rt.pg)
        assert table["state"] == "CREATED"
        assert [b.get("CPU") for b in table["bundles"].values()] == [1.0, 0.5, 0.5]
        rt.rollout.sync_weights()  # the learner's version 0
        rt.rollout.sync_weights()  # same version: nothing is sent again
        stats = rt.rollout.stats()
        learner_sum = sum(float(v.double().sum()) for v in rt.learner.get_weights()["generator"].values()
                          if v.dtype.is_floating_point)
        assert [s["version"] for s in stats] == [0, 0]
        assert [s["loads"] for s in stats] == [1, 1]
        assert len({s["pid"] for s in stats}) == 2 and os.getpid() not in {s["pid"] for s in stats}
        for s in stats:
            assert s["checksum"] == pytest.approx(learner_sum, rel=1e-9)
        # every actor of the run is scheduled inside that placement group
        learner = rt.learner.placement()
        assert {s["placement_group"] for s in stats} | {learner["placement_group"]} == {rt.pg.id.hex()}
        assert learner["pid"] not in {s["pid"] for s in stats}

        val, _ = rt.learner.evaluate("val")  # the learner evaluates in its own process
        from rayseq.tasks import metric_names

        assert sorted(val) == sorted(metric_names(cfg.task, "val"))
    finally:
        rt.shutdown()


def test_distributed_run_matches_in_process_run(ray_session, tmp_path):
    """One Ray worker and the in-process path run the same algorithm code on the same seeds."""
    a, b = runs_in_process_and_on_a_worker(
        lambda n, run_dir: tiny_config(f"rollout.num_workers={n}", "algo.name=ppo_dynamic", "algo.minibatch_size=16",
                                       run_dir=run_dir), tmp_path)
    assert_same_metrics(a, b, ("loss/nll", "rollout/reward_mean", "loss/policy", "policy/ratio_mean",
                               "val/precision"), rtol=1e-5, atol=1e-6)
    train = b[b.stage == "train"]
    assert (train["rollout/staleness"] == 0).all()
    assert (train["time/sync_s"] >= 0).all() and (train["time/rollout_s"] > 0).all()


def kill_worker_after(train_iterations: int, index: int, killed: list):
    """A report callback that kill -9's rollout worker ``index`` once, after the algorithm stage's
    ``train_iterations``-th iteration was logged (its pid appended to ``killed``)."""

    def report(row, trainer):
        if row["stage"] == "train" and row["iteration"] == trainer.cfg.train.pretrain_iters + train_iterations \
                and not killed:
            pid = trainer.groups.rollout.stats()[index]["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    return report


def test_killed_worker_is_restarted_and_the_run_completes(ray_session, tmp_path):
    """kill -9 a rollout worker mid-run: Ray restarts it, it gets the weights, its shard is re-sent."""
    killed = []
    report = kill_worker_after(2, 0, killed)
    cfg = tiny_config("rollout.num_workers=2", "algo.name=reinforce", "train.iters=8", run_dir=tmp_path / "k")
    trainer = Trainer(cfg, report=report)
    summary = trainer.run()
    assert killed, "the worker was not killed"
    t = pq.read_table(tmp_path / "k" / "metrics.parquet").to_pandas()
    assert list(t["iteration"]) == list(range(1, 20 + 8 + 1))  # nothing skipped, nothing repeated
    assert t[t.stage == "train"]["rollout/reward_mean"].notna().all()
    assert summary["iterations"] == 28


def test_a_worker_that_does_not_come_back_leaves_its_shards_to_the_others(ray_session, tmp_path):
    """kill -9 rollout worker 1 with no restart left (rollout.max_restarts=0: as a worker whose node is lost with no
    room elsewhere): after rollout.worker_grace_s worker 0 samples its shard (the same prompts and seed: that
    iteration equals a run that lost nothing, no shard lost or counted twice), the next batches are split over the
    one live worker (rollout/live_workers), and the run completes."""
    killed = []
    report = kill_worker_after(2, 1, killed)

    common = ("rollout.num_workers=2", "algo.name=reinforce", "train.iters=6", "rollout.worker_grace_s=1")
    Trainer(tiny_config(*common, "rollout.max_restarts=0", run_dir=tmp_path / "lost"), report=report).run()
    Trainer(tiny_config(*common, run_dir=tmp_path / "whole")).run()
    assert killed, "the worker was not killed"
    lost, whole = (pq.read_table(tmp_path / r / "metrics.parquet").to_pandas() for r in ("lost", "whole"))
    assert list(lost["iteration"]) == list(range(1, 20 + 6 + 1))  # nothing skipped, nothing repeated
    train = lost[lost.stage == "train"]
    live = list(train["rollout/live_workers"])
    k = 21 + live.index(1)  # the iteration whose shard worker 0 took over (the next one, or when Ray said so)
    assert k <= 24 and live == [2] * (k - 21) + [1] * (27 - k), live
    assert train["rollout/worker_restarts"].iloc[-1] >= 1
    # up to the iteration whose shard was taken over, the same run; afterwards one shard per batch
    assert_same_metrics(lost[lost.iteration <= k], whole[whole.iteration <= k],
                        ("loss/nll", "rollout/reward_mean", "loss/policy"), rtol=0, atol=0)
    after = [m[m.iteration > k]["loss/policy"].to_numpy() for m in (lost, whole)]
    assert (after[0] != after[1]).any()


def test_in_process_groups():
    """rollout.num_workers=0: the same three groups, their members in this process; weights go out once per
    version, tagged with the learner's update count."""
    cfg = tiny_config("rollout.num_workers=0")
    rt = ActorGroups(cfg)
    assert rt.is_local and rt.learner.is_local and rt.rollout.is_local and not rt.remote
    rt.rollout.sync_weights()
    rt.rollout.sync_weights()  # same version: not loaded again
    (stats,) = rt.rollout.stats()
    assert stats["pid"] == os.getpid() and stats["version"] == 0 and stats["loads"] == 1
    batch = rt.learner.local.task.sample_prompts(np.random.default_rng(0), 8, with_targets=True)
    rt.learner.update_batch(batch, 0)
    assert rt.learner.version() == 1
    rt.rollout.sync_weights()
    (stats,) = rt.rollout.stats()
    assert stats["version"] == 1 and stats["loads"] == 2


def test_placement_strategy_and_custom_resources_reach_the_placement_group(ray_session):
    """rollout.placement_strategy is the group's strategy; custom resources (those > 0) go into each actor's bundle;
    the runtime knows which node holds each bundle (here all on the one local node, alive)."""
    from ray.util.placement_group import placement_group_table

    from rayseq.distributed.groups.placement import bundles

    pinned = tiny_config("rollout.num_workers=2", "learner.resources={node_a: 1}", "algo.name=seqgan",
                         "rollout.resources_per_worker={pool: 0.5, gone: 0}", "scorer.resources_per_scorer={s: 2}")
    assert bundles(pinned) == [{"CPU": 1.0, "node_a": 1.0}, {"CPU": 0.5, "pool": 0.5}, {"CPU": 0.5, "pool": 0.5},
                               {"CPU": 0.5, "s": 2.0}]
    cfg = tiny_config("rollout.num_workers=2", "rollout.placement_strategy=SPREAD", "learner.num_cpus=1")
    rt = ActorGroups(cfg)
    try:
        assert placement_group_table(rt.pg)["strategy"] == "SPREAD"
        (node,) = rt.placement.nodes
        assert sorted(rt.placement.bundle_nodes) == [0, 1, 2]
        assert rt.placement.describe(node).startswith(f"node {node} (")
        assert rt.placement.lost_node(0) is None and rt.placement.lost_node(1) is None
        rt.placement.check_learner()  # its node is alive: nothing raised
    finally:
        rt.shutdown()


def test_driver_receives_metrics_not_rollouts(ray_session, tmp_path):
    """Rollouts travel worker -> object store -> learner by reference: what the driver fetches per iteration
    (``driver/recv_bytes``: the pickled size of every object it ray.gets) is the same at batch 64 and 1024, and far
    below the rollout itself, while the learner still updates on the whole batch (minibatches of 32)."""
    received, rollout_bytes = {}, {}
    for batch in (64, 1024):
        run_dir = tmp_path / f"b{batch}"
        cfg = tiny_config("rollout.num_workers=2", "rollout.num_cpus_per_worker=0.5", "learner.num_cpus=1",
                          "train.pretrain_iters=0", f"train.batch_size={batch}", "train.iters=4", "train.eval_every=0",
                          "algo.minibatch_size=32", run_dir=run_dir)
        trainer = Trainer(cfg)
        trainer.run()
        rows = pq.read_table(run_dir / "metrics.parquet").to_pandas()
        train = rows[rows.stage == "train"]
        assert (train["policy/updates"] == batch // 32).all()  # the learner saw all B rollouts
        received[batch] = float(train["driver/recv_bytes"].median())
        # what the old path fetched: the sampled rollout itself (measured on a fresh in-process sample)
        rt = ActorGroups(tiny_config(f"train.batch_size={batch}", "rollout.num_workers=0"))
        rt.rollout.sync_weights()
        shards = rt.rollout.sample(trainer.task.sample_prompts(np.random.default_rng(0), batch),
                                   RolloutRequest(max_len=trainer.task.max_tgt_len, seed=0))
        rollout_bytes[batch] = len(pickle.dumps(shards, protocol=5))
    assert 0 < received[1024] <= 1.05 * received[64] + 256, received
    assert received[1024] < rollout_bytes[1024] / 10, (received, rollout_bytes)


@pytest.mark.parametrize("k", [1, 3])
def test_pipelined_run_on_a_ray_worker_matches_the_in_process_pipeline(ray_session, tmp_path, k):
    """rollout.max_staleness=k on a Ray worker: batches i+1 … i+k are sampled while the learner updates on batch i,
    each with the weights published when it went out (staleness min(i, k)) — the same numbers as the in-process
    pipeline, which samples them first."""
    rows = {}
    for n in (0, 1):
        cfg = tiny_config(f"rollout.num_workers={n}", f"rollout.max_staleness={k}", "algo.name=ppo", "algo.lr=0.01",
                          "train.iters=6", run_dir=tmp_path / f"w{n}")
        Trainer(cfg).run()
        t = pq.read_table(tmp_path / f"w{n}" / "metrics.parquet").to_pandas()
        rows[n] = t[t.stage == "train"]
    a, b = rows[0], rows[1]
    assert list(b["rollout/staleness"]) == [float(min(i, k)) for i in range(6)]
    for col in ("rollout/reward_mean", "loss/policy", "policy/ratio_mean", "rollout/staleness", "rollout/in_flight",
                "val/precision"):
        np.testing.assert_allclose(a[col].to_numpy(float), b[col].to_numpy(float), rtol=1e-5, atol=1e-6,
                                   equal_nan=True, err_msg=col)
    assert (np.abs(b["policy/ratio_mean"].to_numpy()[1:] - 1.0) > 1e-4).all()


def test_the_next_batch_goes_out_with_the_update_and_is_sampled_with_its_weights(ray_session):
    """``update_and_sample``: the worker samples the next batch as soon as the learner publishes the update's weights
    (no driver round trip): its rollouts carry the new version and equal what the in-process runtime samples after
    that update, one call after the other."""
    from rayseq.types import Rollout

    overrides = ("train.pretrain_iters=0", "train.batch_size=32", "algo.name=ppo", "algo.lr=0.05")
    prompts = Trainer(tiny_config("rollout.num_workers=0", *overrides)).task.sample_prompts
    first, second = (prompts(np.random.default_rng(s), 32) for s in (1, 2))
    out = {}
    for n in (0, 1):
        rt = ActorGroups(tiny_config(f"rollout.num_workers={n}", *overrides))
        try:
            rt.learner.start_stage("train")
            rt.rollout.sync_weights()
            shards = rt.rollout.sample(first, RolloutRequest(max_len=8, seed=5), wait=False)
            m, after = rt.learner.update_and_sample(shards, 0, second, RolloutRequest(max_len=8, seed=6))
            assert m["learner/version"] == 1.0
            out[n] = Rollout.concat(rt.fetch(after))
            assert out[n].version == 1
        finally:
            rt.shutdown()
    np.testing.assert_array_equal(out[0].tokens, out[1].tokens)
    np.testing.assert_allclose(out[0].logp, out[1].logp, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_run_stopped_while_its_next_batch_is_out_resumes_to_the_uninterrupted_run(ray_session, tmp_path, workers):
    """Stopped (and checkpointed) after an RL iteration whose next batch already went out with the update: the
    checkpoint holds the data RNG from before that batch was drawn, so --resume draws it again and ends on the
    uninterrupted run's weights and metrics."""
    common = [f"rollout.num_workers={workers}", "algo.name=ppo_dynamic", "algo.minibatch_size=16",
              "train.pretrain_iters=3", "train.iters=5", "train.checkpoint_every=1"]
    full = Trainer(tiny_config(*common, run_dir=tmp_path / "full")).run()
    pending = []

    def stop_in_rl(row, trainer):
        if row["iteration"] == 5:  # the RL stage's second iteration
            pending.append(len(trainer.carry.ahead))
            trainer._stop = True

    cfg = tiny_config(*common, run_dir=tmp_path / "cut")
    with pytest.raises(Interrupted):
        Trainer(cfg, report=stop_in_rl).run()
    assert pending == [1]  # the next batch was out when the run stopped
    resumed = Trainer(cfg, resume=True).run()
    a, b = (load_checkpoint(s["checkpoint"])["learner"]["generator"] for s in (full, resumed))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    assert resumed["metrics"] == full["metrics"]
