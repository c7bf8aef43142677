"""The samplers algorithms put on their requests (rayseq.algos.sampling), run by a rollout worker that names no
algorithm: each draws what the worker drew for it before it had samplers (MIXER's prefix forced by the policy's own
loop, SCST's greedy decode beside the engine's sample, ERPO's q on the request's random stream), and SCST's extras
are scored with the task's reward on the worker and on a scorer alike."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rayseq.algos.erpo import QSampler, erpo_sample
from rayseq.algos.mixer import ReferencePrefix
from rayseq.algos.sampling import POLICY, Sampler
from rayseq.algos.scst import GreedyBaseline
from rayseq.config import ConfigError, build_config
from rayseq.distributed.actors.scorer import ScorerActor
from rayseq.types import PromptBatch, RolloutRequest
from tests.algos.test_algos import make_pair


def _worker(*overrides, pretrain_steps: int = 0):
    cfg, learner, worker = make_pair(*overrides, pretrain_steps=pretrain_steps)
    worker.set_weights(learner.get_weights(), 0)
    return cfg, learner.task, worker


def _assert_same_sample(rollout, out):
    np.testing.assert_array_equal(rollout.tokens, out.tokens.numpy())
    np.testing.assert_array_equal(rollout.token_mask, out.token_mask.numpy())
    np.testing.assert_array_equal(rollout.action_mask, out.action_mask.numpy())
    np.testing.assert_array_equal(rollout.logp, out.logp.numpy())


def test_every_sampler_is_one_and_survives_pickling():
    import pickle

    for sampler in (POLICY, ReferencePrefix(2), GreedyBaseline(), QSampler("interpolation", 1.0, (0.1, 0.2, 0.7))):
        assert isinstance(sampler, Sampler)
        again = pickle.loads(pickle.dumps(sampler))
        assert type(again) is type(sampler) and vars(again) == vars(sampler)


def test_a_request_without_a_sampler_draws_from_the_engine():
    _, task, worker = _worker("algo.name=ppo")
    prompts = task.sample_prompts(np.random.default_rng(0), 16)
    r = worker.sample(prompts, RolloutRequest(max_len=task.max_tgt_len, temperature=0.8, seed=5))
    out = worker.engine.generate(torch.from_numpy(prompts.src), torch.from_numpy(prompts.src_len), task.max_tgt_len,
                                 temperature=0.8, seed=5)
    _assert_same_sample(r, out)
    assert r.extras == {}


def test_reference_prefix_forces_len_minus_delta_reference_tokens_by_hand():
    # counting's references are 3 tokens; made 3, 2 and 1 long here: with δ = 1 rows force 2, 1 and 0 tokens
    _, task, worker = _worker("algo.name=mixer")
    full = task.sample_prompts(np.random.default_rng(0), 3, with_targets=True)
    tgt = full.tgt.copy()
    tgt[1, 2:] = tgt[2, 1:] = task.specials.pad
    prompts = PromptBatch(full.src, full.src_len, tgt, np.array([3, 2, 1]), full.key)
    r = worker.sample(prompts, RolloutRequest(max_len=task.max_tgt_len, seed=1, sampler=ReferencePrefix(delta=1)))
    for b, forced in enumerate([2, 1, 0]):
        np.testing.assert_array_equal(r.tokens[b, :forced], tgt[b, :forced])
        assert (r.action_mask[b, :forced] == 0).all() and r.action_mask[b, forced] == 1
    assert r.extras == {}


@pytest.mark.parametrize(("delta", "temperature"), [(1, 1.0), (2, 0.7), (5, 1.3)])
def test_reference_prefix_samples_what_the_builtin_engine_sampled(delta, temperature):
    """The draw the built-in engine made with MIXER's prefix: the policy's ``sample`` with the prefix, the clamped
    lengths and a generator seeded with the request's seed, bit for bit."""
    _, task, worker = _worker("algo.name=mixer")
    prompts = task.sample_prompts(np.random.default_rng(3), 32, with_targets=True)
    r = worker.sample(prompts, RolloutRequest(max_len=task.max_tgt_len, temperature=temperature, seed=11,
                                              sampler=ReferencePrefix(delta)))
    prefix_len = (torch.from_numpy(prompts.tgt_len) - delta).clamp(min=0)
    with torch.no_grad():
        out = worker.generator.sample(torch.from_numpy(prompts.src), torch.from_numpy(prompts.src_len),
                                      task.max_tgt_len, temperature=temperature, prefix=torch.from_numpy(prompts.tgt),
                                      prefix_len=prefix_len, generator=torch.Generator().manual_seed(11))
    _assert_same_sample(r, out)
    assert (r.action_mask < r.token_mask).any() == (delta < 3)  # counting: 3-token references


def test_greedy_baseline_adds_the_greedy_reply_and_scores_it_on_the_worker_and_on_a_scorer():
    # pretrained on counting until some greedy replies and samples are right (rewards 1), not the same ones
    cfg, task, worker = _worker("algo.name=scst", "train.pretrain_lr=1e-2", pretrain_steps=100)
    prompts = task.sample_prompts(np.random.default_rng(0), 32)
    request = RolloutRequest(max_len=task.max_tgt_len, seed=4, sampler=GreedyBaseline())
    here = worker.sample(prompts, request)
    # the sample is the engine's, as without a sampler
    plain = worker.sample(prompts, dataclasses.replace(request, sampler=None))
    np.testing.assert_array_equal(here.tokens, plain.tokens)
    np.testing.assert_array_equal(here.logp, plain.logp)
    np.testing.assert_array_equal(here.score, plain.score)
    # the extras: the policy's greedy decode and its reward by the task's reward function
    greedy = worker.generator.sample(torch.from_numpy(prompts.src), torch.from_numpy(prompts.src_len),
                                     task.max_tgt_len, greedy=True)
    assert sorted(here.extras) == ["greedy_mask", "greedy_score", "greedy_tokens"]
    np.testing.assert_array_equal(here.extras["greedy_tokens"], greedy.tokens.numpy())
    np.testing.assert_array_equal(here.extras["greedy_mask"], greedy.token_mask.numpy())
    _, expect = task.rewards(prompts.src, prompts.src_len, greedy.tokens.numpy(), greedy.token_mask.numpy())
    np.testing.assert_array_equal(here.extras["greedy_score"], expect)
    assert 0 < float(expect.mean()) and (expect != here.score).any()  # the greedy replies' own rewards
    # unscored on the worker, scored on a scorer actor with the request's sampler: the same numbers
    there = worker.sample(prompts, request, score=False)
    assert "greedy_score" not in there.extras
    there = ScorerActor(cfg).score_rollout(there, request.sampler)
    np.testing.assert_array_equal(there.extras["greedy_score"], expect)
    np.testing.assert_array_equal(there.score, here.score)


@pytest.mark.parametrize(("mode", "lambdas"), [("spg", (0.0, 0.0, 1.0)), ("interpolation", (0.3, 0.3, 0.4))])
def test_q_sampler_draws_erpo_q_with_the_request_stream(corpus, mode, lambdas):
    """What the worker drew for an ERPO request before it had samplers: ``erpo_sample`` on its generator with a
    generator seeded with the request's seed, bit for bit, and z's shares in the rollout's info."""
    _, task, worker = _worker("task.name=chitchat", f"task.data={corpus}", "task.test_size=100",
                              "algo.name=erpo_interpolation")
    prompts = task.sample_prompts(np.random.default_rng(0), 12, with_targets=True)
    sampler = QSampler(mode, c=2.0, lambdas=lambdas)
    r = worker.sample(prompts, RolloutRequest(max_len=task.max_tgt_len, seed=9, sampler=sampler))
    out, stats = erpo_sample(worker.generator, torch.from_numpy(prompts.src), torch.from_numpy(prompts.src_len),
                             task.max_tgt_len, prompts=prompts, task=task, mode=mode, c=2.0, lambdas=lambdas,
                             generator_rng=torch.Generator().manual_seed(9))
    _assert_same_sample(r, out)
    assert {k: r.info[k] for k in stats} == stats and (mode == "spg") == (stats == {})
    assert r.extras == {}


def test_the_algorithms_requests_carry_their_samplers(corpus):
    from rayseq.algos import make_algo

    def request(*overrides):
        cfg = build_config(None, ["progress=false", *overrides])
        return make_algo(cfg.algo).rollout_request(120, 20, 1.0, 0)

    assert request("algo.name=mixer_ppo", "algo.mixer_delta_every=50").sampler == ReferencePrefix(delta=3)
    assert request("algo.name=scst").sampler == GreedyBaseline()
    chitchat = ("task.name=chitchat", f"task.data={corpus}")
    assert request(*chitchat, "algo.name=spg", "algo.erpo_c=1.5").sampler == QSampler("spg", c=1.5)
    assert request(*chitchat, "algo.name=erpo_interpolation").sampler == QSampler("interpolation", 1.0,
                                                                                   (0.04, 0.0, 0.96))
    assert request("algo.name=ppo").sampler is None


@pytest.mark.parametrize("name", ["mixer", "mixer_ppo", "mixer_ppo_dynamic"])
def test_mixer_with_an_engine_of_its_own_is_refused_when_the_config_is_built(name):
    with pytest.raises(ConfigError, match=rf"algo\.name={name} forces reference prefixes .* rollout\.engine=vllm"):
        build_config(None, [f"algo.name={name}", "rollout.engine=vllm"])
    assert build_config(None, [f"algo.name={name}", "rollout.engine=builtin"]).rollout.engine == "builtin"
