"""KL to the pretrained policy in the reward, and the entropy bonus, for every rollout algorithm (
Ziegler et al. 2019 Sec. 2.2, InstructGPT Eq. 2): by hand, against loops, and through the learner."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rayseq.algos.common import LearnerState, RolloutAlgo
from rayseq.algos.regularizers import KLController, apply_kl_penalty, entropy_bonus, kl_penalty, sampled_kl
from rayseq.config import ConfigError, build_config, config_to_dict
from rayseq.distributed.actors.learner import Learner
from rayseq.distributed.actors.worker import RolloutWorker
from rayseq.rewards import terminal_rewards
from rayseq.types import Rollout, RolloutRequest
from tests.conftest import tiny_config


def _rollout(rewards, score, logp, mask, returns=None):
    z = np.zeros_like(mask)
    return Rollout(src=z[:, :1].astype(np.int64), src_len=np.ones(len(mask), np.int64), tokens=z.astype(np.int64),
                   token_mask=mask, action_mask=mask, logp=logp, rewards=rewards, score=score, returns=returns)


def test_kl_penalty_in_the_reward_by_hand():
    mask = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
    old = np.array([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]], np.float32)
    ref = np.array([[-1.5, -1.0, -0.5], [-2.0, -1.0, -9.0]], np.float32)
    kl = sampled_kl(old, ref, mask)  # old − ref on sampled tokens: [[0.5, −1, 0], [1, 0, 0 (masked)]]
    np.testing.assert_allclose(kl, [[0.5, -1.0, 0.0], [1.0, 0.0, 0.0]])
    r = _rollout(terminal_rewards(np.array([1.0, 0.0], np.float32), mask), np.array([1.0, 0.0], np.float32), old,
                 mask, returns=np.ones((2, 3), np.float32))
    apply_kl_penalty(r, kl, 0.1)
    # r'_t = r_t − 0.1·kl_t; the terminal reward 1 sits on row 0's last token
    np.testing.assert_allclose(r.rewards, [[-0.05, 0.1, 1.0], [-0.1, 0.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(r.score, [1.0 - 0.1 * (-0.5), 0.0 - 0.1 * 1.0], atol=1e-6)  # s − β·Σ kl
    # returns minus the penalty's reward-to-go: row 0 Σ_{τ≥t} 0.1·kl = (−0.05, −0.1, 0)
    np.testing.assert_allclose(r.returns, [[1.05, 1.1, 1.0], [0.9, 1.0, 1.0]], atol=1e-6)


MASK = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
OLD = np.array([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]], np.float32)
REF = np.array([[-1.5, -1.0, -0.5], [-2.0, -1.0, -9.0]], np.float32)


def test_the_kl_penalty_of_a_rollout_by_hand():
    """kl = old − ref on sampled tokens: [[0.5, −1, 0], [1, 0, 0]]; per reply −0.5 and 1 (mean 0.25), per token
    0.5 / 5 sampled tokens = 0.1; β = 0.1 penalises the rewards, then steps towards the target 0.5 nats per reply:
    e = clip(0.25 / 0.5 − 1, −0.2, 0.2) = −0.2, β ← 0.1 · (1 + 0.1 · (−0.2)) = 0.098."""
    score = np.array([1.0, 0.0], np.float32)
    r = _rollout(terminal_rewards(score, MASK), score, OLD, MASK)
    controller = KLController(0.1, target=0.5)
    metrics = kl_penalty(r, REF, controller)
    assert metrics == pytest.approx({"kl/per_reply": 0.25, "kl/per_token": 0.1, "kl/coef": 0.1})
    assert controller.coef == pytest.approx(0.098)
    np.testing.assert_allclose(r.rewards, [[-0.05, 0.1, 1.0], [-0.1, 0.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(r.score, [1.05, -0.1], atol=1e-6)


class _RefPolicy:
    """π_ref whose log-probs are REF whatever it reads."""

    def logprobs(self, src, src_len, tokens):
        return SimpleNamespace(logp=torch.from_numpy(REF), states=None)


class _Recorded(RolloutAlgo):
    def update(self, state, rollout, iteration):
        return {"seen/score": rollout.score.tolist()}


def test_a_regularized_algorithm_penalises_its_rollout_before_its_update_while_it_holds_the_reference():
    state = LearnerState(generator=None, gen_opt=None, device=torch.device("cpu"))
    algo = _Recorded(SimpleNamespace(kl_coef=0.1, kl_target=None))
    assert algo.frozen_copies() == ("ref_policy",)
    assert _Recorded(SimpleNamespace(kl_coef=0.0, kl_target=None)).frozen_copies() == ()
    score = np.array([1.0, 0.0], np.float32)
    untouched = algo.learn(state, _rollout(terminal_rewards(score, MASK), score, OLD, MASK), 0)
    assert untouched == {"seen/score": [1.0, 0.0]}  # no π_ref yet (before the train stage): no penalty
    algo.modules["ref_policy"] = _RefPolicy()
    m = algo.learn(state, _rollout(terminal_rewards(score, MASK), score, OLD, MASK), 0)
    assert m["seen/score"] == pytest.approx([1.05, -0.1]) and m["kl/per_reply"] == pytest.approx(0.25)
    assert algo.state_beside_modules() == {"kl_coef": 0.1}  # β is the algorithm's, saved while it holds π_ref


def test_adaptive_kl_controller_moves_beta_towards_the_target():
    fixed = KLController(0.2, None)
    assert fixed.update(100.0) == 0.2
    c = KLController(0.2, target=1.0)
    assert c.update(1.5) == pytest.approx(0.2 * (1 + 0.1 * 0.2))  # error clipped to +0.2: β grows 2%
    c = KLController(0.2, target=1.0)
    assert c.update(0.9) == pytest.approx(0.2 * (1 + 0.1 * -0.1))  # 10% under: β shrinks 1%
    with pytest.raises(ConfigError, match="kl_target needs algo.kl_coef > 0"):
        build_config(None, ["algo.kl_target=2"])


def test_entropy_bonus_equals_a_loop_and_ignores_banned_ids():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    logits[..., 0] = float("-inf")  # a banned id
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    bonus, h = entropy_bonus(logits, mask, 0.5)
    loop = []
    for b in range(2):
        for t in range(3):
            if mask[b, t]:
                p = torch.softmax(logits[b, t], -1)
                loop.append(-sum(float(q * torch.log(q)) for q in p if q > 0))
    assert h == pytest.approx(np.mean(loop), rel=1e-6) and float(bonus) == pytest.approx(-0.5 * np.mean(loop))
    assert float(entropy_bonus(logits, mask, 0.0)[0]) == 0.0


def _learner(*overrides):
    cfg = tiny_config("algo.name=ppo", "algo.minibatch_size=32", *overrides)
    learner, worker = Learner(cfg), RolloutWorker(cfg)
    rng = np.random.default_rng(1)
    for i in range(20):
        learner.update(learner.task.sample_prompts(rng, 64, with_targets=True), i)
    learner.start_stage("train")
    return learner, worker


def _train(learner, worker, n=15):
    metrics = []
    for i in range(n):
        worker.set_weights(learner.get_weights(), learner.version)
        r = worker.sample(learner.task.sample_prompts(np.random.default_rng(100 + i), 64), RolloutRequest(3, seed=i))
        metrics.append(learner.update(r, i))
    return metrics


def test_kl_coef_keeps_the_policy_near_the_pretrained_one():
    """Same data, same seeds: with β = 1 the KL to the pretrained policy stays well under the unregularised run's;
    at the first update the sampling policy is the pretrained one, so the KL is 0."""
    m0 = _train(*_learner("algo.lr=1e-2"))
    learner, worker = _learner("algo.lr=1e-2", "algo.kl_coef=1.0")
    m1 = _train(learner, worker)
    assert "kl/per_reply" not in m0[0] and m1[0]["kl/per_reply"] == pytest.approx(0.0, abs=1e-4)
    assert m1[-1]["kl/coef"] == 1.0
    # the unregularised run's KL, measured with the same reference
    ref = learner.algo.modules["ref_policy"]
    learner0, worker0 = _learner("algo.lr=1e-2")
    _train(learner0, worker0)

    def kl_to_ref(lrn, wrk):
        wrk.set_weights(lrn.get_weights(), lrn.version + 100)
        r = wrk.sample(lrn.task.sample_prompts(np.random.default_rng(7), 256), RolloutRequest(3, seed=7))
        with torch.no_grad():
            lp_ref = ref.logprobs(torch.from_numpy(r.src), torch.from_numpy(r.src_len), torch.from_numpy(r.tokens)).logp
        return float(sampled_kl(r.logp, lp_ref.numpy(), r.action_mask).sum(1).mean())

    assert kl_to_ref(learner, worker) < 0.5 * kl_to_ref(learner0, worker0)
    # β and π_ref are in the checkpoint, the algorithm's entries
    state = learner.state_dict()
    assert state["algo"]["kl_coef"] == 1.0 and set(state["algo"]["ref_policy"]) == set(state["generator"])


def test_entropy_coef_keeps_entropy_higher():
    """Same data and seeds: after 10 updates the policy trained with the bonus is more spread out."""
    runs = {}
    for coef in (0.0, 0.5):
        learner, worker = _learner("algo.lr=1e-2", f"algo.entropy_coef={coef}")
        m = _train(learner, worker, n=10)
        assert ("policy/entropy" in m[-1]) == (coef > 0)
        r = worker.sample(learner.task.sample_prompts(np.random.default_rng(9), 256), RolloutRequest(3, seed=9))
        with torch.no_grad():
            out = learner.state.generator.logprobs(torch.from_numpy(r.src), torch.from_numpy(r.src_len),
                                                   torch.from_numpy(r.tokens))
        runs[coef] = entropy_bonus(out.logits, torch.from_numpy(r.action_mask), 1.0)[1]
    assert runs[0.5] > runs[0.0] + 0.05, runs


@pytest.mark.parametrize("name", ["reinforce", "mixer", "ppo_dynamic", "scst", "actor_critic", "grpo", "rloo",
                                  "seqgan", "mixer_ppo"])
def test_every_rollout_algorithm_reads_the_regularizer_keys(name):
    cfg = build_config(None, [f"algo.name={name}", "algo.kl_coef=0.1", "algo.entropy_coef=0.01"])
    assert cfg.algo.kl_coef == 0.1 and config_to_dict(cfg)["algo"]["entropy_coef"] == 0.01
    with pytest.raises(ConfigError, match="algo.kl_coef: algo.name=mle does not read"):
        build_config(None, ["algo.name=mle", "algo.kl_coef=0.1"])
