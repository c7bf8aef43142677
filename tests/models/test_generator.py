"""Seq2SeqGRU phase methods (``logprobs``, ``sample``, ``first_step_logprobs``) and ValueBaseline.

Every batched routine is checked against a plain per-row loop: padding must not leak
into the encoder, batched decoding must equal one-row decoding, and the log-probs a rollout records
(π_old of Tuan et al. Eq. 3-4) must equal the teacher-forced ones the learner recomputes.
"""

from __future__ import annotations

import math

import pytest
import torch

from rayseq.models import Seq2SeqGRU, ValueBaseline

V, EMB, HID = 14, 16, 16
PAD, BOS, EOS = 0, 1, 2


def make_model(seed: int = 0, eos_bias: float | None = None) -> Seq2SeqGRU:
    torch.manual_seed(seed)
    model = Seq2SeqGRU(V, emb_dim=EMB, hidden_dim=HID, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    with torch.no_grad():
        model.out.weight.mul_(4.0)  # sharper than the default init, so rows disagree and argmax is stable
        if eos_bias is not None:
            model.out.bias[EOS] = eos_bias
    return model.eval()


def make_batch(seed: int = 0, B: int = 6, S: int = 7, filler: str = "garbage"):
    """Right-padded sources of varying lengths; positions >= src_len hold ``filler``."""
    g = torch.Generator().manual_seed(seed)
    src_len = torch.randint(1, S + 1, (B,), generator=g)
    src_len[0] = S  # a full row
    if B > 1:
        src_len[1] = 1  # and a one-token row
    src = torch.randint(4, V, (B, S), generator=g)
    pad = torch.arange(S)[None, :] >= src_len[:, None]
    # content beyond src_len must be ignored by the encoder (pack_padded_sequence); garbage proves it
    fill = torch.randint(4, V, (B, S), generator=g) if filler == "garbage" else torch.full((B, S), PAD)
    src = torch.where(pad, fill, src)
    return src, src_len


def test_logprobs_shapes_and_range():
    model = make_model()
    src, src_len = make_batch()
    tokens = torch.randint(3, V, (src.shape[0], 5))
    out = model.logprobs(src, src_len, tokens)
    B, T = tokens.shape
    assert out.logp.shape == (B, T)
    assert out.states.shape == (B, T, HID)
    assert out.logits.shape == (B, T, V)
    assert (out.logp <= 0).all()
    # logp is log_softmax(logits) at the given tokens
    expected = torch.log_softmax(out.logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(out.logp, expected)


@pytest.mark.parametrize("filler", ["garbage", "pad"])
def test_batched_logprobs_equal_per_row_on_unpadded_source(filler):
    model = make_model()
    src, src_len = make_batch(filler=filler)
    tokens = torch.randint(3, V, (src.shape[0], 5), generator=torch.Generator().manual_seed(1))
    batched = model.logprobs(src, src_len, tokens)
    for i in range(src.shape[0]):
        L = int(src_len[i])
        one = model.logprobs(src[i : i + 1, :L], src_len[i : i + 1], tokens[i : i + 1])
        torch.testing.assert_close(batched.logp[i], one.logp[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(batched.states[i], one.states[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(batched.logits[i], one.logits[0], atol=1e-5, rtol=0)


def test_first_step_logprobs_equal_logprobs_at_t1():
    model = make_model()
    src, src_len = make_batch()
    first = model.first_step_logprobs(src, src_len)
    assert first.shape == (src.shape[0], V)
    torch.testing.assert_close(first.exp().sum(-1), torch.ones(src.shape[0]))
    tokens = torch.randint(3, V, (src.shape[0], 4))
    out = model.logprobs(src, src_len, tokens)
    torch.testing.assert_close(first.gather(1, tokens[:, :1]).squeeze(1), out.logp[:, 0], atol=1e-5, rtol=0)


def _greedy_loop(model: Seq2SeqGRU, src_row: torch.Tensor, L: int, max_len: int) -> list[int]:
    """One row, unpadded: encode, then argmax step by step until EOS (kept) or max_len."""
    h = model.encode(src_row[None, :L], torch.tensor([L]))
    tok = torch.tensor([BOS])
    out: list[int] = []
    for _ in range(max_len):
        logits, _, h = model.decode_step(tok, h)
        nxt = logits.argmax(-1)
        out.append(int(nxt))
        if int(nxt) == EOS:
            break
        tok = nxt
    return out


def test_greedy_sample_equals_per_row_loop():
    # EOS bias chosen so that some rows stop early and others run to max_len (both paths exercised)
    model = make_model(seed=3, eos_bias=1.0)
    src, src_len = make_batch(seed=3, B=16)
    max_len = 6
    with torch.no_grad():
        s = model.sample(src, src_len, max_len, greedy=True)
        lengths = []
        for i in range(src.shape[0]):
            ref = _greedy_loop(model, src[i], int(src_len[i]), max_len)
            lengths.append(len(ref))
            n = len(ref)
            assert s.tokens[i, :n].tolist() == ref
            assert (s.tokens[i, n:] == PAD).all()
            assert s.token_mask[i].tolist() == [1.0] * n + [0.0] * (s.tokens.shape[1] - n)
            torch.testing.assert_close(s.action_mask[i], s.token_mask[i])
    assert min(lengths) < max_len and max(lengths) == max_len, lengths
    assert torch.equal(model.greedy(src, src_len, max_len), s.tokens)
    # logp recorded while decoding = teacher-forced logp of the same tokens, on real tokens
    tf = model.logprobs(src, src_len, s.tokens).logp
    torch.testing.assert_close(s.logp, tf * s.token_mask, atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logp_equals_teacher_forced(temperature):
    # the rollout's logp is always under the temperature-1 policy π_θ (what PPO's ratio needs)
    model = make_model(seed=1, eos_bias=1.0)
    src, src_len = make_batch(seed=1, B=32)
    g = torch.Generator().manual_seed(0)
    s = model.sample(src, src_len, 8, temperature=temperature, generator=g)
    assert (s.token_mask.sum(1) < s.tokens.shape[1]).any()  # some rows ended with EOS
    tf = model.logprobs(src, src_len, s.tokens).logp
    torch.testing.assert_close(s.logp, tf * s.token_mask, atol=1e-5, rtol=0)
    assert (s.logp[s.token_mask == 0] == 0).all()


def test_sampling_reproducible_with_generator_seed():
    model = make_model(seed=2)
    src, src_len = make_batch(seed=2, B=32)
    a = model.sample(src, src_len, 6, generator=torch.Generator().manual_seed(7))
    b = model.sample(src, src_len, 6, generator=torch.Generator().manual_seed(7))
    c = model.sample(src, src_len, 6, generator=torch.Generator().manual_seed(8))
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert not torch.equal(a.tokens, c.tokens)


def test_eos_ends_rows_invariants():
    # moderate EOS bias: rows end at different steps; after each row's first EOS everything is off
    model = make_model(seed=4, eos_bias=2.0)
    src, src_len = make_batch(seed=4, B=64)
    max_len = 8
    s = model.sample(src, src_len, max_len, generator=torch.Generator().manual_seed(0))
    T = s.tokens.shape[1]
    assert T <= max_len
    ends = []
    for i in range(src.shape[0]):
        row = s.tokens[i].tolist()
        n = row.index(EOS) + 1 if EOS in row else T
        ends.append(n)
        assert s.token_mask[i].tolist() == [1.0] * n + [0.0] * (T - n)
        assert s.action_mask[i].tolist() == [1.0] * n + [0.0] * (T - n)
        assert all(tok == PAD for tok in row[n:])
        assert (s.logp[i, n:] == 0).all() and (s.logp[i, :n] < 0).all()
    assert len(set(ends)) >= 3, ends  # rows really ended at different steps


def test_eos_bias_stops_after_forced_first_token():
    # out.bias makes EOS (almost) certain at every sampled step; the first token is forced, so rows end
    # at step 2 — except row 0 whose forced first token is EOS itself (ends at step 1)
    model = make_model(seed=5, eos_bias=50.0)
    src, src_len = make_batch(seed=5, B=4)
    prefix = torch.tensor([[EOS], [5], [6], [7]])
    s = model.sample(src, src_len, 6, prefix=prefix, prefix_len=1, generator=torch.Generator().manual_seed(0))
    assert s.tokens.tolist() == [[EOS, PAD], [5, EOS], [6, EOS], [7, EOS]]
    assert s.token_mask.tolist() == [[1, 0], [1, 1], [1, 1], [1, 1]]
    assert s.action_mask.tolist() == [[0, 0], [0, 1], [0, 1], [0, 1]]
    assert s.logp[0, 1] == 0 and s.logp[1:, 1].abs().max() < 1e-6  # log π(EOS) ≈ 0 under the bias


def test_prefix_forcing():
    model = make_model(seed=6, eos_bias=-1e4)  # no EOS: every row is alive for all max_len steps
    src, src_len = make_batch(seed=6, B=8)
    prefix = torch.randint(4, V, (8, 3), generator=torch.Generator().manual_seed(0))
    max_len = 5
    s = model.sample(src, src_len, max_len, prefix=prefix, prefix_len=2, generator=torch.Generator().manual_seed(1))
    assert s.tokens.shape == (8, max_len)
    assert torch.equal(s.tokens[:, :2], prefix[:, :2])
    assert (s.action_mask[:, :2] == 0).all() and (s.action_mask[:, 2:] == 1).all()
    assert (s.token_mask == 1).all()
    # forced tokens still carry their log-probs (MIXER's cross-entropy part uses them)
    tf = model.logprobs(src, src_len, s.tokens).logp
    torch.testing.assert_close(s.logp, tf, atol=1e-5, rtol=0)


def test_value_baseline_shape_and_detached_input():
    torch.manual_seed(0)
    baseline = ValueBaseline(HID)
    states = torch.randn(3, 5, HID, requires_grad=True)
    v = baseline(states)
    assert v.shape == (3, 5)
    assert (v == 0).all()  # zero-initialised: b = 0 before training
    v.sum().backward()
    assert states.grad is None  # the baseline's gradient never reaches the generator
    # ∂Σb/∂w = Σ_{b,t} s_{b,t}; ∂Σb/∂bias = B·T
    torch.testing.assert_close(baseline.linear.weight.grad[0], states.detach().sum((0, 1)))
    assert baseline.linear.bias.grad.item() == 15.0


def test_value_baseline_on_generator_states_leaves_generator_grads_empty():
    model = make_model()
    src, src_len = make_batch()
    out = model.logprobs(src, src_len, torch.randint(3, V, (src.shape[0], 4)))
    baseline = ValueBaseline(HID)
    ((baseline(out.states) - 1.0) ** 2).mean().backward()
    assert all(p.grad is None for p in model.parameters())
    assert baseline.linear.weight.grad is not None


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_first_token_distribution_matches_softmax(temperature):
    # N i.i.d. draws of y_1 for one fixed source: count_k ~ Binomial(N, p_k), standard error
    # √(p_k(1−p_k)/N) (≤ 0.0035 at N = 20000). A 5-SE band fails by chance with probability ~6e-7 per
    # token, ~1e-5 over 14 tokens (and the seed is fixed, so the test is deterministic anyway).
    model = make_model(seed=3)
    src, src_len = make_batch(seed=3, B=1)
    N = 20000
    first = model.first_step_logprobs(src, src_len)[0]  # log π(y_1 | x), (V,)
    p = torch.softmax(first / temperature, -1)  # log_softmax shifts logits by a constant
    # the fixture is a non-trivial distribution over the valid outputs (<pad> and <bos> have probability 0),
    # and temperature 2 visibly flattens it (max p 0.22 -> ~0.12)
    assert first.exp().max() > 0.2 and first.exp()[2:].min() > 0.01 and (first.exp()[:2] == 0).all()
    if temperature != 1.0:
        assert first.exp().max() - p.max() > 0.05
    s = model.sample(
        src.expand(N, -1), src_len.expand(N), 1, temperature=temperature,
        generator=torch.Generator().manual_seed(0),
    )
    freq = torch.bincount(s.tokens[:, 0], minlength=V).double() / N
    se = torch.sqrt(p.double() * (1 - p.double()) / N)
    assert (freq - p.double()).abs().le(5 * se + 1e-12).all(), (freq, p)
    # the recorded logp is the temperature-1 log-prob of the drawn token
    torch.testing.assert_close(s.logp[:, 0], first[s.tokens[:, 0]], atol=1e-5, rtol=0)
    # and the sample is not just the argmax
    assert freq.max() < 1.0 - 5 * math.sqrt(0.25 / N)


def test_pad_and_bos_are_never_valid_outputs_in_training_evaluation_and_serving():
    """<pad> and <bos> are masked in the policy's logits (Seq2SeqGRU._logits), the one place
    that teacher forcing (training), sampling (rollouts), greedy decoding (evaluation) and ``generate``
    (serving) take their logits from; so what is trained is what is served. Before, only ``generate``
    banned them: the trained policy put mass on them and rollouts could emit them."""
    model = make_model(seed=3)
    with torch.no_grad():
        model.out.bias[PAD] = 50.0  # raw logits that would make <pad> and <bos> the likeliest tokens
        model.out.bias[BOS] = 49.0
    src, src_len = make_batch(seed=3, B=32)
    B = src.shape[0]
    tokens = torch.randint(3, V, (B, 5), generator=torch.Generator().manual_seed(2))
    out = model.logprobs(src, src_len, tokens)  # training
    assert torch.isneginf(out.logits[..., [PAD, BOS]]).all()
    assert torch.isfinite(out.logp).all() and torch.isfinite(out.logits[..., 2:]).all()
    first = model.first_step_logprobs(src, src_len)
    assert (first[:, [PAD, BOS]].exp() == 0).all() and torch.allclose(first.exp().sum(-1), torch.ones(B))
    g = torch.Generator().manual_seed(0)
    for kwargs in ({"greedy": True}, {"temperature": 1.0}, {"temperature": 3.0}):  # evaluation, rollouts
        s = model.sample(src, src_len, 6, generator=g, **kwargs)
        real = s.token_mask > 0
        assert not torch.isin(s.tokens[real], torch.tensor([PAD, BOS])).any(), kwargs
        # the log-probs recorded while decoding are the trained policy's (teacher-forced) ones
        torch.testing.assert_close(s.logp, model.logprobs(src, src_len, s.tokens).logp * s.token_mask,
                                   atol=1e-5, rtol=0)
    served = model.generate(src, src_len, torch.full((B,), 6), torch.tensor([0.0, 1.0, 3.0, 1.0] * 8),
                            torch.tensor([0, 0, 0, 3] * 8), [torch.Generator().manual_seed(i) for i in range(B)])
    real = served.token_mask > 0
    assert not torch.isin(served.tokens[real], torch.tensor([PAD, BOS])).any()
    torch.testing.assert_close(served.logp, model.logprobs(src, src_len, served.tokens).logp * served.token_mask,
                               atol=1e-5, rtol=0)
    # a masked loss over padded targets stays finite: log-probs at <pad> positions are 0, not −inf
    padded = tokens.clone()
    padded[:, 3:] = PAD
    lp = model.logprobs(src, src_len, padded).logp
    assert (lp[:, 3:] == 0).all() and torch.isfinite(lp).all()
