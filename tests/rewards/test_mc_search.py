"""Monte-Carlo search (SeqGAN Eq. 4): the batched cached search against the plain per-prefix loop, the
inverse-CDF sampler against torch.multinomial, and Q assembly by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rayseq.models.generator import Seq2SeqGRU
from rayseq.models.sampling import BLOCK, inverse_cdf_sample, sample_projected, sample_with_logp
from rayseq.rewards.mc_search import draw_uniforms, mc_search, mc_search_loop, q_values

V, PAD, BOS, EOS = 12, 0, 1, 2


def _model(cell: str, conditional: bool, banned=()) -> Seq2SeqGRU:
    torch.manual_seed(0)
    m = Seq2SeqGRU(V, emb_dim=8, hidden_dim=8, cell=cell, conditional=conditional, banned_ids=banned)
    return m.double().eval()  # float64: batched and per-row matmuls agree to far below a cdf gap


@pytest.mark.parametrize("cell,conditional,banned", [("lstm", False, (0, 1, 2, 3)), ("gru", True, ())])
def test_batched_search_equals_plain_loop_under_shared_uniforms(cell, conditional, banned):
    # exact comparison: both draw position p of continuation n of prefix t from the same U[b, t−1, n, p]
    model = _model(cell, conditional, banned)
    B, T, N = 5, 7, 3
    src = torch.randint(4, V, (B, 4))
    src_len = torch.tensor([4, 1, 3, 2, 4])
    g = torch.Generator().manual_seed(1)
    s = model.sample(src, src_len, T, generator=g)
    tokens, mask = s.tokens, s.token_mask
    if tokens.shape[1] < T:  # every row ended early; pad to T
        tokens = torch.nn.functional.pad(tokens, (0, T - tokens.shape[1]))
        mask = torch.nn.functional.pad(mask, (0, T - mask.shape[1]))
    u = draw_uniforms(B, T, N, torch.Generator().manual_seed(2)).double()
    batched = mc_search(model, src, src_len, tokens, mask, N, u=u)
    looped, _ = mc_search_loop(model, src, src_len, tokens, mask, N, u=u)
    assert torch.equal(batched.tokens, looped.tokens)
    assert torch.equal(batched.lengths, looped.lengths)
    # each continuation keeps its prefix
    for t in range(1, T):
        assert torch.equal(batched.tokens[:, t - 1, :, :t], tokens[:, None, :t].expand(B, N, t))
    if banned:  # the oracle setting: fixed length, never a special token
        assert (batched.tokens >= 4).all() and (batched.lengths == T).all()


def _sampled(model, src, src_len, T: int, seed: int):
    """Replies sampled by ``model``, padded to T columns: tokens, token mask, lengths."""
    s = model.sample(src, src_len, T, generator=torch.Generator().manual_seed(seed))
    tokens = torch.nn.functional.pad(s.tokens, (0, T - s.tokens.shape[1]))
    mask = torch.nn.functional.pad(s.token_mask, (0, T - s.token_mask.shape[1]))
    return tokens, mask, mask.sum(1).long()


def test_search_with_end_tokens_only_searches_open_prefixes():
    model = _model("gru", True)
    with torch.no_grad():
        model.out.bias[EOS] = 2.0  # end often
    B, T, N = 16, 6, 2
    src, src_len = torch.randint(4, V, (B, 3)), torch.full((B,), 3)
    tokens, mask, lengths = _sampled(model, src, src_len, T, seed=0)
    assert (lengths < T).any()
    c = mc_search(model, src, src_len, tokens, mask, N, generator=torch.Generator().manual_seed(3))
    for b in range(B):
        for t in range(1, T):
            for n in range(N):
                row, L = c.tokens[b, t - 1, n], int(c.lengths[b, t - 1, n])
                if t >= lengths[b]:  # closed prefix: the sequence itself
                    assert torch.equal(row, tokens[b]) and L == lengths[b]
                else:  # ends at its first EOS (or T), pad after
                    assert (row[L:] == PAD).all() and (row[: L - 1] != EOS).all()
                    assert L == T or row[L - 1] == EOS


def test_inverse_cdf_matches_multinomial_distribution():
    # chi-square test at a fixed seed: 200k draws from one categorical with a banned (−inf) entry
    logits = torch.tensor([[0.5, -1.0, 2.0, float("-inf"), 0.0, 1.0, -3.0]]).expand(200_000, -1)
    p = torch.softmax(logits[0], -1).numpy()
    ours = inverse_cdf_sample(logits, torch.rand(200_000, generator=torch.Generator().manual_seed(0)))
    ref = torch.multinomial(torch.softmax(logits, -1), 1, generator=torch.Generator().manual_seed(0)).squeeze(1)
    for draws in (ours, ref):
        counts = np.bincount(draws.numpy(), minlength=7)
        assert counts[3] == 0  # never a zero-probability token
        keep = p > 0
        expected = p[keep] * len(draws)
        chi2 = float((((counts[keep] - expected) ** 2) / expected).sum())
        assert chi2 < 20.5  # 99.9% quantile of chi-square with 5 degrees of freedom
    # one uniform picks the same token every time, from the cdf: u just below / above a boundary
    cdf = np.cumsum(p)
    u = torch.tensor([0.0, cdf[0] - 1e-6, cdf[0] + 1e-6, cdf[2] + 1e-6, 1 - 1e-9], dtype=torch.float64)
    got = inverse_cdf_sample(logits[:5].double(), u).tolist()
    assert got == [0, 0, 1, 4, 6]


@pytest.mark.parametrize("vocab", [12, BLOCK, BLOCK + 1, 1000])  # one short block, one full, a short last block
def test_sample_projected_equals_inverse_cdf_on_the_logits(vocab):
    # the fused two-level sampler against sample_with_logp on the materialised logits, same u, float64 (the cdf's
    # summation order differs, far below any gap between u and a cdf entry here); banned ids (the last one
    # included) never come out, also for u next to 1, where u·total rounds up to the total
    g = torch.Generator().manual_seed(vocab)
    R, H = 2000, 6
    h, W, b = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((R, H), (vocab, H), (vocab,)))
    b[torch.randperm(vocab, generator=g)[: vocab // 5]] = float("-inf")
    b[-1] = float("-inf")
    u = torch.rand(R, generator=g, dtype=torch.float64)
    u[:3] = torch.tensor([0.0, 1 - 1e-16, 0.5])
    for temp in (1.0, 0.7):
        y = sample_projected(h, W, b, u, temp)
        ref, _ = sample_with_logp((h @ W.t() + b) / temp, u)
        assert torch.equal(y, ref)
        assert not torch.isneginf(b[y]).any()
    near_one = sample_projected(h.float(), W.float(), b.float(), torch.full((R,), 1 - 1e-8))
    assert not torch.isneginf(b[near_one]).any()


def test_sample_with_logp_returns_policy_logp_at_any_temperature():
    logits = torch.randn(300, 50)
    for temp in (1.0, 0.6):
        y, lp = sample_with_logp(logits, torch.rand(300), temp)
        ref = torch.log_softmax(logits, -1).gather(1, y[:, None]).squeeze(1)
        assert torch.allclose(lp, ref, atol=1e-5)


def test_q_values_by_hand():
    # B = 2, T = 3, N = 2. Row 0 has length 3: Q_1 = mean(0.2, 0.4) = 0.3, Q_2 = mean(0.6, 1.0) = 0.8,
    # Q_3 = D(Y) = 0.9. Row 1 has length 2: Q_1 = mean(0.1, 0.3) = 0.2, Q_2 = Q_3 = D(Y) = 0.5.
    d_cont = torch.tensor([[[0.2, 0.4], [0.6, 1.0]], [[0.1, 0.3], [0.7, 0.7]]])
    d_full = torch.tensor([0.9, 0.5])
    q = q_values(d_cont, d_full, torch.tensor([3, 2]))
    assert torch.allclose(q, torch.tensor([[0.3, 0.8, 0.9], [0.2, 0.5, 0.5]]))


def test_q_estimates_converge_to_exact_expectation():
    # statistical check of Eq. 4 with a D whose expectation is computable: D(Y) = 1 if y_T == 5.
    # For the last prefix (t = T − 1), Q = P(y_T = 5 | prefix) exactly, from the policy's softmax.
    model = _model("lstm", False, (0, 1, 2, 3)).float()
    B, T, N = 4, 4, 4000
    empty = torch.zeros(B, 0, dtype=torch.long)
    s = model.sample(empty, torch.zeros(B, dtype=torch.long), T, generator=torch.Generator().manual_seed(0))
    c = mc_search(model, empty, torch.zeros(B, dtype=torch.long), s.tokens, s.token_mask, N,
                  generator=torch.Generator().manual_seed(1))
    d = (c.tokens[..., -1] == 5).float()
    q = q_values(d, (s.tokens[:, -1] == 5).float(), torch.full((B,), T))
    exact = torch.softmax(model.logprobs(empty, torch.zeros(B, dtype=torch.long), s.tokens).logits[:, -1], -1)[:, 5]
    se = torch.sqrt(exact * (1 - exact) / N)
    assert (torch.abs(q[:, T - 2] - exact) < 4 * se + 1e-6).all(), (q[:, T - 2], exact)
    assert math.isclose(float(q[:, T - 1].sum()), float((s.tokens[:, -1] == 5).sum()))


def test_prefix_shared_d_equals_d_on_each_continuation():
    # D's prefix-shared scoring of the search's output (the scorer's path) against D on every continuation
    # (the plain loop's): sequences that end early (closed prefixes hold the sequence itself), conditional input
    from rayseq.models.discriminator import CNNDiscriminator

    model = _model("gru", True).float()
    with torch.no_grad():
        model.out.bias[EOS] = 1.5
    B, T, N = 6, 8, 3
    src, src_len = torch.randint(4, V, (B, 3)), torch.tensor([3, 0, 1, 2, 3, 3])
    tokens, mask, lengths = _sampled(model, src, src_len, T, seed=4)
    assert (lengths < T).any()
    c = mc_search(model, src, src_len, tokens, mask, N, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    disc = CNNDiscriminator(V, emb_dim=8, filter_sizes=(1, 2, 4, 10), num_filters=(3, 3, 3, 3))
    ref = disc.score(c.tokens.reshape(-1, T), c.lengths.reshape(-1), src.repeat_interleave((T - 1) * N, 0),
                     src_len.repeat_interleave((T - 1) * N, 0)).view(B, T - 1, N)
    got = disc.score_shared_prefix(tokens, lengths, c.tokens, c.lengths, torch.arange(1, T), src, src_len)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
