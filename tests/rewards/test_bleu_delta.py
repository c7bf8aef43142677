"""``rayseq.rewards.bleu_delta.bleu_increments``: ERPO's token-level BLEU increment for every candidate token.

ΔR(v | p, y*) = BLEU(p + [v], y*) − BLEU(p, y*) (Tan et al. 2018, Eq. 3-4; Supplement Algorithm 1, line 9),
BLEU = ``sentence_bleu`` (itself tested against sacrebleu in test_bleu.py). Checked against (1) the plain
loop over rows and every v, (2) hand-computed BLEU-2 values, (3) shapes, padding and input errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from rayseq.rewards.bleu import sentence_bleu
from rayseq.rewards.bleu_delta import bleu_increments

TOL = 1e-6


def plain_increments(prefixes: list[list[int]], refs, V: int, max_order: int) -> np.ndarray:
    """The definition, one ``sentence_bleu`` call per (row, v); BLEU of the empty prefix is 0."""
    out = np.zeros((len(prefixes), V))
    for i, (p, rs) in enumerate(zip(prefixes, refs)):
        base = sentence_bleu([p], [rs], max_order=max_order)[0] if p else 0.0
        for v in range(V):
            out[i, v] = sentence_bleu([p + [v]], [rs], max_order=max_order)[0] - base
    return out


def rows_with_top_order_ngram(prefixes: list[list[int]], refs, n: int) -> int:
    """Rows where the prefix's last n − 1 tokens start an n-gram of one of the references."""
    count = 0
    for p, rs in zip(prefixes, refs):
        ctx = tuple(p[len(p) - n + 1 :]) if len(p) >= n - 1 else None
        grams = {tuple(r[s : s + n - 1]) for r in map(list, rs) for s in range(len(r) - n + 1)}
        count += ctx in grams
    return count


def random_batch(rng: np.random.Generator, B: int = 20, V: int = 30, T: int = 8):
    """Prefixes of length 0..T and 1-3 references of length 0..8, all drawn per row from a pool of 3-6 of
    the V ids (so unigram, bigram and trigram matches, repeats and clipping all happen); the padding after
    each prefix holds random ids, some of them ones the references contain."""
    lens = rng.integers(0, T + 1, B)
    padded = rng.integers(0, V, (B, T))
    prefixes, refs = [], []
    for i in range(B):
        pool = rng.choice(V, int(rng.integers(3, 7)), replace=False)
        p = rng.choice(pool, lens[i]).tolist()
        padded[i, : lens[i]] = p
        padded[i, lens[i] :] = rng.choice(pool, T - lens[i])  # padding that would match if it were read
        prefixes.append(p)
        refs.append([rng.choice(pool, int(rng.integers(0, 9))) for _ in range(int(rng.integers(1, 4)))])
    return padded, lens, prefixes, refs


# -- 1. against the plain loop ----------------------------------------------------------------------------
@pytest.mark.parametrize("max_order", [1, 2, 3])
@pytest.mark.parametrize("seed", range(4))
def test_matches_plain_loop(max_order: int, seed: int) -> None:
    rng = np.random.default_rng(1000 * max_order + seed)
    V = 30
    padded, lens, prefixes, refs = random_batch(rng, V=V)
    got = bleu_increments(padded, lens, refs, V, max_order=max_order)
    want = plain_increments(prefixes, refs, V, max_order)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    # The batch must exercise the interesting path: rows where some v completes a reference n-gram of the
    # highest order after the prefix's last max_order − 1 tokens.
    assert rows_with_top_order_ngram(prefixes, refs, max_order) >= 3


@pytest.mark.parametrize("max_order", [2, 4])
def test_matches_sacrebleu_directly(max_order: int) -> None:
    """A few rows against sacrebleu itself, so a shared bug with sentence_bleu cannot hide."""
    rng = np.random.default_rng(7 + max_order)
    V = 12
    padded, lens, prefixes, refs = random_batch(rng, B=6, V=V, T=7)
    got = bleu_increments(padded, lens, refs, V, max_order=max_order)
    metric = BLEU(max_ngram_order=max_order, tokenize="none", effective_order=True)

    def sacre(h, rs) -> float:
        return metric.sentence_score(" ".join(map(str, h)), [" ".join(map(str, r)) for r in rs]).score / 100

    for i, (p, rs) in enumerate(zip(prefixes, refs)):
        base = sacre(p, rs) if p else 0.0
        want = [sacre(p + [v], rs) - base for v in range(V)]
        np.testing.assert_allclose(got[i], want, rtol=0, atol=TOL)


def test_longer_prefixes_and_larger_vocab() -> None:
    """Full-size prefixes (up to T = 22) and a larger vocabulary with ids beyond the references."""
    rng = np.random.default_rng(3)
    padded, lens, prefixes, refs = random_batch(rng, B=8, V=60, T=22)
    got = bleu_increments(padded, lens, refs, 60, max_order=2)
    np.testing.assert_allclose(got, plain_increments(prefixes, refs, 60, 2), rtol=0, atol=TOL)


# -- 2. by hand ---------------------------------------------------------------------------------------------
def test_hand_computed_bleu2() -> None:
    # refs [[5, 6, 7]] (r = 3), BLEU-2 with effective order N' = min(2, c):
    #   BLEU([5])    : c = 1, N' = 1; m_1 = 1, t_1 = 1 -> p_1 = 1; BP = exp(1 − 3/1) = e^−2
    #                  = e^−2 ≈ 0.135335283
    #   BLEU([5, 6]) : c = 2, N' = 2; p_1 = 2/2 = 1, p_2 = 1/1 = 1 ((5,6) is in the ref); BP = exp(1 − 3/2)
    #                  = e^−0.5 ≈ 0.606530660
    #   BLEU([5, 9]) : p_1 = 1/2; m_2 = 0, first unmatched order (k = 1): p_2 = 1/(2^1 · 1) = 1/2;
    #                  BP = e^−0.5; BLEU = e^−0.5 · sqrt(1/2 · 1/2) = 0.5 e^−0.5 ≈ 0.303265330
    #   BLEU([5, 5]) : the second 5 is clipped (max ref count 1): m_1 = 1 -> same as [5, 9]
    #   BLEU([5, 7]) : p_1 = 2/2 = 1, (5,7) unmatched: p_2 = 1/2; BLEU = e^−0.5 · sqrt(1/2) ≈ 0.428881942
    # so ΔR(6) = e^−0.5 − e^−2 ≈ 0.471195377, ΔR(9) = ΔR(5) = 0.5 e^−0.5 − e^−2 ≈ 0.167930047,
    #    ΔR(7) = e^−0.5 / sqrt(2) − e^−2 ≈ 0.293546659.
    V = 10
    d = bleu_increments(np.array([[5, 6, 7]]), np.array([1]), [[np.array([5, 6, 7])]], V, max_order=2)[0]
    e2, e05 = math.exp(-2.0), math.exp(-0.5)
    assert abs(d[6] - (e05 - e2)) < TOL
    assert abs(d[6] - 0.471195377) < 1e-8
    assert abs(d[9] - (0.5 * e05 - e2)) < TOL
    assert abs(d[9] - 0.167930047) < 1e-8
    assert abs(d[5] - d[9]) < TOL  # clipping: a second 5 is no match
    assert abs(d[7] - (e05 / math.sqrt(2.0) - e2)) < TOL
    for v in (0, 1, 2, 3, 4, 8):  # tokens absent from the reference all share the no-match value
        assert d[v] == d[9]


def test_hand_computed_empty_prefix() -> None:
    # Empty prefix: BLEU = 0. BLEU([v]) for v in the ref [5, 6, 7]: c = 1, N' = 1, p_1 = 1, BP = e^(1 − 3) = e^−2;
    # for any other v: m_1 = 0 -> BLEU = 0. So ΔR = e^−2 on {5, 6, 7} and 0 elsewhere.
    d = bleu_increments(np.zeros((1, 4), dtype=np.int64), np.array([0]), [[np.array([5, 6, 7])]], 8)[0]
    want = np.where(np.isin(np.arange(8), [5, 6, 7]), math.exp(-2.0), 0.0)
    np.testing.assert_allclose(d, want, rtol=0, atol=TOL)


# -- 3. shapes, padding, errors -------------------------------------------------------------------------------
def test_shape_dtype_and_padding_ignored() -> None:
    rng = np.random.default_rng(5)
    padded, lens, prefixes, refs = random_batch(rng, B=12, V=25)
    out = bleu_increments(padded, lens, refs, 25, max_order=2)
    assert out.shape == (12, 25) and out.dtype == np.float32
    other = padded.copy()
    other[np.arange(padded.shape[1]) >= lens[:, None]] = 24  # different padding, same prefixes
    np.testing.assert_array_equal(bleu_increments(other, lens, refs, 25, max_order=2), out)
    # Reading the padding would change the result: the same rows taken as full length differ.
    full = np.full(12, padded.shape[1])
    assert not np.allclose(bleu_increments(padded, full, refs, 25, max_order=2), out)


def test_list_references_and_empty_batch() -> None:
    refs_arr = [[np.array([1, 2, 3]), np.array([2, 3])], [np.array([4])]]
    refs_list = [[[1, 2, 3], [2, 3]], [[4]]]
    prefix, lens = np.array([[1, 2], [4, 0]]), np.array([2, 1])
    np.testing.assert_array_equal(
        bleu_increments(prefix, lens, refs_arr, 6), bleu_increments(prefix, lens, refs_list, 6)
    )
    empty = bleu_increments(np.zeros((0, 5), dtype=np.int64), np.zeros(0, dtype=np.int64), [], 7)
    assert empty.shape == (0, 7) and empty.dtype == np.float32


def test_errors() -> None:
    prefix, lens = np.array([[1, 2], [3, 4]]), np.array([2, 1])
    refs = [[np.array([1, 2])], [np.array([3])]]
    with pytest.raises(ValueError, match="refs has 1 entries for 2 prefixes"):
        bleu_increments(prefix, lens, refs[:1], 5)
    with pytest.raises(ValueError, match="no reference"):
        bleu_increments(prefix, lens, [refs[0], []], 5)
    with pytest.raises(ValueError, match="prefix_len"):
        bleu_increments(prefix, np.array([3, 1]), refs, 5)
    with pytest.raises(ValueError, match="reference ids must lie in"):
        bleu_increments(prefix, lens, refs, 3)
    with pytest.raises(ValueError, match="max_order"):
        bleu_increments(prefix, lens, refs, 5, max_order=0)
    with pytest.raises(ValueError, match=r"\(B, T\) integer array"):
        bleu_increments(np.array([1, 2]), lens, refs, 5)
