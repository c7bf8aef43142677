"""Algorithm updates on real (tiny) rollouts: each one learns, PPO at ρ = 1 is REINFORCE, MIXER's schedule."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rayseq.algos import make_algo
from rayseq.algos.mixer import ReferencePrefix
from rayseq.distributed.actors.learner import Learner
from rayseq.distributed.actors.worker import RolloutWorker
from rayseq.registry import ALGORITHMS, algorithm_class
from rayseq.rewards import terminal_rewards
from tests.conftest import tiny_config


def make_pair(*overrides, pretrain_steps: int = 0):
    cfg = tiny_config(*overrides)
    learner, worker = Learner(cfg), RolloutWorker(cfg)
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


@pytest.mark.parametrize("name", sorted(n for n in ALGORITHMS if not algorithm_class(n).needs_references  # test_erpo
                                        and not algorithm_class(n).own_task))  # test_reward_model
def test_every_algorithm_updates_the_generator(name):
    reads = algorithm_class(name).fields
    extra = [o for o, key in (("algo.minibatch_size=16", "minibatch_size"), ("algo.ss_k=1", "ss_k")) if key in reads]
    cfg, learner, worker = make_pair(f"algo.name={name}", *extra)
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
    assert all(np.isfinite(v) for k, v in metrics.items() if not k.startswith("ppo_dynamic/"))  # bounds may be ∞
    assert learner.version == 1
    # the value baseline b(s_t) (zero at the start): held, first among its modules, and trained by the algorithms
    # whose update reads it (the SeqGAN family's with algo.use_baseline=false too); the others hold none
    held = learner.algo.modules
    if name in READS_BASELINE:
        assert list(held)[:2] == ["baseline", "base_opt"]
        assert float(held["baseline"].linear.weight.detach().abs().sum()) > 0
    else:
        assert not {"baseline", "base_opt"} & set(held)
        assert not {"baseline", "base_opt"} & set(learner.state_dict().get("algo", {}))


READS_BASELINE = {"reinforce", "mixer", "mixer_ppo", "mixer_ppo_dynamic", "ppo", "ppo_dynamic", "seqgan", "seqgan_ppo",
                  "seqgan_ppo_dynamic"}


def test_ppo_and_ppo_dynamic_equal_reinforce_at_ratio_one():
    """K = 1 over one minibatch: ρ = 1 at the only step, so PPO, PPO-dynamic and REINFORCE take the
    same step (Tuan et al.: the clip only acts once π moves away from π_old)."""
    params = {}
    for name in ("reinforce", "ppo", "ppo_dynamic"):
        ppo_keys = [] if name == "reinforce" else ["algo.epochs=1", "algo.minibatch_size=null"]
        cfg, learner, worker = make_pair(f"algo.name={name}", *ppo_keys, pretrain_steps=30)
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


@pytest.mark.e2e
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
    T = learner.task.max_tgt_len  # 3: counting's references are 3 tokens, no EOS
    assert [algo.delta(i) for i in (0, 9, 10, 19, 20, 1000)] == [1, 1, 2, 2, 3, 101]
    assert algo.rollout_request(0, T, 1.0, 0).sampler == ReferencePrefix(delta=1)
    r = rollout_for(cfg, learner, worker, iteration=0)
    # the first len(y*) − δ = 2 tokens are the reference's, not sampled
    np.testing.assert_array_equal(r.tokens[:, :2], r.tgt[:, :2])
    np.testing.assert_array_equal(r.action_mask[:, :2], 0)
    assert (r.action_mask[:, 2] == r.token_mask[:, 2]).all()
    m = learner.update(r, 0)
    assert m["mixer/delta"] == 1.0 and m["mixer/sampled_frac"] == pytest.approx(float(r.action_mask.sum())
                                                                                 / float(r.token_mask.sum()))
    # δ past the reference length: the prefix is clamped at 0 and the whole reply is sampled (REINFORCE)
    r = rollout_for(cfg, learner, worker, iteration=1000)
    np.testing.assert_array_equal(r.action_mask, r.token_mask)


# -- randomness derived from the run seed ---------------------------------------------


def _update_with_algo_seed(name: str, algo_seed: int, *overrides: str) -> dict:
    """One update from the same initial weights and batch; only the algorithm's run seed differs."""
    cfg, learner, worker = make_pair(f"algo.name={name}", *overrides, pretrain_steps=5)
    batch = (learner.task.sample_prompts(np.random.default_rng(0), 64, with_targets=True)
             if learner.algo.kind == "supervised" else half_rewarded(rollout_for(cfg, learner, worker)))
    algo = make_algo(cfg.algo, seed=algo_seed)
    algo.modules = learner.algo.modules  # what the learner built for it (PPO: its value baseline)
    learner.algo = algo
    learner.update(batch, 7)
    return {k: v.clone() for k, v in learner.state.generator.state_dict().items()}


@pytest.mark.parametrize(("name", "overrides"), [
    ("ppo", ("algo.minibatch_size=16",)),  # the minibatch permutation
    ("scheduled_sampling", ("algo.ss_k=2",)),  # the coins that pick the decoder's inputs
])
def test_random_streams_follow_the_run_seed(name, overrides):
    """Two run seeds draw different streams at the same iteration; the same seed draws the same one. (They
    used to be seeded by the iteration alone, so every seed made the same draws.)"""
    a, b, c = (_update_with_algo_seed(name, s, *overrides) for s in (0, 1, 0))
    assert all(torch.equal(a[k], c[k]) for k in a)
    assert any(not torch.equal(a[k], b[k]) for k in a)
    from rayseq.algos.ppo import minibatch_seed

    algos = [make_algo(tiny_config("algo.name=ppo").algo, seed=s) for s in (0, 1)]
    assert minibatch_seed(algos[0], 3) != minibatch_seed(algos[1], 3) != minibatch_seed(algos[1], 4)


# -- MIXER's forced prefix per reference ----------------------------------------------


@pytest.mark.parametrize("delta", [1, 2, 4])
def test_mixer_forces_len_minus_delta_tokens_of_each_reference(corpus, delta):
    """Chit-chat references have different lengths (+ EOS): row b forces max(len(y*_b) − δ, 0) reference tokens,
    then samples; before, every row forced max_len − δ = 20 − δ tokens (its padding included)."""
    from rayseq.types import RolloutRequest

    cfg = tiny_config("task.name=chitchat", f"task.data={corpus}", "algo.name=mixer", "task.test_size=100")
    learner, worker = Learner(cfg), RolloutWorker(cfg)
    worker.set_weights(learner.get_weights(), 0)
    prompts = learner.task.sample_prompts(np.random.default_rng(0), 64, with_targets=True)
    assert len(set(prompts.tgt_len.tolist())) >= 3  # references of different lengths
    r = worker.sample(prompts, RolloutRequest(max_len=learner.task.max_tgt_len, seed=1, sampler=ReferencePrefix(delta)))
    forced = np.maximum(prompts.tgt_len - delta, 0)
    for b in range(len(r)):
        p = int(forced[b])
        np.testing.assert_array_equal(r.tokens[b, :p], prompts.tgt[b, :p])  # the reference's first len − δ
        assert (r.action_mask[b, :p] == 0).all()
        assert (r.action_mask[b, p:] == r.token_mask[b, p:]).all() and r.action_mask[b, p] == 1  # then sampled
    assert (forced == 0).any() == (delta >= prompts.tgt_len.min())  # a reference shorter than δ: sampled whole
