"""``model.dtype=bfloat16``: bf16 compute with fp32 master weights and optimizer state on the learner, bf16 copies
where the policy only samples (rollout workers, the published weights, the KL reference), and log-probs and losses in
fp32 from the bf16 logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayseq.distributed.actors.learner import Learner
from rayseq.distributed.actors.worker import RolloutWorker
from rayseq.distributed.weights.flat import FlatWeights
from rayseq.types import RolloutRequest
from tests.conftest import tiny_config


def _pair(*overrides):
    cfg = tiny_config(*overrides)
    learner, worker = Learner(cfg), RolloutWorker(cfg)
    learner.start_stage("train")
    worker.set_weights(learner.get_flat_weights(), learner.version)
    return learner, worker


@pytest.mark.parametrize("arch", ["rnn", "transformer"])
def test_bf16_where_it_samples_fp32_where_it_learns(arch):
    learner, worker = _pair(f"model.arch={arch}", "model.dtype=bfloat16", "algo.name=ppo", "algo.kl_coef=0.1")
    # the worker's copy and what is published: bf16 (half the bytes of fp32)
    assert {p.dtype for p in worker.generator.parameters()} == {torch.bfloat16}
    published = learner.get_flat_weights()
    fp32 = FlatWeights.pack({"generator": learner.state.generator.state_dict()})
    assert {spec[2] for spec in published.spec if spec[1]} == {"bfloat16"}
    assert published.data.nbytes <= fp32.data.nbytes // 2 + 64 * len(published.spec)
    # the learner's master weights and the KL reference
    assert {p.dtype for p in learner.state.generator.parameters()} == {torch.float32}
    assert {p.dtype for p in learner.algo.modules["ref_policy"].parameters()} == {torch.bfloat16}
    prompts = learner.task.sample_prompts(np.random.default_rng(0), 32)
    rollout = worker.sample(prompts, RolloutRequest(max_len=learner.task.max_tgt_len, seed=1))
    assert rollout.logp.dtype == np.float32 and np.isfinite(rollout.logp).all() and (rollout.logp <= 0).all()
    before = {k: v.clone() for k, v in learner.state.generator.state_dict().items()}
    m = learner.update(rollout, 0)
    assert all(np.isfinite(v) for v in m.values() if isinstance(v, float))
    assert any(not torch.equal(before[k], v) for k, v in learner.state.generator.state_dict().items())
    states = [t for st in learner.state.gen_opt.state.values() for t in st.values() if t.dim() > 0]
    assert states and {t.dtype for t in states} == {torch.float32}  # Adam's moments stay fp32


def test_bf16_computes_what_fp32_computes_to_bf16_precision():
    """The same batch through a bf16 and an fp32 learner: the update's loss and log-probs agree to bf16's ~3 digits
    (what would differ by more is a computation left in bf16 that should be fp32, or a cast missing)."""
    runs = {}
    for dtype in ("float32", "bfloat16"):
        learner, worker = _pair("algo.name=ppo", f"model.dtype={dtype}")
        prompts = learner.task.sample_prompts(np.random.default_rng(0), 32)
        runs[dtype] = (learner, prompts)
    fp32, bf16 = runs["float32"][0], runs["bfloat16"][0]
    _, worker = _pair("algo.name=ppo")  # one rollout for both: the fp32 worker's
    rollout = worker.sample(runs["float32"][1], RolloutRequest(max_len=fp32.task.max_tgt_len, seed=1))
    rollout.score = np.linspace(0, 1, len(rollout)).astype(np.float32)
    rollout.rewards[:] = 0
    rollout.rewards[np.arange(len(rollout)), np.maximum(rollout.token_mask.sum(1).astype(int) - 1, 0)] = rollout.score
    m32, m16 = fp32.update(rollout.rows(np.arange(len(rollout))), 0), bf16.update(rollout, 0)
    for k in ("loss/policy", "loss/value", "policy/ratio_mean"):
        assert m16[k] == pytest.approx(m32[k], rel=2e-2, abs=2e-3), k
