"""The gradient pass bounded by its micro-batch: log-probs and entropies through the head a chunk of positions at a
time (rayseq.models.chunked) equal the unchunked pass, with the same gradients; a PPO-family update that accumulates
its gradients over micro-batches (``learner.micro_batch_size``) makes the update of one pass; and the chunked pass
never allocates the (B·T, V) logits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from benchmarks.learner_memory import allocations
from rayseq.algos.common import LearnerState, micro_batch_rows, micro_batches
from rayseq.losses.menu import token_entropy
from rayseq.models.chunked import chunked_token_logprobs, entropy_of_logits, positions_per_chunk
from tests.algos.test_no_grad_passes import _learner_and_rollout

TOL = {"rtol": 1e-5, "atol": 1e-6}  # float sums in another order


def _head(H: int, V: int, banned: tuple[int, ...] = (), seed: int = 0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(H, V, bias=False)
    bias = torch.zeros(V)
    bias[list(banned)] = float("-inf")
    return lin, (lambda h: lin(h).float() + bias)


def _direct(head, states, tokens, pad_id):
    logits = head(states)
    logp = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.where(tokens == pad_id, 0.0, logp), token_entropy(logits)


def test_chunked_log_probs_by_hand():
    # a zero head: every logit 0, so π is uniform over the V = 4 ids less the banned one (id 3): log π = −log 3 and
    # H = log 3 at every position; the pad id (0) gets log-prob 0
    lin, head = _head(2, 4, banned=(3,))
    torch.nn.init.zeros_(lin.weight)
    states = torch.randn(2, 3, 2)
    tokens = torch.tensor([[1, 2, 0], [2, 1, 1]])
    for chunk in (1, 2, 6):
        logp, ent = chunked_token_logprobs(head, states, tokens, 0, chunk, entropy=True)
        want = torch.full((2, 3), -math.log(3.0))
        want[0, 2] = 0.0
        torch.testing.assert_close(logp, want)
        torch.testing.assert_close(ent, torch.full((2, 3), math.log(3.0)))
    assert chunked_token_logprobs(head, states, tokens, 0, 2)[1] is None  # entropy only when asked
    assert positions_per_chunk(128_256) == 261 and positions_per_chunk(10, elements=5) == 1


@pytest.mark.parametrize("chunk", [1, 4, 7, 100])
def test_chunked_equals_unchunked_values_and_gradients(chunk):
    """logp, entropy and the gradients of a loss of both (states' and the head's) within 1e-6, for chunks that split
    rows, do not divide B·T, or hold everything."""
    B, T, H, V = 3, 5, 6, 11
    lin, head = _head(H, V, banned=(0, 4))
    states = torch.randn(B, T, H, requires_grad=True)
    tokens = torch.randint(1, V, (B, T))
    tokens[tokens == 4] = 5
    tokens[2, 3:] = 0  # padding
    a, c = torch.randn(B, T), torch.randn(B, T)
    grads = []
    for fn in (lambda: _direct(head, states, tokens, 0),
               lambda: chunked_token_logprobs(head, states, tokens, 0, chunk, entropy=True)):
        logp, ent = fn()
        grads.append((logp.detach(), ent.detach(), *torch.autograd.grad((a * logp + c * ent).sum(),
                                                                        (states, lin.weight))))
    for x, y in zip(*grads):
        torch.testing.assert_close(x, y, **TOL)
    torch.testing.assert_close(entropy_of_logits(head(states)), token_entropy(head(states)), rtol=0, atol=0)


def test_the_chunked_pass_never_allocates_the_whole_logits():
    """Forward and backward of the log-probs and entropies of 512 positions at V = 4,096: directly the largest
    allocation is the (512, V) logits or more; in chunks of 32 positions it is a chunk's, whatever B·T."""
    B, T, H, V = 4, 128, 16, 4096
    lin, head = _head(H, V)
    tokens = torch.randint(0, V, (B, T))
    whole = B * T * V * 4  # bytes of the fp32 logits

    def run(fn):
        states = torch.randn(B, T, H, requires_grad=True)
        logp, ent = fn(states)
        (logp.sum() + ent.sum()).backward()

    _, direct = allocations(lambda: run(lambda s: _direct(head, s, tokens, -1)))
    _, chunked = allocations(lambda: run(lambda s: chunked_token_logprobs(head, s, tokens, -1, 32, entropy=True)))
    assert direct >= whole
    assert chunked <= 32 * V * 4 < whole // 8


def test_micro_batch_rows():
    gen = torch.nn.Linear(1, 1)
    state = LearnerState(generator=gen, gen_opt=None, device="cpu")
    assert micro_batch_rows(state, 100) is None  # a built-in model: the whole batch
    gen.micro_batch_tokens = 1000  # a policy that bounds its passes (HF: 16,384 positions)
    assert micro_batch_rows(state, 100) == 10 and micro_batch_rows(state, 5000) == 1
    assert micro_batch_rows(LearnerState(generator=gen, gen_opt=None, device="cpu", micro_batch=3), 100) == 3
    idx = torch.arange(7)
    assert [p.tolist() for p in micro_batches(idx, 3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [p.tolist() for p in micro_batches(idx, None)] == [idx.tolist()]


def _assert_same_update(runs, modules=("baseline",), atol=1e-6):
    (a, ma), (b, mb) = runs
    for part in ("generator", *modules):
        sa, sb = ((x.state.generator if part == "generator" else x.algo.modules[part]).state_dict() for x in (a, b))
        for k in sa:
            torch.testing.assert_close(sa[k], sb[k], rtol=1e-5, atol=atol,
                                       msg=lambda m, k=k, part=part: f"{part}.{k}: {m}")
    for k in ma:  # explained variance, a ratio of means, is the parts' weighted average (rayseq.algos.parallel)
        if not k.startswith("time/") and k != "value/explained_variance":
            assert mb[k] == pytest.approx(ma[k], rel=1e-5, abs=1e-6), k


ACCUMULATED = {
    "ppo": ("algo.name=ppo",),
    "ppo_dynamic_entropy": ("algo.name=ppo_dynamic", "algo.entropy_coef=0.05"),
    "grpo_per_reply": ("algo.name=grpo", "algo.group_size=4", "algo.loss_type=grpo"),
    "ppo_top_entropy": ("algo.name=ppo", "algo.top_entropy_quantile=0.5", "algo.entropy_coef=0.01"),
}


@pytest.mark.parametrize("case", ACCUMULATED)
def test_accumulated_micro_batches_make_the_update_of_one_pass(case):
    """Minibatches of 8 rows through the policy 3 rows at a time (3 + 3 + 2), gradients accumulated, each loss scaled
    by its share of the minibatch's denominator (tokens or replies, the entropy bonus's tokens, the value's): the
    generator's and the value baseline's weights after the update, and its metrics, are the one-pass update's."""
    common = (*ACCUMULATED[case], "algo.minibatch_size=8", "algo.epochs=2")
    runs = []
    for micro in ([], ["learner.micro_batch_size=3"]):
        learner, rollout = _learner_and_rollout(*common, *micro, n=16)
        runs.append((learner, learner.update(rollout, 0)))
    assert runs[1][0].state.micro_batch == 3
    _assert_same_update(runs, () if case.startswith("grpo") else ("baseline",))


def test_hf_chunked_pass_equals_logprobs(corpus, hf_dir):
    """An HF policy's chunked pass (the head on the reply's positions, 5 at a time, recomputed in backward) against
    its logprobs (the head on every position): log-probs, entropies and every parameter's gradient within 1e-6; a pass
    that fits one chunk is logprobs' arithmetic exactly."""
    from rayseq.config import build_config
    from rayseq.models import make_generator
    from rayseq.tasks import make_task

    cfg = build_config(None, ["task.name=pairs", f"task.data={corpus}", "model.arch=hf", f"model.path={hf_dir}"])
    task = make_task(cfg.task, cfg.reward)
    gen = make_generator(cfg, task)
    prompts = task.sample_prompts(np.random.default_rng(0), 4)
    src, src_len = torch.from_numpy(prompts.src), torch.from_numpy(prompts.src_len)
    tokens = gen.sample(src, src_len, 7, generator=torch.Generator().manual_seed(0)).tokens
    a, c = torch.randn(tokens.shape), torch.randn(tokens.shape)
    params = [p for p in gen.parameters() if p.requires_grad]
    results = []
    for chunk in (None, 5):
        if chunk is None:
            out = gen.logprobs(src, src_len, tokens)
            ent = token_entropy(out.logits)
        else:
            out = gen.chunked_logprobs(src, src_len, tokens, entropy=True, chunk=chunk)
            assert out.logits is None
            ent = out.entropy
        g = torch.autograd.grad((a * out.logp + c * ent).sum(), params)
        results.append((out.logp.detach(), ent.detach(), *g))
    for x, y in zip(*results):
        torch.testing.assert_close(x, y, **TOL)
    small = gen.chunked_logprobs(src, src_len, tokens, entropy=True)  # fits one pass: logprobs' own arithmetic
    assert torch.equal(small.logp, results[0][0]) and torch.equal(small.entropy, results[0][1])


def test_hf_accumulated_chunked_update_equals_one_pass(corpus, hf_dir, monkeypatch):
    """A PPO update of an HF policy with the KL reference and the entropy bonus: one pass (the defaults, which fit one
    chunk) against micro-batches of 3 rows whose head runs on the reply's positions 4 at a time (``logit_elements``
    lowered so no pass fits one chunk): the same gradients at each step (within 1e-6), weights and metrics. Adam's
    first steps divide each gradient element by its own magnitude, so an element near 0 turns rounding into a step
    difference of up to the learning rate's order: the weights are compared at 1e-5."""
    import rayseq.algos.ppo as ppo

    hf = ("task.name=pairs", f"task.data={corpus}", "model.arch=hf", f"model.path={hf_dir}", "algo.name=ppo",
          "algo.kl_coef=0.05", "algo.entropy_coef=0.01", "algo.minibatch_size=8")
    runs, grads = [], []
    step = ppo.apply_gradients

    def recording(opt, params, max_grad_norm, dp=None):
        params = list(params)
        grads[-1].append([None if p.grad is None else p.grad.clone() for p in params])
        return step(opt, params, max_grad_norm, dp)

    monkeypatch.setattr(ppo, "apply_gradients", recording)
    for micro in ([], ["learner.micro_batch_size=3"]):
        learner, rollout = _learner_and_rollout(*hf, *micro, n=8)
        if micro:
            for m in (learner.state.generator, learner.algo.modules["ref_policy"]):
                m.logit_elements = 4 * m.vocab_size
        grads.append([])
        runs.append((learner, learner.update(rollout, 0)))
    assert len(grads[0]) == len(grads[1]) == 2  # one minibatch: the generator's step, the baseline's
    for ga, gb in zip(*grads):
        for x, y in zip(ga, gb):
            assert (x is None) == (y is None)
            if x is not None:
                torch.testing.assert_close(x, y, **TOL)
    _assert_same_update(runs, atol=1e-5)
