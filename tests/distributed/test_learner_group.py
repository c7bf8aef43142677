"""The data-parallel learner group (``learner.num_learners``) for real: two Learner actors in one gloo process
group make the update one in-process learner makes on the same batch (MLE, PPO with its value baseline, GRPO,
SeqGAN's d-step), both ranks end with the same weights; and a run whose learner is killed mid-run rebuilds it from
its checkpoint and completes, each iteration logged once."""

from __future__ import annotations

import os
import shutil
import signal

import numpy as np
import pyarrow.parquet as pq
import pytest
import ray
import torch
import yaml

from rayseq.checkpoint import load_checkpoint
from rayseq.config import RunConfig, config_to_dict, resume_config
from rayseq.distributed.actors.learner import Learner
from rayseq.distributed.actors.worker import RolloutWorker
from rayseq.distributed.driver import Trainer
from rayseq.distributed.groups import LearnerGroup
from rayseq.distributed.groups.manager import ActorManager
from rayseq.types import RolloutRequest
from tests.conftest import tiny_config

pytestmark = pytest.mark.ray

TOL = {"rtol": 1e-5, "atol": 1e-6}  # float32 sums in another order (two ranks' halves, then their sum)


def assert_same_tensors(a: dict, b: dict, what: str, tol: dict = TOL) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert_same_tensors(a[k], b[k], f"{what}.{k}", tol)
        elif isinstance(a[k], torch.Tensor) and a[k].is_floating_point():
            torch.testing.assert_close(a[k], b[k], **tol, msg=lambda m, k=k: f"{what}.{k}: {m}")


def assert_same_metrics(a: dict, b: dict, keys) -> None:
    for k in keys:
        assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k


CASES = {
    # SeqGAN-PPO with the value baseline on: the d-step (minibatches of 10 over 2 × 16 real and generated rows:
    # ranks 5 + 5, and a last one of 2: 1 + 1), then PPO's 2 epochs of minibatches of 8 (ranks 4 + 4 rows of unequal
    # token counts) with the baseline's regression, the entropy bonus and gradient clipping
    "seqgan_ppo": ("algo.name=seqgan_ppo", "algo.use_baseline=true", "algo.minibatch_size=8", "algo.epochs=2",
                   "algo.max_grad_norm=0.05", "algo.entropy_coef=0.01", "disc.num_negatives=16", "disc.batch_size=10",
                   "disc.epochs=2", "disc.emb_dim=8", "disc.filter_sizes=[1,2]", "disc.num_filters=[4,4]",
                   "disc.dropout=0"),  # dropout draws each rank's own masks: equal in distribution only
    # GRPO: groups of 4 samples per prompt, minibatches of 6 (ranks 3 + 3), no value network
    "grpo": ("algo.name=grpo", "algo.group_size=4", "algo.minibatch_size=6"),
    # PPO with its value baseline and the KL penalty, the passes without gradients (the baseline's inputs, the
    # reference's log-probs) in micro-batches of 3 rows, each rank computing its 8 of the 16 rows, then gathered
    "ppo_kl_micro": ("algo.name=ppo", "algo.minibatch_size=8", "algo.epochs=2", "algo.kl_coef=0.1",
                     "learner.micro_batch_size=3"),
    # the loss menu: DeepSeekMath's per-reply mean (each rank's share counts its replies) of GSPO's sequence ratio,
    # the high-entropy half of the tokens (the quantile over both ranks' entropies), against the learner's weights
    # before the update (its pass in micro-batches of 3 rows)
    "grpo_menu": ("algo.name=grpo", "algo.group_size=4", "algo.minibatch_size=6", "algo.epochs=2",
                  "algo.loss_type=grpo", "algo.importance_sampling_level=sequence", "algo.top_entropy_quantile=0.5",
                  "algo.ratio_to=proximal", "learner.micro_batch_size=3"),
    # GMPO: the high-entropy tokens inside each reply's geometric mean
    "grpo_gmpo": ("algo.name=grpo", "algo.group_size=4", "algo.minibatch_size=6", "algo.epochs=2",
                  "algo.loss_type=gmpo", "algo.eps=0.4", "algo.top_entropy_quantile=0.5"),
    # PPO-dynamic's objective with Dr.GRPO's constant denominator and INTELLECT-2's delta, beside the value
    # baseline's regression (its share counts the sampled tokens)
    "ppo_dynamic_dr_grpo": ("algo.name=ppo_dynamic", "algo.minibatch_size=8", "algo.epochs=2",
                            "algo.loss_type=dr_grpo", "algo.delta=3"),
}


@pytest.mark.parametrize("case", [*CASES, "fsdp:ppo_kl_micro", "fsdp:grpo", "fsdp:grpo_menu", "fsdp:transformer",
                                  "fsdp:hf"])
def test_two_learners_make_the_update_of_one(ray_session, corpus, hf_dir, case):
    """MLE, then (SeqGAN-PPO) a d-step, then the policy update: metrics, weights, optimizer moments of one learner.
    ``fsdp:``: the two learners shard the models (learner.strategy=fsdp), each holding half of the parameters and
    of the Adam moments, and end with the whole weights and moments of one replicated learner; the built-in
    Transformer and a Hugging Face GPT-2 are sharded too (the HF policy one decoder layer at a time)."""
    assert_two_learners_make_the_update_of_one(ray_session, corpus, hf_dir, case)


def assert_two_learners_make_the_update_of_one(ray_session, corpus, hf_dir, case: str, overrides: tuple = (),
                                               actor_options: dict | None = None) -> None:
    """The body of :func:`test_two_learners_make_the_update_of_one` for ``case`` (``[fsdp:]name``), the config's
    ``overrides`` (the GPU suite's: a device, a backend) and each learner actor's ``actor_options``."""
    strategy, _, case = case.rpartition(":")
    hf = ("task.name=pairs", f"task.data={corpus}", "model.arch=hf", f"model.path={hf_dir}", "task.test_size=100",
          "task.val_size=10")
    extra = {"transformer": ("model.arch=transformer", *CASES["ppo_kl_micro"]),
             "hf": (*hf, *CASES["ppo_kl_micro"])}.get(case, CASES.get(case))
    sharded = ("learner.strategy=fsdp",) if strategy else ()
    cfg = tiny_config("rollout.num_workers=1", "learner.num_learners=2", "train.batch_size=16", *extra, *sharded,
                      *overrides)
    group = LearnerGroup(cfg, manager=ActorManager(ray_session, None),
                         actor_options=[actor_options or {"num_cpus": 0.5}] * 2)
    # the reference: one learner, in this process (replicated: the sharded group must end where it ends)
    d = config_to_dict(cfg)
    one = Learner(RunConfig.model_validate({**d, "learner": {**d["learner"], "strategy": "replicated"}}))
    rng = np.random.default_rng(0)
    mle_batch = one.task.sample_prompts(rng, 16, with_targets=True)
    m1, m2 = one.update(mle_batch, 0), group.update_batch(mle_batch, 0)
    assert_same_metrics(m1, m2, ["loss/nll", "policy/grad_norm"])

    worker = RolloutWorker(cfg, 0)
    worker.set_weights(one.get_weights(), one.get_version())
    request = RolloutRequest(max_len=one.task.max_tgt_len, temperature=1.0, seed=3)
    if case == "seqgan_ppo":  # the d-step: real pairs against the generator's samples
        for learner in (one, group):
            learner.start_stage("algo_pretrain")
        negatives = worker.sample(one.task.sample_prompts(rng, 16), request)
        positives = one.task.sample_prompts(rng, 16, with_targets=True)
        m1 = one.aux_update(positives, [negatives], 5)
        m2 = group.aux_update(positives, [negatives], 5)
        assert_same_metrics(m1, m2, ["disc/loss", "disc/accuracy", "disc/d_real", "disc/d_fake"])
        assert_same_tensors(one.get_scorer_weights()["disc"],
                            ray_session.get(group.actors[1].get_scorer_weights.remote())["disc"], "disc")
    copies = getattr(cfg.algo, "group_size", 1)
    prompts = one.task.sample_prompts(rng, 16 // copies)
    rollout = worker.sample(prompts.repeat(copies) if copies > 1 else prompts, request)
    assert len(np.unique(rollout.action_mask.sum(1))) > 1  # replies of several lengths: the ranks' shares differ
    # rewards of every size (the tiny pretrained model is rarely right: the task's would be mostly 0 and so would
    # GRPO's group advantages), each reply's on its last token
    rollout.score = rng.normal(size=len(rollout)).astype(np.float32)
    last = np.maximum(rollout.token_mask.sum(1).astype(int) - 1, 0)
    rollout.rewards = np.zeros_like(rollout.rewards)
    rollout.rewards[np.arange(len(rollout)), last] = rollout.score
    for learner in (one, group):
        learner.start_stage("train")
    m1, m2 = one.update_rollout([rollout], 0), group.update([rollout], 0)
    assert_same_metrics(m1, m2, ["loss/policy", "policy/clipfrac", "policy/approx_kl", "policy/ratio_mean",
                                 "policy/grad_norm", "rollout/reward_mean", "learner/version"]
                        + (["loss/value", "policy/entropy"] if case == "seqgan_ppo" else [])
                        + (["loss/value", "kl/per_reply", "kl/per_token"] if case == "ppo_kl_micro" else [])
                        + (["policy/kept_token_frac"] if "policy/kept_token_frac" in m1 else [])
                        + (["loss/value"] if case == "ppo_dynamic_dr_grpo" else []))
    assert m1["policy/grad_norm"] > 1e-3 and m1["policy/updates"] > 2  # several Adam steps on real gradients
    # attention's key bias has no gradient in exact arithmetic (softmax ignores a shift common to every key), so
    # Adam turns float noise into steps of up to lr each: there the weights agree to lr per step, not to rounding
    noise = {"rtol": 1e-5, "atol": 3e-4 * (m1["policy/updates"] + 1)} if case in ("transformer", "hf") else TOL
    if strategy:  # sharded: the whole weights and moments gathered, each rank holding its half
        assert_same_tensors(one.whole_state(), group.whole_state(), "state", noise)
        assert_same_tensors(one.get_weights(), group.get_weights(), "published weights", noise)
        for actor in group.actors:
            sizes = ray_session.get(actor.shard_sizes.remote())
            for held, whole in sizes.values():
                assert whole / 2 - 64 <= held <= whole / 2 + 64, sizes  # half, but for a row split unevenly
        for a in group.actors:
            ray_session.kill(a)
        return
    state = group.state_dict()  # rank 0's: generator, baseline, D, optimizers' moments
    assert_same_tensors(one.state_dict(), state, "state", noise)
    assert_same_tensors(state["generator"], ray_session.get(group.actors[1].state_dict.remote())["generator"],
                        "rank 1")
    for a in group.actors:
        ray_session.kill(a)


def _kill_learner_at(iteration: int, rank: int, killed: list):
    """A report callback that kill -9's learner ``rank`` once, after ``iteration`` was logged."""

    def report(row, trainer):
        if row["iteration"] == iteration and not killed:
            learners = trainer.groups.learner
            pid = ray.get(learners.actors[rank].placement.remote())["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    return report


def _kill_test_config(learners: int, run_dir, *overrides):
    return tiny_config("rollout.num_workers=1", f"learner.num_learners={learners}", "learner.num_cpus=0.5",
                       "algo.name=ppo", "algo.minibatch_size=16", "train.pretrain_iters=4", "train.iters=8",
                       "train.checkpoint_every=4", "train.eval_every=0", *overrides, run_dir=run_dir)


@pytest.mark.parametrize("learners, strategy", [pytest.param(1, "replicated", marks=pytest.mark.slow),
                                                (2, "replicated"), (2, "fsdp")])
def test_a_killed_learner_is_rebuilt_from_its_checkpoint_and_the_run_completes(ray_session, tmp_path, learners,
                                                                              strategy, caplog):
    """kill -9 a learner (the last rank) after iteration 10: the group is rebuilt from the checkpoint of iteration
    8, the two iterations after it run again, and metrics.parquet has each iteration once.

    N=2: the same run stopped after iteration 8 and resumed (``--resume``) with ``learner.num_learners=1`` ends with
    the killed run's weights: a 2-learner checkpoint restores the run on any number of learners (sharded: every
    rank's shards written with torch.distributed.checkpoint, read back by 1 learner and by 3), and the rebuilt group
    redid iterations 9-10 as the uninterrupted run does them."""
    killed: list = []
    cfg = _kill_test_config(learners, tmp_path / "killed", f"learner.strategy={strategy}")
    summary = Trainer(cfg, report=_kill_learner_at(10, learners - 1, killed)).run()
    assert killed, "the learner was not killed"
    assert "learner group rebuilt" in caplog.text and "iterations 9..10 are run again" in caplog.text
    t = pq.read_table(tmp_path / "killed" / "metrics.parquet").to_pandas()
    assert list(t["iteration"]) == list(range(1, 4 + 8 + 1))  # nothing skipped, nothing repeated
    assert summary["iterations"] == 12
    if learners == 2:
        Trainer(_kill_test_config(2, tmp_path / "split", "train.iters=4", f"learner.strategy={strategy}")).run()
        if strategy == "fsdp":  # the learners' shards, each rank's own file
            dcp = tmp_path / "split" / "checkpoints" / "ckpt_00000008.learner" / "dcp"
            assert {p.name for p in dcp.iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp"}
        a = load_checkpoint(summary["checkpoint"])["learner"]["generator"]
        for n in (1, 3) if strategy == "fsdp" else (1,):
            run = tmp_path / f"split{n}"
            shutil.copytree(tmp_path / "split", run)
            saved = yaml.safe_load((run / "config.yaml").read_text())
            resumed_cfg, changed = resume_config(saved, None, ["train.iters=8", f"learner.num_learners={n}",
                                                               f"run_dir={run}"])
            assert {k for k, _, _ in changed} == {"train.iters", "learner.num_learners", "run_dir"}
            resumed = Trainer(resumed_cfg, resume=True).run()
            b = load_checkpoint(resumed["checkpoint"])["learner"]["generator"]
            assert_same_tensors(a, b, f"generator ({n} learners)")


def test_sharded_learners_in_bf16(ray_session, tmp_path):
    """learner.strategy=fsdp with model.dtype=bfloat16: FSDP's mixed precision (bf16 gathered parameters and compute,
    fp32 master shards and gradient reduction): a short run trains, its checkpoint holds fp32 weights, the workers
    sample with bf16 ones."""
    cfg = _kill_test_config(2, tmp_path / "bf16", "learner.strategy=fsdp", "model.dtype=bfloat16", "train.iters=2")
    summary = Trainer(cfg).run()
    rows = pq.read_table(tmp_path / "bf16" / "metrics.parquet").to_pylist()
    assert all(np.isfinite(r["loss/policy"]) for r in rows if r["stage"] == "train")
    weights = load_checkpoint(summary["checkpoint"])["learner"]["generator"]
    assert {v.dtype for v in weights.values()} == {torch.float32}


def test_a_sharded_hf_policy_survives_a_killed_learner_and_resumes_on_other_counts(ray_session, corpus, hf_dir,
                                                                                  tmp_path, caplog):
    """A Hugging Face GPT-2 trained by 2 FSDP learners (per layer): a learner killed mid-run is rebuilt from the
    sharded checkpoint; the same run stopped at that checkpoint resumes on 1 learner and on 3 to the killed run's
    weights (within float tolerance); its weights are written as safetensors."""
    hf = ("task.name=pairs", f"task.data={corpus}", "model.arch=hf", f"model.path={hf_dir}", "task.test_size=100",
          "task.val_size=10", "algo.minibatch_size=8", "train.batch_size=16", "learner.strategy=fsdp",
          "train.pretrain_iters=2", "train.checkpoint_every=2", "learner.micro_batch_size=4")
    killed: list = []
    cfg = _kill_test_config(2, tmp_path / "killed", *hf, "train.iters=4")
    summary = Trainer(cfg, report=_kill_learner_at(5, 1, killed)).run()
    assert killed and "learner group rebuilt" in caplog.text and "iterations 5..5 are run again" in caplog.text
    assert list(pq.read_table(tmp_path / "killed" / "metrics.parquet").to_pandas()["iteration"]) == list(range(1, 7))
    assert (tmp_path / "killed" / "checkpoints" / "ckpt_00000006.safetensors").is_file()
    a = load_checkpoint(summary["checkpoint"])["learner"]["generator"]
    Trainer(_kill_test_config(2, tmp_path / "split", *hf, "train.iters=2")).run()
    for n in (1, 3):
        run = tmp_path / f"split{n}"
        shutil.copytree(tmp_path / "split", run)
        saved = yaml.safe_load((run / "config.yaml").read_text())
        resumed_cfg, _ = resume_config(saved, None, ["train.iters=4", f"learner.num_learners={n}", f"run_dir={run}"])
        b = load_checkpoint(Trainer(resumed_cfg, resume=True).run()["checkpoint"])["learner"]["generator"]
        # key biases: Adam turns float noise into steps of up to lr (see test_two_learners_make_the_update_of_one)
        assert_same_tensors(a, b, f"generator ({n} learners)", {"rtol": 1e-5, "atol": 3e-4 * 8})


@pytest.mark.slow  # 80 s on 2 busy cores (a run, then a second learner group); the default run reads shards in
# place through the resumes of test_a_killed_learner_is_rebuilt_from_its_checkpoint_and_the_run_completes[2-fsdp]
def test_rebuilt_sharded_learners_read_only_their_own_shards(ray_session, tmp_path):
    """Two FSDP learners checkpoint (PPO: the generator, the value baseline, their Adam moments, each rank's half in its
    own file ``__<rank>_0.distcp``); two fresh learners (a rebuilt group, a resume on as many ranks) restore it, each
    reading in place (rayseq.checkpoint.store_reader) what its load plan names: every sharded entry
    from its own rank's file alone, and from the other file only entries saved whole (the optimizers' step counts:
    every rank holds them, the save wrote them once). Each shard is read by exactly one rank, and the restored
    weights are the checkpoint's. (Before, every rank copied every rank's files.)"""
    from rayseq.checkpoint import store_reader

    cfg = _kill_test_config(2, tmp_path / "run", "learner.strategy=fsdp", "train.pretrain_iters=2", "train.iters=2",
                            "train.checkpoint_every=2")
    path = Trainer(cfg).run()["checkpoint"]
    dcp = tmp_path / "run" / "checkpoints" / "ckpt_00000004.learner" / "dcp"
    entries = store_reader(str(dcp)).read_metadata().state_dict_metadata
    sharded = {k for k, m in entries.items() if len(getattr(m, "chunks", ())) > 1}
    assert any(k.startswith("generator.") for k in sharded) and any(".optim.state." in k for k in sharded)
    group = LearnerGroup(cfg, manager=ActorManager(ray_session, None), actor_options=[{"num_cpus": 0.5}] * 2)
    try:
        reads = ray_session.get([a.restore.remote(path) for a in group.actors])
        whole = group.whole_state()
    finally:
        for a in group.actors:
            ray_session.kill(a)
    shard_reads = []
    for rank, rank_reads in enumerate(reads):
        own = f"__{rank}_0.distcp"
        assert {f for f, k, _ in rank_reads if k in sharded} == {own}, rank_reads
        others = {k for f, k, _ in rank_reads if f != own}
        assert not others & sharded, others  # the other rank's file: only entries saved whole
        own_bytes = sum(n for f, _, n in rank_reads if f == own)
        assert own_bytes <= (dcp / own).stat().st_size
        shard_reads += [(f, k) for f, k, _ in rank_reads if k in sharded]
        print(f"rank {rank}: {own_bytes} bytes of {own} ({(dcp / own).stat().st_size}), "
              f"{sum(n for f, _, n in rank_reads if f != own)} bytes of the other file ({len(others)} entries)")
    assert len(shard_reads) == len(set(shard_reads))  # no shard read twice
    assert {k for _, k in shard_reads} == sharded  # and every one read
    saved = load_checkpoint(path)["learner"]["generator"]
    assert_same_tensors(saved, whole["generator"], "restored generator", {"rtol": 0, "atol": 0})
