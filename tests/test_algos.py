"""Algorithm updates on real (tiny) rollouts: each one learns, PPO at ρ = 1 is REINFORCE, MIXER's schedule."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rayseq.algos import ALGORITHMS, make_algo
from rayseq.config import REFERENCE_ALGOS, config_to_dict
from rayseq.distributed.learner import Learner
from rayseq.distributed.worker import RolloutWorker
from rayseq.rewards import terminal_rewards
from tests.conftest import tiny_config


def make_pair(*overrides, pretrain_steps: int = 0):
    cfg = tiny_config(*overrides)
    d = config_to_dict(cfg)
    learner, worker = Learner(d), RolloutWorker(d)
    rng = np.random.default_rng(1)
    for i in range(pretrain_steps):  # stage "mle"
        learner.update(learner.task.sample_prompts(rng, 64, with_targets=True), i)
    learner.start_stage("train")
    return cfg, learner, worker


def rollout_for(cfg, learner, worker, iteration=0, n=64, seed=0):
    worker.set_weights(learner.get_weights(), learner.version)
    algo = make_algo(cfg.algo)
    prompts = learner.task.sample_prompts(np.random.default_rng(seed), n, with_targets=algo.needs_targets)
    request = algo.rollout_request(iteration, learner.task.max_tgt_len, 1.0, seed)
    return worker.sample(prompts, request)


def half_rewarded(rollout):
    """An untrained model is never right; give every other sample reward 1 so the gradient is non-zero."""
    rollout.score = (np.arange(len(rollout)) % 2).astype(np.float32)
    rollout.rewards = terminal_rewards(rollout.score, rollout.token_mask)
    return rollout


@pytest.mark.parametrize("name", sorted(set(ALGORITHMS) - set(REFERENCE_ALGOS)))  # those: tests/test_erpo.py
def test_every_algorithm_updates_the_generator(name):
    cfg, learner, worker = make_pair(f"algo.name={name}", "algo.minibatch_size=16", "algo.ss_k=1")
    before = copy.deepcopy(learner.state.generator.state_dict())
    algo = make_algo(cfg.algo)
    if algo.kind == "supervised":
        batch = learner.task.sample_prompts(np.random.default_rng(0), 32, with_targets=True)
        if hasattr(algo, "augment"):
            batch, _ = algo.augment(learner.task, batch, np.random.default_rng(1), 0)
    else:
        batch = half_rewarded(rollout_for(cfg, learner, worker))
    metrics = learner.update(batch, 0)
    after = learner.state.generator.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(np.isfinite(v) for v in metrics.values())
    assert learner.version == 1


def test_ppo_and_ppo_dynamic_equal_reinforce_at_ratio_one():
    """K = 1 over one minibatch: ρ = 1 at the only step, so PPO, PPO-dynamic and REINFORCE take the
    same step (Tuan et al.: the clip only acts once π moves away from π_old)."""
    params = {}
    for name in ("reinforce", "ppo", "ppo_dynamic"):
        cfg, learner, worker = make_pair(f"algo.name={name}", "algo.epochs=1", "algo.minibatch_size=null",
                                         pretrain_steps=30)
        rollout = half_rewarded(rollout_for(cfg, learner, worker))
        m = learner.update(rollout, 0)
        if name != "reinforce":
            assert m["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
            assert m["policy/clipfrac"] == 0.0
        params[name] = learner.state.generator.state_dict()
    for name in ("ppo", "ppo_dynamic"):
        for k, v in params["reinforce"].items():
            torch.testing.assert_close(params[name][k], v, rtol=1e-5, atol=1e-6)


def test_ppo_minibatches_move_the_ratio_and_clip():
    cfg, learner, worker = make_pair("algo.name=ppo", "algo.epochs=4", "algo.minibatch_size=8", "algo.lr=0.05",
                                     "algo.eps=0.05", pretrain_steps=30)
    m = learner.update(half_rewarded(rollout_for(cfg, learner, worker)), 0)
    assert m["policy/updates"] == 4 * 8
    assert m["policy/clipfrac"] > 0.0 and m["policy/approx_kl"] > 0.0


def test_reinforce_raises_the_reward_on_counting():
    """A handful of REINFORCE steps from an MLE-pretrained model raise the sampled reward."""
    cfg, learner, worker = make_pair("algo.name=reinforce", "algo.lr=3e-3", "train.pretrain_lr=1e-2",
                                     pretrain_steps=200)
    first = rollout_for(cfg, learner, worker, n=512, seed=100).score.mean()
    for i in range(60):
        learner.update(rollout_for(cfg, learner, worker, i, n=256, seed=i), i)
    last = rollout_for(cfg, learner, worker, n=512, seed=200).score.mean()
    assert last > first + 0.05, (first, last)


def test_mixer_schedule_and_forced_prefix():
    cfg, learner, worker = make_pair("algo.name=mixer", "algo.mixer_delta_start=1", "algo.mixer_delta_every=10")
    algo = make_algo(cfg.algo)
    T = learner.task.max_tgt_len  # 3
    assert [algo.delta(i, T) for i in (0, 9, 10, 19, 20, 1000)] == [1, 1, 2, 2, 3, 3]
    assert algo.rollout_request(0, T, 1.0, 0).prefix_len == 2
    r = rollout_for(cfg, learner, worker, iteration=0)
    # the first T − δ = 2 tokens are the reference's, not sampled
    np.testing.assert_array_equal(r.tokens[:, :2], r.tgt[:, :2])
    np.testing.assert_array_equal(r.action_mask[:, :2], 0)
    assert (r.action_mask[:, 2] == r.token_mask[:, 2]).all()
    m = learner.update(r, 0)
    assert m["mixer/delta"] == 1.0
