"""``rayseq.rewards.bleu`` against sacrebleu, the reference implementation it must equal.

Every score is checked against ``BLEU(max_ngram_order=N, tokenize="none", effective_order=True)
.sentence_score(...).score / 100`` on the space-joined ids (sacrebleu 2.x, ``metrics/bleu.py``): hand-written
edge cases, 2,000 random cases, and small hand-computed examples with the arithmetic in comments
(torchtune-style). Papineni et al. (2002) for BLEU; Tuan et al. (2018), chatbot experiment, for BLEU-2 as reward.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

import rayseq.rewards.bleu as bleu_mod
from rayseq.rewards import corpus_bleu, corpus_bleu_parts, sentence_bleu, sentence_bleu_padded

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-6


def join(seq) -> str:
    return " ".join(map(str, np.asarray(seq, dtype=np.int64).tolist()))


def sacre(hyps, refs, max_order: int = 2) -> np.ndarray:
    """The plain loop: sacrebleu sentence_score per sentence, in [0, 1]."""
    metric = BLEU(max_ngram_order=max_order, tokenize="none", effective_order=True)
    return np.array([metric.sentence_score(join(h), [join(r) for r in rs]).score / 100 for h, rs in zip(hyps, refs)])


def random_cases(n: int, seed: int, max_len: int = 25, vocab=(3, 50), max_refs: int = 5):
    """Random lengths 0..max_len, a small vocabulary per case (so n-grams overlap), 1..max_refs refs."""
    rng = np.random.default_rng(seed)
    hyps, refs = [], []
    for _ in range(n):
        v = int(rng.integers(vocab[0], vocab[1] + 1))
        hyps.append(rng.integers(0, v, rng.integers(0, max_len + 1)).tolist())
        n_refs = int(rng.integers(1, max_refs + 1))
        refs.append([rng.integers(0, v, rng.integers(0, max_len + 1)).tolist() for _ in range(n_refs)])
    return hyps, refs


# -- (a) edge cases ---------------------------------------------------------------------------------------
EDGE_CASES = {
    "empty hyp": ([], [[1, 2, 3]]),
    "empty hyp, empty ref": ([], [[]]),
    "empty ref only": ([1, 2], [[]]),
    "empty ref and an exact one": ([1, 2], [[], [1, 2]]),
    # c = 1: |1 − 0| = |1 − 2| = 1, the tie goes to the shorter (empty) reference, so BP = 1 and BLEU = 1;
    # taking the longer one would give BP = e^(1 − 2).
    "length tie with an empty ref": ([5], [[], [5, 6]]),
    "one-token hyp, match": ([7], [[7, 8, 9]]),
    "one-token hyp, no match": ([7], [[8]]),
    "one-token hyp, one-token ref": ([7], [[7]]),
    "exact match": ([1, 2, 3, 4], [[1, 2, 3, 4]]),
    "no overlap": ([1, 2, 3], [[4, 5, 6]]),
    "unigrams only, bigrams swapped": ([1, 2, 3], [[3, 2, 1]]),
    "repeated tokens clipped": ([1, 1, 1, 1], [[1, 1, 2]]),
    "clip by the max over refs": ([1, 1, 1, 1], [[1, 2], [1, 1, 1]]),
    "duplicate refs": ([1, 1, 2], [[1, 2], [1, 2]]),
    # c = 4, refs of length 2 and 6: both 2 away, the shorter wins (BP = 1, not e^(1 − 6/4)).
    "length tie between refs": ([1, 2, 3, 4], [[1, 2], [1, 2, 3, 9, 9, 9]]),
    "hyp shorter than every ref": ([1, 2], [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7]]),
    "hyp longer than every ref": ([1, 2, 3, 4, 5, 6, 7, 8], [[1, 2], [3, 4, 5]]),
    "closest ref is the longer one": ([1, 2, 3, 4, 5], [[1, 2], [1, 2, 3, 4, 5, 6]]),
    "same bigram in two refs, different counts": ([4, 4, 4, 4, 4], [[4, 4, 9], [4, 4, 4, 9], [9]]),
    "token 0 (the pad id) as a real token": ([0, 0, 1], [[0, 1, 0]]),
    "large ids": ([10**9, 3, 10**9], [[3, 10**9, 10**9]]),
    "negative ids": ([-5, -1, 2], [[-1, 2, -5]]),
}


@pytest.mark.parametrize("max_order", [1, 2, 3, 4])
@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_edge_cases_equal_sacrebleu(name, max_order):
    hyp, refs = EDGE_CASES[name]
    got = sentence_bleu([hyp], [refs], max_order=max_order)
    assert got.shape == (1,) and got.dtype == np.float64
    assert got[0] == pytest.approx(sacre([hyp], [refs], max_order)[0], abs=TOL)


def test_edge_cases_batched_equal_one_by_one():
    hyps = [h for h, _ in EDGE_CASES.values()]
    refs = [r for _, r in EDGE_CASES.values()]
    np.testing.assert_allclose(sentence_bleu(hyps, refs), sacre(hyps, refs), atol=TOL, rtol=0)


def test_empty_batch():
    assert sentence_bleu([], []).shape == (0,)
    assert sentence_bleu(np.zeros((0, 5), dtype=np.int64), [], hyp_len=np.zeros(0)).shape == (0,)


def test_bad_arguments():
    with pytest.raises(ValueError, match="refs has 1 entries for 2"):
        sentence_bleu([[1], [2]], [[[1]]])
    with pytest.raises(ValueError, match="no reference"):
        sentence_bleu([[1], [2]], [[[1]], []])
    with pytest.raises(ValueError, match="hyp_len is only for"):
        sentence_bleu([[1, 2]], [[[1]]], hyp_len=[1])
    with pytest.raises(ValueError, match="hyp_len must be"):
        sentence_bleu(np.ones((2, 3), dtype=np.int64), [[[1]], [[1]]], hyp_len=[1, 4])
    with pytest.raises(ValueError, match="max_order"):
        sentence_bleu([[1]], [[[1]]], max_order=0)


# -- (b) random cases -------------------------------------------------------------------------------------
def test_2000_random_cases_equal_sacrebleu():
    hyps, refs = random_cases(2000, seed=0)
    got = sentence_bleu(hyps, refs)
    want = sacre(hyps, refs)
    assert 0.5 < (want > 0).mean() < 1.0  # overlaps are common, zero scores too: both paths are exercised
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("max_order", [1, 3, 4])
def test_random_cases_other_orders(max_order):
    hyps, refs = random_cases(300, seed=max_order)
    np.testing.assert_allclose(sentence_bleu(hyps, refs, max_order), sacre(hyps, refs, max_order), atol=TOL, rtol=0)


@pytest.mark.parametrize(
    "ids",
    [
        np.arange(20) * 52_361,  # id range ~2^20: 3-gram keys would pass 2^62 with the row bits -> keys re-ranked
        np.arange(-10, 10) * 10**14,  # negative ids, range ~2^51: ids re-ranked to 0..19 first
    ],
    ids=["re-ranked n-gram keys", "re-ranked ids"],
)
def test_wide_id_ranges(ids):
    hyps, refs = random_cases(300, seed=7, max_len=12, vocab=(3, 8))
    hyps = [ids[h].tolist() for h in hyps]
    refs = [[ids[r].tolist() for r in rs] for rs in refs]
    np.testing.assert_allclose(sentence_bleu(hyps, refs, 4), sacre(hyps, refs, 4), atol=TOL, rtol=0)


@pytest.mark.parametrize("block_tokens", [1, 64, 1 << 40])
def test_block_size_does_not_change_scores(monkeypatch, block_tokens):
    hyps, refs = random_cases(400, seed=3)
    want = sentence_bleu(hyps, refs)
    monkeypatch.setattr(bleu_mod, "_BLOCK_TOKENS", block_tokens)  # 1: one row per block; 2^40: one block
    np.testing.assert_array_equal(sentence_bleu(hyps, refs), want)


# -- padded arrays and array inputs -----------------------------------------------------------------------
def test_padded_path_equals_list_path():
    hyps, refs = random_cases(500, seed=11)
    T = max(map(len, hyps))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50, (len(hyps), T))  # garbage after each length must be ignored
    lengths = np.array([len(h) for h in hyps])
    for i, h in enumerate(hyps):
        tokens[i, : len(h)] = h
    ref_arrays = [[np.asarray(r, dtype=np.int32) for r in rs] for rs in refs]  # as the data pipeline holds them
    want = sentence_bleu(hyps, refs)
    np.testing.assert_array_equal(sentence_bleu(tokens, ref_arrays, hyp_len=lengths), want)
    np.testing.assert_array_equal(sentence_bleu_padded(tokens, lengths, ref_arrays), want)
    np.testing.assert_array_equal(sentence_bleu([np.asarray(h) for h in hyps], ref_arrays), want)


def test_padded_without_lengths_uses_every_column():
    tokens = np.array([[1, 2, 0], [3, 3, 3]])
    refs = [[[1, 2, 0]], [[3, 3]]]
    np.testing.assert_allclose(sentence_bleu(tokens, refs), sacre(tokens.tolist(), refs), atol=TOL, rtol=0)


def test_padded_pad_id_zero_and_zero_length_rows():
    # Generator output: pad id 0 after each row's real tokens; a zero-length row scores 0.
    tokens = np.array([[4, 5, 0, 0], [0, 0, 0, 0], [4, 0, 0, 0]])
    lengths = np.array([2, 0, 1])
    refs = [[np.array([4, 5])], [np.array([0, 0])], [np.array([4, 0])]]
    got = sentence_bleu_padded(tokens, lengths, refs)
    np.testing.assert_allclose(got, sacre([[4, 5], [], [4]], refs), atol=TOL, rtol=0)
    assert got[0] == 1.0 and got[1] == 0.0


# -- (c) hand-computed -----------------------------------------------------------------------------------
def test_hand_computed_bleu2():
    hyps = [
        [1, 2, 3],  # unigrams 3/3 match; bigrams (1,2),(2,3) vs ref (3,2),(2,1): 0/2
        [5, 6],
        [1, 1, 1, 1],
        [7],
    ]
    refs = [
        [[3, 2, 1]],
        [[5, 6, 7, 8], [5, 9, 9, 9, 9]],
        [[1, 2], [1, 1, 1]],
        [[7, 8, 9]],
    ]
    got = sentence_bleu(hyps, refs)
    # Row 0: p1 = 3/3; m2 = 0 is the first unmatched order (k = 1): exp smoothing p2 = 1 / (2^1 · 2) = 1/4;
    #   c = r = 3 so BP = 1; BLEU = exp((log 1 + log 1/4) / 2) = sqrt(1/4) = 0.5.
    # Row 1: closest ref length: |2 − 4| = 2 < |2 − 5| = 3, so r = 4; p1 = 2/2, p2 = (5,6) 1/1;
    #   BP = exp(1 − 4/2) = e^−1; BLEU = e^−1 ≈ 0.367879.
    # Row 2: c_h(1) = 4, max over refs of c_r(1) = max(1, 3) = 3, so p1 = 3/4; c_h((1,1)) = 3, max(0, 2) = 2,
    #   so p2 = 2/3; r: |4 − 2| = 2 > |4 − 3| = 1 -> 3, BP = 1; BLEU = sqrt(3/4 · 2/3) = sqrt(1/2).
    # Row 3: one token, so the effective order is 1: BLEU = BP · p1 = exp(1 − 3/1) · 1/1 = e^−2.
    want = [0.5, math.exp(-1), math.sqrt(0.5), math.exp(-2)]
    np.testing.assert_allclose(got, want, atol=1e-12, rtol=0)
    np.testing.assert_allclose(got, sacre(hyps, refs), atol=TOL, rtol=0)


def test_hand_computed_exp_smoothing_bleu4():
    hyp = [1, 2, 3, 4, 5]
    refs = [[1, 2, 9, 4, 5]]
    # p1 = 4/5 (all but 3); p2: (1,2),(4,5) of 4 bigrams = 2/4; p3: no trigram matches, the 1st unmatched
    # order: 1 / (2^1 · 3) = 1/6; p4: the 2nd unmatched order: 1 / (2^2 · 2) = 1/8; c = r = 5, BP = 1.
    # BLEU-4 = (4/5 · 1/2 · 1/6 · 1/8)^(1/4) = (1/120)^(1/4) ≈ 0.302138.
    got = sentence_bleu([hyp], [refs], max_order=4)[0]
    assert got == pytest.approx((1 / 120) ** 0.25, abs=1e-12)
    assert got == pytest.approx(sacre([hyp], [refs], 4)[0], abs=TOL)


# -- corpus BLEU ------------------------------------------------------------------------------------------
def test_corpus_bleu_equals_sacrebleu_corpus_score_with_variable_refs():
    hyps, refs = random_cases(200, seed=5)
    width = max(map(len, refs))
    streams = [[join(rs[j]) if j < len(rs) else None for rs in refs] for j in range(width)]
    want = BLEU(max_ngram_order=2, tokenize="none").corpus_score([join(h) for h in hyps], streams).score / 100
    assert corpus_bleu(hyps, refs) == pytest.approx(want, abs=1e-12)
    lengths = np.array([len(h) for h in hyps])
    tokens = np.zeros((len(hyps), lengths.max()), dtype=np.int64)
    for i, h in enumerate(hyps):
        tokens[i, : len(h)] = h
    assert corpus_bleu(tokens, refs, hyp_len=lengths) == pytest.approx(want, abs=1e-12)


def test_corpus_bleu_of_one_sentence_is_its_sentence_bleu():
    # With |h| ≥ N the effective order is N either way and the statistics are the same.
    hyp, refs = [1, 2, 3, 4, 2], [[1, 2, 4, 4], [2, 3]]
    assert corpus_bleu([hyp], [refs]) == pytest.approx(sentence_bleu([hyp], [refs])[0], abs=1e-12)


def test_corpus_bleu_parts_by_hand():
    # Two hypotheses against one reference each (Papineni et al. 2002, Sec. 2; BP Sec. 2.2.2):
    #   h1 = 1 2 3 vs r1 = 1 2 4 5: unigrams 1, 2 match (2 of 3), bigram (1 2) matches (1 of 2)
    #   h2 = 7 8   vs r2 = 7 9 8 6 6: unigrams 7, 8 match (2 of 2), no bigram matches (0 of 1)
    # p1 = 4/5, p2 = 1/3, c = 5, r = 9: BP = exp(1 - 9/5), BLEU-2 = BP · sqrt(p1 · p2)
    parts = corpus_bleu_parts([[1, 2, 3], [7, 8]], [[[1, 2, 4, 5]], [[7, 9, 8, 6, 6]]], max_order=2)
    assert parts["precisions"] == pytest.approx([4 / 5, 1 / 3], abs=1e-12)
    assert (parts["hyp_len"], parts["ref_len"]) == (5, 9)
    assert parts["bp"] == pytest.approx(np.exp(1 - 9 / 5), abs=1e-12)
    assert parts["bleu"] == pytest.approx(np.exp(1 - 9 / 5) * np.sqrt(4 / 5 * 1 / 3), abs=1e-12)
    assert parts["bleu"] == corpus_bleu([[1, 2, 3], [7, 8]], [[[1, 2, 4, 5]], [[7, 9, 8, 6, 6]]])
    # the closest reference length counts (a tie goes to the shorter), and c >= r means BP = 1
    assert corpus_bleu_parts([[1, 2, 3]], [[[1, 2], [1, 2, 3, 4, 5, 6]]])["ref_len"] == 2
    assert corpus_bleu_parts([[1, 2, 3]], [[[1, 2], [1, 2, 3, 4]]])["bp"] == 1.0


def test_importing_the_reward_does_not_load_sacrebleu():
    code = "import rayseq.rewards, sys; assert 'sacrebleu' not in sys.modules and 'ray' not in sys.modules"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
