"""Actor-critic, SeqGAN-critic and SCST objectives: GAE against a plain loop and by hand, the critic's Q
(r_t + γ V(s_{t+1})), the self-critical advantage, and one update of each on real rollouts."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rayseq.algos import make_algo
from rayseq.algos.scst import self_critical_advantages
from rayseq.distributed.actors.learner import Learner
from rayseq.distributed.actors.worker import RolloutWorker
from rayseq.losses import gae
from rayseq.rewards import terminal_rewards
from tests.conftest import tiny_config


def gae_loop(r, v, mask, gamma, lam):
    """Per row, per step, straight from the definition A_t = Σ_k (γλ)^k δ_{t+k}."""
    B, T = r.shape
    adv = np.zeros((B, T))
    for b in range(B):
        L = int(mask[b].sum())
        vals = list(v[b, :L]) + [0.0]
        deltas = [r[b, t] + gamma * vals[t + 1] - vals[t] for t in range(L)]
        for t in range(L):
            adv[b, t] = sum((gamma * lam) ** k * deltas[t + k] for k in range(L - t))
    return adv


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (0.99, 0.0)])
def test_gae_matches_the_plain_loop(gamma, lam):
    g = torch.Generator().manual_seed(0)
    B, T = 7, 9
    lengths = torch.tensor([9, 1, 5, 3, 9, 2, 6])
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    r = torch.randn(B, T, generator=g, dtype=torch.float64) * mask
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    adv, ret = gae(r, v, mask, gamma, lam)
    ref = gae_loop(r.numpy(), v.numpy(), mask.numpy(), gamma, lam)
    np.testing.assert_allclose(adv.numpy(), ref, atol=1e-12)
    np.testing.assert_allclose(ret.numpy(), (ref + v.numpy()) * mask.numpy(), atol=1e-12)
    assert (adv[mask == 0] == 0).all()


def test_gae_by_hand():
    # one sequence of 3 tokens, reward 1 at the end, V = (0.2, 0.5, 0.8), γ = 1, λ = 0.5:
    # δ = (0 + 0.5 − 0.2, 0 + 0.8 − 0.5, 1 + 0 − 0.8) = (0.3, 0.3, 0.2)
    # A_3 = 0.2, A_2 = 0.3 + 0.5·0.2 = 0.4, A_1 = 0.3 + 0.5·0.4 = 0.5;  G^λ = A + V = (0.7, 0.9, 1.0)
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    v = torch.tensor([[0.2, 0.5, 0.8, 9.0]])  # the 4th position is padding
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv, ret = gae(r, v, mask, 1.0, 0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.4, 0.2, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.7, 0.9, 1.0, 0.0]]))
    # λ = 0 gives the critic's Q = r_t + γ V(s_{t+1}) (SeqGAN-critic): (0.5, 0.8, 1.0)
    torch.testing.assert_close(gae(r, v, mask, 1.0, 0.0)[1], torch.tensor([[0.5, 0.8, 1.0, 0.0]]))


def test_self_critical_advantage_by_hand():
    # sample rewards (0.5, 0.2), greedy rewards (0.3, 0.4): A = (+0.2, −0.2) on every sampled token
    adv = self_critical_advantages(torch.tensor([0.5, 0.2]), torch.tensor([0.3, 0.4]),
                                   torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.2, 0.2, 0.0], [0.0, -0.2, -0.2]]))


def _pair(*overrides):
    cfg = tiny_config(*overrides)
    learner, worker = Learner(cfg), RolloutWorker(cfg)
    learner.start_stage("train")
    worker.set_weights(learner.get_weights(), learner.version)
    return cfg, learner, worker


def _rollout(cfg, learner, worker, n=64, seed=0):
    algo = make_algo(cfg.algo)
    prompts = learner.task.sample_prompts(np.random.default_rng(seed), n, with_targets=algo.needs_targets)
    return worker.sample(prompts, algo.rollout_request(0, learner.task.max_tgt_len, 1.0, seed))


def test_scst_rollouts_carry_the_greedy_reply_and_its_reward():
    cfg, learner, worker = _pair("algo.name=scst")
    r = _rollout(cfg, learner, worker)
    greedy = worker.generator.sample(torch.from_numpy(r.src), torch.from_numpy(r.src_len), learner.task.max_tgt_len,
                                     greedy=True)
    np.testing.assert_array_equal(r.extras["greedy_tokens"], greedy.tokens.numpy())
    _, expect = learner.task.rewards(r.src, r.src_len, r.extras["greedy_tokens"], r.extras["greedy_mask"])
    np.testing.assert_array_equal(r.extras["greedy_score"], expect)
    r.score = (np.arange(len(r)) % 2).astype(np.float32)
    before = copy.deepcopy(learner.state.generator.state_dict())
    m = learner.update(r, 0)
    assert np.isfinite(m["loss/policy"]) and m["scst/better_than_greedy"] == pytest.approx(
        float((r.score > r.extras["greedy_score"]).mean()))
    assert any(not torch.equal(before[k], v) for k, v in learner.state.generator.state_dict().items())


@pytest.mark.parametrize("name", ["actor_critic", "seqgan_critic"])
def test_critic_learns_the_value_and_the_actor_waits_for_warmup(name):
    extra = ["disc.emb_dim=8", "disc.filter_sizes=[1,2]", "disc.num_filters=[4,4]"] if name == "seqgan_critic" else []
    cfg, learner, worker = _pair(f"algo.name={name}", "algo.critic_warmup=1", "algo.critic_lr=3e-2", *extra)
    r = _rollout(cfg, learner, worker)
    r.score = np.full(len(r), 0.7, np.float32)
    r.rewards = terminal_rewards(r.score, r.token_mask)
    gen_before = copy.deepcopy(learner.state.generator.state_dict())
    first = learner.update(r, 0)  # warm-up: critic only
    assert all(torch.equal(gen_before[k], v) for k, v in learner.state.generator.state_dict().items())
    for i in range(1, 150):
        m = learner.update(r, i + 100)
    assert m["loss/critic"] < 0.05 * first["loss/critic"]  # V → the constant return 0.7 (γ = 1)
    assert any(not torch.equal(gen_before[k], v) for k, v in learner.state.generator.state_dict().items())
    state = learner.state_dict()
    assert "critic" in state["algo"] and "critic_opt" in state["algo"]  # the algorithm's own, checkpointed with it
