"""The learner's passes without gradients (the value baseline's inputs, the KL reference's log-probs) in row
micro-batches (``learner.micro_batch_size``): chunked = unchunked, the update itself unchanged, and the largest tensor
they allocate bounded by the micro-batch, not the batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.learner_memory import allocations
from rayseq.algos.common import LearnerState, policy_pass, rollout_tensors, without_grad
from rayseq.algos.parallel import rows_without_grad
from rayseq.distributed.actors.learner import Learner
from rayseq.distributed.actors.worker import RolloutWorker
from rayseq.models.protocol import lean_logprobs
from rayseq.types import RolloutRequest
from tests.conftest import tiny_config

TOL = {"rtol": 1e-5, "atol": 1e-6}  # the same rows in batches of another size: float sums in another order


def test_rows_without_grad_by_hand():
    # f(rows) = (2·row, row²) for rows 0..9, three rows at a time: the same as all ten at once, and no gradient
    w = torch.ones((), requires_grad=True)

    def fn(rows):
        return (2.0 * rows.float() * w, rows**2)

    whole = rows_without_grad(fn, 10)
    parts = rows_without_grad(fn, 10, micro_batch=3)
    assert torch.equal(whole[0], torch.arange(10) * 2.0) and torch.equal(whole[1], torch.arange(10) ** 2)
    assert all(torch.equal(a, b) for a, b in zip(whole, parts)) and not parts[0].requires_grad


def _learner_and_rollout(*overrides, n=24):
    cfg = tiny_config(*overrides)
    learner, worker = Learner(cfg), RolloutWorker(cfg)
    learner.start_stage("train")
    worker.set_weights(learner.get_weights(), learner.version)
    prompts = learner.task.sample_prompts(np.random.default_rng(0), n)
    rollout = worker.sample(prompts, RolloutRequest(max_len=learner.task.max_tgt_len, seed=4))
    rollout.score = np.linspace(0, 1, n).astype(np.float32)  # rewards of every size, on each reply's last token
    rollout.rewards = np.zeros_like(rollout.rewards)
    rollout.rewards[np.arange(n), np.maximum(rollout.token_mask.sum(1).astype(int) - 1, 0)] = rollout.score
    return learner, rollout


@pytest.mark.parametrize("arch", ["rnn", "transformer"])
def test_baseline_and_reference_passes_in_micro_batches_equal_one_pass(arch):
    learner, rollout = _learner_and_rollout(f"model.arch={arch}", "algo.name=ppo")
    s = learner.state
    b = rollout_tensors(rollout, s.device, 1.0)

    def values_and_logp(src, src_len, tokens, lean):
        logp, states = policy_pass(s.generator, src, src_len, tokens, lean)
        return learner.algo.modules["baseline"](states), logp

    whole = without_grad(s, values_and_logp, b.src, b.src_len, b.tokens)
    chunked = without_grad(LearnerState(**{**s.__dict__, "micro_batch": 5}), values_and_logp, b.src, b.src_len,
                           b.tokens)
    for a, c in zip(whole, chunked):
        torch.testing.assert_close(a, c, **TOL)


@pytest.mark.parametrize("ratio_to", ["behaviour", "proximal"])
def test_a_ppo_update_with_micro_batches_equals_one_without(ratio_to):
    """The update itself: the baseline's values from micro-batches of 5 rows, the KL reference's log-probs too (and,
    with algo.ratio_to=proximal, π_prox's); the generator's and the baseline's weights after the update equal the
    one-pass learner's."""
    common = ("algo.name=ppo", "algo.kl_coef=0.1", "algo.minibatch_size=8", f"algo.ratio_to={ratio_to}")
    learners = []
    for micro in ([], ["learner.micro_batch_size=5"]):
        learner, rollout = _learner_and_rollout(*common, *micro)
        metrics = learner.update(rollout, 0)
        learners.append((learner, metrics))
    (a, ma), (b, mb) = learners
    assert b.state.micro_batch == 5 and a.state.micro_batch is None
    for part in ("generator", "baseline"):  # the value baseline is the algorithm's
        sa, sb = ((x.state.generator if part == "generator" else x.algo.modules[part]).state_dict() for x in (a, b))
        for k in sa:
            torch.testing.assert_close(sa[k], sb[k], **TOL, msg=f"{part}.{k}")
    keys = ["loss/policy", "loss/value", "kl/per_reply", "policy/advantage_mean"]
    if ratio_to == "proximal":
        keys += ["policy/behaviour_weight_mean", "policy/behaviour_weight_max"]
    for k in keys:
        assert ma[k] == pytest.approx(mb[k], rel=1e-4, abs=1e-6), k


def test_hf_lean_log_probs_equal_the_full_pass(corpus, hf_dir):
    from rayseq.config import build_config
    from rayseq.models import make_generator
    from rayseq.tasks import make_task

    cfg = build_config(None, ["task.name=pairs", f"task.data={corpus}", "model.arch=hf", f"model.path={hf_dir}"])
    task = make_task(cfg.task, cfg.reward)
    gen = make_generator(cfg, task).eval()
    prompts = task.sample_prompts(np.random.default_rng(0), 6)
    out = gen.sample(torch.from_numpy(prompts.src), torch.from_numpy(prompts.src_len), 9,
                     generator=torch.Generator().manual_seed(0))
    src, src_len = torch.from_numpy(prompts.src), torch.from_numpy(prompts.src_len)
    with torch.no_grad():
        full = gen.logprobs(src, src_len, out.tokens)
        logp, states = lean_logprobs(gen, src, src_len, out.tokens)  # the head 64 positions at a time
        logp2, _ = gen.lean_logprobs(src, src_len, out.tokens, chunk=2)  # ... and 2 at a time
    assert torch.equal(states, full.states)
    torch.testing.assert_close(logp, full.logp, **TOL)
    torch.testing.assert_close(logp2, full.logp, **TOL)


def test_the_largest_allocation_is_bounded_by_the_micro_batch(corpus, hf_dir):
    """The KL reference's pass on an HF policy: one pass over 64 replies allocates (64, T, V) logits (and
    log-softmax) tensors; in micro-batches of 4 rows with the lean pass the largest allocation is the size of 4 rows'
    hidden states or a few positions' logits, whatever the batch."""
    from rayseq.config import build_config
    from rayseq.models import make_generator
    from rayseq.tasks import make_task

    cfg = build_config(None, ["task.name=pairs", f"task.data={corpus}", "model.arch=hf", f"model.path={hf_dir}"])
    task = make_task(cfg.task, cfg.reward)
    gen = make_generator(cfg, task).eval()
    T, V = 24, gen.vocab_size
    largest = {}
    for n in (16, 64):
        prompts = task.sample_prompts(np.random.default_rng(0), n)
        src, src_len = torch.from_numpy(prompts.src), torch.from_numpy(prompts.src_len)
        tokens = torch.randint(3, V, (n, T), generator=torch.Generator().manual_seed(1))
        for micro in (None, 4):
            state = LearnerState(generator=gen, gen_opt=None, device="cpu",
                                 micro_batch=micro)

            def reference(s, sl, t, lean):
                return (policy_pass(gen, s, sl, t, lean)[0],)

            _, largest[n, micro] = allocations(lambda state=state, s=src, sl=src_len, t=tokens: without_grad(
                state, reference, s, sl, t))
    full_logits = 4 * T * V  # bytes of one row's fp32 logits
    assert largest[64, None] >= 64 * full_logits > largest[64, 4]  # the whole batch's logits, then a micro-batch's
    assert largest[64, 4] == largest[16, 4] <= 4 * full_logits  # bounded by the micro-batch, not the batch
