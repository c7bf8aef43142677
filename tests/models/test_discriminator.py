"""SeqGAN's CNN discriminator and its loss (Eq. 5): hand-computed losses, masking and packing checked
against plain per-row loops, a tiny separation task."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import rayseq.models.discriminator as discriminator_module
from rayseq.losses.discriminator import DiscStats, discriminator_loss
from rayseq.models.discriminator import CNNDiscriminator, build_discriminator

PAD, SEP, V = 0, 1, 12
SMALL = dict(emb_dim=8, filter_sizes=(1, 2, 3, 5), num_filters=(4, 3, 3, 2), pad_id=PAD, sep_id=SEP)


def small_model(seed: int = 0, **kw) -> CNNDiscriminator:
    torch.manual_seed(seed)
    return CNNDiscriminator(V, **{**SMALL, **kw})


def random_batch(B: int, T: int, min_len: int = 0, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens (B, T) in [2, V) with *garbage* (not pad) after each row's length, lengths (B,)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, V, (B, T), generator=g)
    lengths = torch.randint(min_len, T + 1, (B,), generator=g)
    return tokens, lengths


# -- loss --------------------------------------------------------------------------------------------
def test_loss_hand_computed():
    ln3 = math.log(3.0)
    # real z = [0, ln 3] -> D = [1/2, 3/4]; fake z = [0, −ln 3] -> D = [1/2, 1/4]
    # −log D_real = [ln 2, ln(4/3)]; −log(1 − D_fake) = [ln 2, ln(4/3)]
    # mean over the 4 examples = (2 ln 2 + 2 ln(4/3)) / 4 = ln(8/3) / 2 ≈ 0.4904
    loss, stats = discriminator_loss(torch.tensor([0.0, ln3]), torch.tensor([0.0, -ln3]))
    assert isinstance(stats, DiscStats)
    assert loss.item() == pytest.approx(math.log(8 / 3) / 2, abs=1e-6)
    # correct: real D=1/2 no (needs > 1/2), real 3/4 yes, fake 1/2 yes (≤ 1/2), fake 1/4 yes -> 3/4
    assert stats.accuracy.item() == pytest.approx(0.75)
    assert stats.d_real.item() == pytest.approx((0.5 + 0.75) / 2)  # 0.625
    assert stats.d_fake.item() == pytest.approx((0.5 + 0.25) / 2)  # 0.375


def test_loss_unbalanced_batches_mean_over_all_examples():
    # real z = [ln 3] -> ln(4/3); fake z = [0, 0, 0] -> 3 · ln 2; mean over 4 examples
    loss, stats = discriminator_loss(torch.tensor([math.log(3.0)]), torch.zeros(3))
    assert loss.item() == pytest.approx((math.log(4 / 3) + 3 * math.log(2)) / 4, abs=1e-6)
    assert stats.accuracy.item() == pytest.approx(1.0)  # 3/4 > 1/2 right, three D = 1/2 fakes right


def test_loss_l2_term_is_tf_l2_loss_and_has_gradient():
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    b = torch.tensor([2.0], requires_grad=True)
    base, _ = discriminator_loss(torch.zeros(2), torch.zeros(2))  # ln 2
    loss, _ = discriminator_loss(torch.zeros(2), torch.zeros(2), l2_reg=0.2, params=iter([w, b]))
    # 0.2 · (1 + 4 + 4) / 2 = 0.9
    assert (loss - base).item() == pytest.approx(0.9, abs=1e-6)
    loss.backward()
    # d/dp 0.2 · ‖p‖² / 2 = 0.2 · p
    torch.testing.assert_close(w.grad, torch.tensor([0.2, 0.4]))
    torch.testing.assert_close(b.grad, torch.tensor([0.4]))


def test_loss_matches_eq5_and_stats_are_detached():
    zr = torch.randn(5, requires_grad=True)
    zf = torch.randn(5, requires_grad=True)
    loss, stats = discriminator_loss(zr, zf)
    # Eq. 5 with B1 = B2: (−mean log D_real − mean log(1 − D_fake)) / 2
    eq5 = -(torch.sigmoid(zr).log().mean() + (1 - torch.sigmoid(zf)).log().mean()) / 2
    torch.testing.assert_close(loss, eq5)
    assert not any(s.requires_grad for s in stats)


# -- model: shapes and configuration ----------------------------------------------------------------
def test_shapes_and_probabilities():
    model = small_model()
    tokens, lengths = random_batch(6, 9, min_len=1)
    assert model(tokens, lengths).shape == (6,)
    assert model.features(tokens, lengths).shape == (6, 4 + 3 + 3 + 2)
    p = model.prob(tokens, lengths)
    assert p.shape == (6,) and bool(((p > 0) & (p < 1)).all())
    src, src_len = random_batch(6, 4, seed=2)
    assert model(tokens, lengths, src, src_len).shape == (6,)


def test_bad_filter_config_raises():
    with pytest.raises(ValueError, match="same length"):
        CNNDiscriminator(V, filter_sizes=(1, 2, 3), num_filters=(4, 4))
    with pytest.raises(ValueError, match="not be empty"):
        CNNDiscriminator(V, filter_sizes=(), num_filters=())
    with pytest.raises(ValueError, match=">= 1"):
        CNNDiscriminator(V, filter_sizes=(0, 2), num_filters=(4, 4))


def test_paper_defaults_every_filter_gets_a_window_for_length_1():
    # the SeqGAN sizes: 12 filter sizes up to 20, 1720 features; one token must still feed all of them
    model = build_discriminator(V).eval()
    assert model.filter_sizes == (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 20)
    tokens = torch.tensor([[5], [7]])
    feats = model.features(tokens, torch.tensor([1, 1]))
    assert feats.shape == (2, 1720) and bool(torch.isfinite(feats).all())
    # each filter's only window is window 0: the token then pads, whose embedding is 0
    emb = model.embedding(F.pad(tokens, (0, 19), value=PAD)).transpose(1, 2)  # (2, E, 20)
    expected = torch.cat([F.relu(conv(emb)[:, :, 0]) for conv in model.convs], dim=1)
    torch.testing.assert_close(feats, expected)


# -- model: masking and packing against plain loops -------------------------------------------------
def loop_features(model: CNNDiscriminator, seq: list[int]) -> torch.Tensor:
    """Eq. 12 and max-over-time written out for one sequence: windows i = 0..max(n − l, 0)."""
    n = len(seq)
    padded = seq + [PAD] * max(model.max_filter - n, 0)
    emb = model.embedding(torch.tensor(padded))  # (L, E), pad rows are 0
    out = []
    for conv, l in zip(model.convs, model.filter_sizes):
        w, b = conv.weight, conv.bias  # (n_l, E, l), (n_l,)
        windows = [(w * emb[i : i + l].T[None]).sum(dim=(1, 2)) + b for i in range(max(n - l, 0) + 1)]
        out.append(F.relu(torch.stack(windows).amax(0)))
    return torch.cat(out)


def test_pooling_matches_plain_loop():
    model = small_model().eval()
    tokens, lengths = random_batch(7, 8)
    lengths[:4] = torch.tensor([0, 1, 4, 8])  # empty, shorter than most filters, middle, full
    with torch.no_grad():
        feats = model.features(tokens, lengths)
        for r in range(7):
            torch.testing.assert_close(feats[r], loop_features(model, tokens[r, : lengths[r]].tolist()))


def test_pad_and_garbage_after_lengths_do_not_change_output():
    model = small_model().eval()
    tokens, lengths = random_batch(8, 7, seed=3)
    src, src_len = random_batch(8, 5, seed=4)
    with torch.no_grad():
        for s, sl in [(None, None), (src, src_len)]:
            ref = model(tokens, lengths, s, sl)
            # more pad columns (batch padded further)
            padded = F.pad(tokens, (0, 11), value=PAD)
            torch.testing.assert_close(model(padded, lengths, s, sl), ref)
            # different garbage after each row's length (random_batch already put garbage there)
            pos = torch.arange(7)[None]
            other = torch.where(pos < lengths[:, None], tokens, torch.randint(2, V, tokens.shape))
            torch.testing.assert_close(model(other, lengths, s, sl), ref)
            cleaned = tokens.masked_fill(pos >= lengths[:, None], PAD)
            torch.testing.assert_close(model(cleaned, lengths, s, sl), ref)
            # a much longer row in the batch pads every other row further (pack trims to the longest)
            long_tok = F.pad(tokens, (0, 13), value=PAD)
            long_tok = torch.cat([long_tok, torch.randint(2, V, (1, 20))])
            long_len = torch.cat([lengths, torch.tensor([20])])
            s2 = None if s is None else torch.cat([s, torch.randint(2, V, (1, 5))])
            sl2 = None if sl is None else torch.cat([sl, torch.tensor([5])])
            torch.testing.assert_close(model(long_tok, long_len, s2, sl2)[:8], ref, atol=1e-6, rtol=1e-5)
        # garbage after src_len and a wider src do not matter either
        spos = torch.arange(5)[None]
        src2 = torch.where(spos < src_len[:, None], src, torch.randint(2, V, src.shape))
        src2 = F.pad(src2, (0, 3), value=7)
        torch.testing.assert_close(model(tokens, lengths, src2, src_len), model(tokens, lengths, src, src_len))


def test_src_packing_matches_per_row_loop():
    model = small_model().eval()
    B = 9
    tokens, lengths = random_batch(B, 6, seed=5)
    src, src_len = random_batch(B, 4, seed=6)
    lengths[:3], src_len[:3] = torch.tensor([0, 6, 0]), torch.tensor([0, 0, 4])  # empty sides
    seqs = [src[r, : src_len[r]].tolist() + [SEP] + tokens[r, : lengths[r]].tolist() for r in range(B)]
    with torch.no_grad():
        packed, n = model.pack(tokens, lengths, src, src_len)
        L = max(max(len(s) for s in seqs), model.max_filter)
        expected = torch.tensor([s + [PAD] * (L - len(s)) for s in seqs])
        assert torch.equal(packed, expected)
        assert n.tolist() == [len(s) for s in seqs]
        batched = model(tokens, lengths, src, src_len)
        for r, s in enumerate(seqs):  # each row alone, as a plain unconditional sequence
            alone = model(torch.tensor([s]), torch.tensor([len(s)]))
            torch.testing.assert_close(batched[r : r + 1], alone, atol=1e-5, rtol=1e-5)


# -- model: scoring and learning ----------------------------------------------------------------------
def test_score_chunks_equal_one_batch_and_restore_mode():
    model = small_model()
    tokens, lengths = random_batch(23, 8, seed=7)
    src, src_len = random_batch(23, 3, seed=8)
    model.train()
    chunked = model.score(tokens, lengths, src, src_len, batch_size=5)
    assert model.training  # mode restored
    assert not chunked.requires_grad and chunked.shape == (23,)
    model.eval()
    with torch.no_grad():
        one = model.prob(tokens, lengths, src, src_len)
    torch.testing.assert_close(chunked, one, atol=1e-6, rtol=1e-5)
    assert not model.training
    torch.testing.assert_close(model.score(tokens, lengths, batch_size=4), model.score(tokens, lengths))
    assert not model.training


def test_dropout_only_in_training():
    model = small_model(dropout=0.5)
    tokens, lengths = random_batch(16, 8, min_len=1, seed=9)
    model.train()
    assert not torch.equal(model(tokens, lengths), model(tokens, lengths))
    model.eval()
    assert torch.equal(model(tokens, lengths), model(tokens, lengths))


def two_distributions(n: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Real rows draw tokens from {2..6}, generated rows from {5..11}; lengths 2..10, garbage after."""
    real = torch.randint(2, 7, (n, 10), generator=g)
    fake = torch.randint(5, V, (n, 10), generator=g)
    lr, lf = torch.randint(2, 11, (n,), generator=g), torch.randint(2, 11, (n,), generator=g)
    return real, lr, fake, lf


def test_learns_to_separate_two_token_distributions():
    model = small_model(seed=10, dropout=0.25)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(11)
    first = None
    for _ in range(100):
        real, lr, fake, lf = two_distributions(32, g)
        loss, _ = discriminator_loss(model(real, lr), model(fake, lf), l2_reg=0.2, params=model.out.parameters())
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < first
    real, lr, fake, lf = two_distributions(200, g)
    d_real, d_fake = model.score(real, lr), model.score(fake, lf)
    accuracy = ((d_real > 0.5).float().mean() + (d_fake <= 0.5).float().mean()) / 2
    assert accuracy > 0.9, accuracy
    assert d_real.mean() > d_fake.mean()


# -- prefix-shared scoring (SeqGAN's Monte-Carlo continuations) ---------------------------------------------
def shared_prefix_rows(tokens, lengths, prefix_len, N: int, width: int, seed: int):
    """Random rows (B, P, N, width) that start with min(prefix_len, cont_len, length) tokens of their base
    sequence, then random tokens (garbage after cont_len included), and their lengths cont_len (B, P, N)."""
    g = torch.Generator().manual_seed(seed)
    B, P = prefix_len.shape
    cont = torch.randint(2, V, (B, P, N, width), generator=g)
    cont_len = torch.randint(0, width + 1, (B, P, N), generator=g)
    for b in range(B):
        for j in range(P):
            for n in range(N):
                k = min(int(prefix_len[b, j]), int(cont_len[b, j, n]), int(lengths[b]))
                cont[b, j, n, :k] = tokens[b, :k]
    return cont, cont_len


@pytest.mark.parametrize("conditional", [False, True])
@pytest.mark.parametrize("filters", [SMALL["filter_sizes"], (1, 3, 7, 9)])  # (1, 3, 7, 9): most rows < 9
@pytest.mark.parametrize("group_rows", [1, 5, 512])  # rows convolved together (by shared length)
def test_shared_prefix_scoring_equals_score_on_materialised_rows(conditional, filters, group_rows, monkeypatch):
    # each row scored alone by score() (the definition) against the prefix-shared scoring, over random prefix
    # lengths (0 and 1 forced, past the row's and the base's lengths too), rows shorter than the biggest filter,
    # garbage after every length, rows wider than the base (pad columns), several chunk and group sizes
    monkeypatch.setattr(discriminator_module, "SHARED_GROUP_ROWS", group_rows)
    model = small_model(filter_sizes=filters, num_filters=(4, 3, 3, 2))
    B, T, P, N = 5, 8, 6, 3
    tokens, lengths = random_batch(B, T, seed=11)
    lengths[0], lengths[1] = 0, 1
    g = torch.Generator().manual_seed(12)
    prefix_len = torch.randint(0, T + 3, (B, P), generator=g)
    prefix_len[:, 0], prefix_len[:, 1] = 0, 1
    cont, cont_len = shared_prefix_rows(tokens, lengths, prefix_len, N, T + 2, seed=13)
    src = src_len = None
    if conditional:
        src, src_len = random_batch(B, 4, seed=14)
        src_len[0] = 0
    flat_src = None if src is None else src.repeat_interleave(P * N, 0)
    flat_src_len = None if src_len is None else src_len.repeat_interleave(P * N, 0)
    ref = model.score(cont.reshape(-1, T + 2), cont_len.reshape(-1), flat_src, flat_src_len).view(B, P, N)
    assert ref.std() > 0.01  # the rows differ: a wrong window shows
    model.train()
    for bs in (1, 7, 4096):
        got = model.score_shared_prefix(tokens, lengths, cont, cont_len, prefix_len, src, src_len, batch_size=bs)
        assert model.training  # mode restored
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)


def test_shared_prefix_scoring_one_prefix_per_column_and_bad_input():
    # prefix_len (P,) broadcast over B (the Monte-Carlo search's prefixes 1..P); rows that break the contract
    # (a shared position that differs from the base) and mismatched shapes are refused
    model = small_model()
    B, T, N = 4, 7, 2
    tokens, lengths = random_batch(B, T, seed=21)
    prefix_len = torch.arange(1, T)
    cont, cont_len = shared_prefix_rows(tokens, lengths, prefix_len.expand(B, -1), N, T, seed=22)
    ref = model.score(cont.reshape(-1, T), cont_len.reshape(-1)).view(B, T - 1, N)
    torch.testing.assert_close(model.score_shared_prefix(tokens, lengths, cont, cont_len, prefix_len), ref,
                               atol=1e-6, rtol=1e-5)
    full = torch.full((B,), T)
    bad = tokens[:, None, None, :].expand(B, T - 1, N, T).clone()  # every row the base sequence: valid
    model.score_shared_prefix(tokens, full, bad, full[:, None, None].expand(B, T - 1, N), prefix_len)
    bad[2, 3, 1, 2] = (tokens[2, 2] + 1) % V  # inside the shared prefix of length 4
    with pytest.raises(ValueError, match=r"cont\[2, 3, 1\] differs from tokens\[2\] at position 2"):
        model.score_shared_prefix(tokens, full, bad, full[:, None, None].expand(B, T - 1, N), prefix_len)
    with pytest.raises(ValueError, match="needs tokens"):
        model.score_shared_prefix(tokens[:3], lengths[:3], cont, cont_len, prefix_len)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        model.score_shared_prefix(tokens, lengths, cont, cont_len, prefix_len, batch_size=0)
