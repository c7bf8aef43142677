"""The policy's log-probs of an engine's samples, computed by the learners (:func:`rayseq.algos.common.
behaviour_logprobs`): equal to what a rollout worker's own copy of the policy computed on the same weights (the
worker-side recomputation rollout.engine=vllm workers used to run), micro-batched or not; the truncated importance
weights against the engine's log-probs by hand; ``rollout.logp_correction`` and ``rollout.tis_cap`` through the
learner's update; the frame a vLLM worker keeps of the policy (names, shapes, ids; no weights).

The engine's rollouts are stood in for by the built-in engine's samples with ``logp`` removed and log-probs of the
"engine" put beside them (vLLM itself runs in tests/vllm, in its own environment)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from rayseq.algos.common import behaviour_logprobs
from rayseq.config import ConfigError, build_config
from rayseq.distributed.actors.learner import Learner
from rayseq.distributed.actors.worker import RolloutWorker
from rayseq.types import RolloutRequest


def hf_config(corpus, hf_dir, *extra):
    return build_config(None, ["task.name=pairs", f"task.data={corpus}", "model.arch=hf", f"model.path={hf_dir}",
                               "algo.name=grpo", "algo.group_size=2", "train.pretrain_iters=0", "progress=false",
                               "seed=0", *extra])


def engine_rollout(corpus, hf_dir, *extra, n=12):
    """A learner, a built-in worker holding its weights, a rollout the worker sampled, and that rollout as an engine's
    (``logp`` left to the learner, ``engine_logp`` the sampled log-probs)."""
    cfg = hf_config(corpus, hf_dir, *extra)
    learner, worker = Learner(cfg), RolloutWorker(cfg)
    learner.start_stage("train")
    worker.set_weights(learner.get_weights(), learner.version)
    prompts = learner.task.sample_prompts(np.random.default_rng(0), n)
    rollout = worker.sample(prompts, RolloutRequest(max_len=10, seed=3), score=False)
    assert rollout.token_mask.sum(1).min() >= 1 and rollout.token_mask.sum(1).max() > 1
    return learner, worker, rollout, dataclasses.replace(rollout, logp=None, engine_logp=rollout.logp.copy())


def worker_recomputation(worker, rollout) -> np.ndarray:
    """What a rollout worker computed beside an engine's samples before the learners did: its copy of the policy's
    teacher-forced log-probs of the sampled replies, times their mask."""
    src, src_len, tokens = (torch.from_numpy(a) for a in (rollout.src, rollout.src_len, rollout.tokens))
    with torch.no_grad():
        return (worker.generator.logprobs(src, src_len, tokens).logp * torch.from_numpy(rollout.token_mask)).numpy()


@pytest.mark.parametrize("micro", [[], ["learner.micro_batch_size=5"]])
def test_the_learners_log_probs_are_the_workers_recomputation(corpus, hf_dir, micro):
    learner, worker, sampled, rollout = engine_rollout(corpus, hf_dir, *micro)
    want = worker_recomputation(worker, sampled)
    learner.state.generator.train()  # as the update leaves it: the pass runs in evaluation mode and restores it
    metrics = behaviour_logprobs(learner.state, rollout, "tis", 2.0)
    assert learner.state.generator.training and metrics["time/behaviour_logp_s"] >= 0
    assert rollout.logp.dtype == np.float32 and rollout.logp.shape == want.shape
    np.testing.assert_allclose(rollout.logp, want, rtol=0, atol=1e-6)
    assert (rollout.logp[sampled.action_mask == 0] == 0).all()
    # the built-in engine's own log-probs are the same computation, token by token
    np.testing.assert_allclose(rollout.logp, sampled.logp, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="has neither"):
        behaviour_logprobs(learner.state, dataclasses.replace(rollout, logp=None, engine_logp=None), "tis", 2.0)


def test_truncated_importance_weights_by_hand(corpus, hf_dir):
    learner, _, sampled, rollout = engine_rollout(corpus, hf_dir)
    theirs = dataclasses.replace(rollout)
    behaviour_logprobs(learner.state, theirs, "tis", 2.0)  # the learner's log π_θ, which the engine's are set from
    rows, cols = np.nonzero(sampled.action_mask > 0)
    offsets = np.array([math.log(2.0), -math.log(3.0), 0.0, -math.log(1.5)], np.float32)
    # log π_engine = log π_θ + offset, so w = min(exp(log π_θ − log π_engine), 2) = min(exp(−offset), 2):
    # ln 2 -> 1/2; −ln 3 -> 3, capped at 2; 0 -> 1; −ln 1.5 -> 1.5; every unsampled position 1
    want = np.ones_like(sampled.logp)
    engine = theirs.logp.copy()
    for i, (r, c) in enumerate(zip(rows, cols)):
        engine[r, c] += offsets[i % 4]
        want[r, c] = [0.5, 2.0, 1.0, 1.5][i % 4]
    case = dataclasses.replace(rollout, engine_logp=engine, is_weights=None)
    behaviour_logprobs(learner.state, case, "tis", 2.0)
    np.testing.assert_allclose(case.is_weights, want, rtol=1e-5)
    off = dataclasses.replace(rollout, engine_logp=engine, is_weights=None)
    behaviour_logprobs(learner.state, off, "none", 2.0)  # rollout.logp_correction=none: log-probs, no weights
    assert off.is_weights is None and np.array_equal(off.logp, case.logp)


def test_the_update_computes_them_with_the_configured_correction(corpus, hf_dir):
    """Through the learner's update, as a run reaches it: rollout.tis_cap and rollout.logp_correction from the config;
    the mismatch metrics against the engine's log-probs; a built-in rollout untouched."""
    learner, worker, sampled, rollout = engine_rollout(corpus, hf_dir, "rollout.tis_cap=1.25")
    rollout.engine_logp = rollout.engine_logp - np.float32(0.5) * rollout.action_mask  # w = min(e^0.5, 1.25) = 1.25
    want = worker_recomputation(worker, sampled)
    metrics = learner.update_rollout(rollout, 0)
    np.testing.assert_allclose(rollout.logp, want, rtol=0, atol=1e-6)
    assert metrics["rollout/is_weight_mean"] == pytest.approx(1.25)
    assert metrics["rollout/logp_diff_mean"] == pytest.approx(0.5, abs=1e-6)
    assert "time/behaviour_logp_s" in metrics
    learner, _, sampled, rollout = engine_rollout(corpus, hf_dir, "rollout.logp_correction=none")
    metrics = learner.update_rollout(rollout, 0)
    assert rollout.is_weights is None and "rollout/is_weight_mean" not in metrics
    assert metrics["rollout/logp_diff_mean"] == pytest.approx(0.0, abs=1e-5)
    before = sampled.logp.copy()
    metrics = learner.update_rollout(sampled, 1)  # the built-in engine's: its own log-probs, nothing computed
    assert np.array_equal(sampled.logp, before) and "time/behaviour_logp_s" not in metrics


def test_the_frame_of_the_policy_has_its_names_and_ids_and_no_weights(corpus, hf_dir):
    from rayseq.models import make_generator
    from rayseq.models.hf import HFPolicyFrame
    from rayseq.tasks import make_task

    cfg = hf_config(corpus, hf_dir, "model.dtype=bfloat16")
    task = make_task(cfg.task, cfg.reward)
    policy, frame = make_generator(cfg, task), HFPolicyFrame.from_config(cfg, task)
    whole, shapes = policy.state_dict(), frame.state_dict()
    assert list(shapes) == list(whole)  # the names the weights travel under, tied weights once
    for name, t in shapes.items():
        assert t.device.type == "meta" and t.shape == whole[name].shape and t.dtype == torch.bfloat16, name
    assert (frame.vocab_size, frame.banned_ids, frame.separator) == (policy.vocab_size, policy.banned_ids,
                                                                     policy.separator)
    assert (frame.pad_id, frame.bos_id, frame.eos_id, frame.lora) == (policy.pad_id, policy.bos_id, policy.eos_id,
                                                                      False)
    with pytest.raises(ValueError, match="model.lora_r > 0"):
        HFPolicyFrame.from_config(hf_config(corpus, hf_dir, "model.lora_r=4"), task)


@pytest.mark.parametrize("name", ["scst", "spg", "erpo_interpolation"])
def test_samplers_on_the_workers_policy_refuse_an_engine_of_its_own(corpus, name):
    chitchat = ["task.name=chitchat", f"task.data={corpus}"]
    with pytest.raises(ConfigError, match=rf"algo\.name={name} .* rollout\.engine=vllm does not run"):
        build_config(None, [f"algo.name={name}", "rollout.engine=vllm", *chitchat])
    assert build_config(None, [f"algo.name={name}", *chitchat]).rollout.engine == "builtin"
