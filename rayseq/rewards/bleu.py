"""Vectorised sentence BLEU over token ids, equal to sacrebleu's ``sentence_score`` (the chatbot reward).

BLEU (Papineni, Roukos, Ward & Zhu, "BLEU: a Method for Automatic Evaluation of Machine Translation",
ACL 2002, Sec. 2) of a hypothesis h against references R, as sacrebleu 2.x computes it for one sentence
(Post, "A Call for Clarity in Reporting BLEU Scores", WMT 2018; ``sacrebleu/metrics/bleu.py``
``BLEU.compute_bleu`` with ``smooth_method="exp"``, ``effective_order=True``, ``tokenize="none"``)::

    BLEU = BP · exp( Σ_{n=1..N'} w_n log p_n ),   w_n = 1 / N',   N' = min(max_order, |h|)  (effective order)

    m_n = Σ_{g ∈ n-grams(h)} min( c_h(g), max_{r ∈ R} c_r(g) )     clipped ("modified") matches
    t_n = |h| − n + 1                                               n-grams in h
    p_n = m_n / t_n                         if m_n > 0
    p_n = 1 / (2^k · t_n)                   if m_n = 0, the k-th order (k = 1, 2, ...) with no match
                                            ("exp" smoothing: NIST mteval-v13a; Chen & Cherry 2014, method 3)
    BP  = 1 if c ≥ r, exp(1 − r / c) if 0 < c < r, 0 if c = 0;  c = |h|, r = the reference length
          closest to c (a tie goes to the shorter reference)
    BLEU = 0 if m_1 = 0 (no unigram matches; this covers the empty hypothesis)

Scores are returned in [0, 1] (sacrebleu's ``.score / 100``). Tuan et al., "Proximal Policy Optimization
and its Dynamic Version for Sequence Generation" (2018), reward their chit-chat chatbot with BLEU-2 of the
sampled response against all references of the input: ``sentence_bleu(responses, refs, max_order=2)``.

Vectorisation (``_matches``): rows are scored in blocks of ~32k tokens (hypotheses + references). In a
block every n-gram g is one int64 ``key(g) << KB | row << SB | tag`` (tag 0 for the hypothesis, 1 + j for
the row's j-th reference; ``key_n = key_{n-1} · V + id``). A reference token whose (id, row) is not in the
hypothesis belongs to no match, so a hash table of the hypothesis (id, row) drops such tokens (86% of the
reference tokens in ``benchmarks/bleu_speed.py``) and every n-gram containing one. One sort per order
then turns counting into run lengths: c_h is the first run of a (g, row) group, max_r c_r the largest of
the others (``np.maximum.reduceat``), and min(c_h, max_r c_r) is summed per row with ``np.bincount``.
Python loops run over blocks and orders only (and over sentences to flatten ragged lists).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

_KEY_LIMIT = 2**62  # combined int64 keys stay below this; beyond it n-gram keys are re-ranked densely
# Rows are scored in blocks of about this many tokens (hypotheses + references), so that temporaries are
# reused from the heap and stay in cache instead of being freshly mapped (page faults). On the 2-core
# development VM, bleu_speed.py (B = 5,000, 280k tokens): 2^15 -> 15.7 ms, one block -> 18-20 ms,
# 2^13 -> 22 ms (per-block Python overhead).
_BLOCK_TOKENS = 1 << 15


def sentence_bleu(
    hyps: Sequence[Sequence[int]] | np.ndarray,
    refs: Sequence[Sequence[Sequence[int]]],
    max_order: int = 2,
    hyp_len: np.ndarray | Sequence[int] | None = None,
) -> np.ndarray:
    """Sentence BLEU of every hypothesis against its references, as sacrebleu ``sentence_score`` / 100.

    Equal (to float rounding) to ``BLEU(max_ngram_order=max_order, tokenize="none", effective_order=True)
    .sentence_score(" ".join(map(str, h)), [" ".join(map(str, r)) for r in refs[i]]).score / 100``;
    the formula is in the module docstring.

    hyps:      B token-id sequences (lists or 1-D int arrays, any lengths ≥ 0), or a padded (B, T) int array
    refs:      B entries, each a non-empty sequence of reference token-id sequences (lists or 1-D int
               arrays, any lengths ≥ 0; arrays are the faster kind)
    max_order: N, the highest n-gram order (2 for BLEU-2)
    hyp_len:   (B,) real-token counts when ``hyps`` is a (B, T) array (padding after them is ignored);
               default: all T columns
    returns    (B,) float64 in [0, 1]
    """
    h_tok, h_len = _flatten_hyps(hyps, hyp_len)
    B = len(h_len)
    if len(refs) != B:
        raise ValueError(f"refs has {len(refs)} entries for {B} hypotheses (one list of references per hypothesis)")
    n_refs = np.fromiter(map(len, refs), dtype=np.int64, count=B)
    if B and n_refs.min() < 1:
        raise ValueError(f"hypothesis {int(np.argmin(n_refs))} has no reference (sacrebleu needs at least one)")
    if max_order < 1:
        raise ValueError(f"max_order must be >= 1, got {max_order}")
    if B == 0:
        return np.zeros(0)
    flat_refs = list(chain.from_iterable(refs))
    r_len = np.fromiter(map(len, flat_refs), dtype=np.int64, count=len(flat_refs))
    h_end, r_end = np.cumsum(h_len), np.cumsum(n_refs)  # row i: ids h_end[i-1]:h_end[i], refs r_end[i-1]:r_end[i]
    row_tokens = h_len + np.add.reduceat(r_len, r_end - n_refs)
    block = (np.cumsum(row_tokens) - row_tokens) // _BLOCK_TOKENS  # block of each row, by its first token
    bounds = np.r_[0, np.flatnonzero(block[1:] != block[:-1]) + 1, B]

    correct = np.empty((B, max_order))  # (B, N) clipped matches m_n
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        ra, rb = int(r_end[a] - n_refs[a]), int(r_end[b - 1])
        h0, h1 = int(h_end[a] - h_len[a]), int(h_end[b - 1])
        tok = np.concatenate([h_tok[h0:h1], _concat(flat_refs[ra:rb])])
        correct[a:b] = _matches(tok, h_len[a:b], r_len[ra:rb], n_refs[a:b], max_order)
    return _bleu_from_stats(correct, h_len, _closest_ref_len(h_len, r_len, n_refs))


def sentence_bleu_padded(
    tokens: np.ndarray, lengths: np.ndarray, refs: Sequence[Sequence[Sequence[int]]], max_order: int = 2
) -> np.ndarray:
    """``sentence_bleu`` of a generator's padded output: tokens (B, T) int, lengths (B,) real tokens per row
    (EOS and padding excluded), refs B lists of reference id arrays -> (B,) float64 in [0, 1]."""
    return sentence_bleu(tokens, refs, max_order=max_order, hyp_len=lengths)


def corpus_bleu(
    hyps: Sequence[Sequence[int]] | np.ndarray,
    refs: Sequence[Sequence[Sequence[int]]],
    max_order: int = 2,
    hyp_len: np.ndarray | Sequence[int] | None = None,
) -> float:
    """Corpus BLEU in [0, 1]: sacrebleu ``corpus_score`` / 100 on the space-joined ids (evaluation, not a hot path).

    Standard corpus settings: statistics summed over sentences, then one BP and one set of p_n; "exp"
    smoothing, no effective order (``BLEU(max_ngram_order=max_order, tokenize="none")``). Inputs as in
    ``sentence_bleu``; hypotheses with fewer references are padded with ``None`` (sacrebleu's convention
    for a variable number of references).
    """
    return corpus_bleu_parts(hyps, refs, max_order, hyp_len)["bleu"]


def corpus_bleu_parts(
    hyps: Sequence[Sequence[int]] | np.ndarray,
    refs: Sequence[Sequence[Sequence[int]]],
    max_order: int = 2,
    hyp_len: np.ndarray | Sequence[int] | None = None,
) -> dict:
    """``corpus_bleu`` and the factors of BLEU = BP · exp(mean log p_n) (module docstring), to tell a gain in
    n-gram precision from one in length: ``bleu`` and ``precisions`` (p_1..p_N) in [0, 1], ``bp``, ``hyp_len``
    (c, hypothesis tokens summed) and ``ref_len`` (r, the closest reference lengths summed)."""
    from sacrebleu.metrics import BLEU  # evaluation only: the reward path above needs numpy alone

    h_tok, h_len = _flatten_hyps(hyps, hyp_len)
    if len(h_len) == 0:
        raise ValueError("corpus_bleu needs at least one hypothesis")
    if len(refs) != len(h_len):
        raise ValueError(f"refs has {len(refs)} entries for {len(h_len)} hypotheses")
    if min(map(len, refs)) < 1:
        raise ValueError("every hypothesis needs at least one reference")
    ends = np.cumsum(h_len)
    hyp_str = [_join(h) for h in np.split(h_tok, ends[:-1])]
    width = max(map(len, refs))
    # sacrebleu wants reference *streams*: stream j holds the j-th reference of every sentence (or None).
    streams = [[_join(rs[j]) if j < len(rs) else None for rs in refs] for j in range(width)]
    score = BLEU(max_ngram_order=max_order, tokenize="none").corpus_score(hyp_str, streams)
    return {"bleu": score.score / 100, "precisions": [p / 100 for p in score.precisions], "bp": score.bp,
            "hyp_len": score.sys_len, "ref_len": score.ref_len}


# -- internals --------------------------------------------------------------------------------------------
def _join(seq: Sequence[int]) -> str:
    return " ".join(map(str, np.asarray(seq, dtype=np.int64).tolist()))


def _concat(seqs: Sequence[Sequence[int]]) -> np.ndarray:
    """Ragged id sequences -> their concatenation (N,) int64."""
    if seqs and isinstance(seqs[0], np.ndarray):  # only a matter of speed: both branches take either kind
        tok = np.concatenate(seqs)
        if tok.dtype.kind not in "iu":  # np.asarray([]) is float64: retry without the empty pieces
            tok = np.concatenate([np.zeros(0, dtype=np.int64), *(s for s in seqs if len(s))])
        return tok.astype(np.int64, casting="same_kind", copy=False)
    return np.fromiter(chain.from_iterable(seqs), dtype=np.int64)


def _flatten(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged sequences -> (concatenated ids (N,) int64, lengths (S,) int64)."""
    return _concat(seqs), np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))


def _flatten_hyps(hyps, hyp_len) -> tuple[np.ndarray, np.ndarray]:
    """A list of sequences, or a (B, T) array with optional lengths -> (ids (N_h,) int64, lengths (B,))."""
    if not isinstance(hyps, (list, tuple)) and getattr(hyps, "ndim", None) == 2:  # e.g. a CPU torch tensor
        hyps = np.asarray(hyps)
    if isinstance(hyps, np.ndarray) and hyps.ndim == 2:
        B, T = hyps.shape
        lens = np.full(B, T, dtype=np.int64) if hyp_len is None else np.asarray(hyp_len, dtype=np.int64)
        if lens.shape != (B,) or (B and (lens.min() < 0 or lens.max() > T)):
            raise ValueError(f"hyp_len must be (B,) = ({B},) with values in [0, {T}], got {lens}")
        mask = np.arange(T) < lens[:, None]  # row-major, so the kept ids stay grouped by row
        return hyps[mask].astype(np.int64, casting="same_kind", copy=False), lens
    if hyp_len is not None:
        raise ValueError("hyp_len is only for a padded (B, T) array of hypotheses")
    return _flatten(list(hyps))


def _dense_ids(tok: np.ndarray, limit: int) -> tuple[np.ndarray, int]:
    """Ids shifted to [0, V), or re-ranked to the ids present when V² would reach ``limit``; returns (ids, V)."""
    if len(tok) == 0:
        return tok, 1
    lo, hi = int(tok.min()), int(tok.max())
    if lo >= 0 and (hi + 1) ** 2 < limit:
        return tok, hi + 1
    if (hi - lo + 1) ** 2 < limit:
        return tok - lo, hi - lo + 1
    ranks = np.unique(tok, return_inverse=True)[1].reshape(-1)
    return ranks, int(ranks.max()) + 1


def _matches(tok, h_len, r_len, n_refs, max_order) -> np.ndarray:
    """Clipped matches m (B, N) as float64, N = max_order: Σ_g min(c_h(g), max_r c_r(g)) per row and order.

    tok (N_h + N_r,) holds the B hypotheses, then their references (row by row); h_len (B,), r_len (R,),
    n_refs (B,) their lengths and the references per row.

    Every n-gram g becomes one int64 ``v = key(g) << KB | row << SB | tag`` (tag 0 for the hypothesis,
    1 + j for the row's j-th reference). Sorted, equal v form runs whose lengths are the counts
    c(g, row, tag); the runs of one (g, row) are adjacent, the hypothesis run first, so c_h is the first run
    of a group and max_r c_r a ``maximum.reduceat`` over it. A reference token whose (id, row) the
    hypothesis lacks can match in no order: a hash table of the hypothesis (id, row) drops such tokens
    (most of them) and every n-gram containing one before anything is sorted. A hash collision only keeps
    a token that then finds no hypothesis run.
    """
    B, Nh, N = len(h_len), int(h_len.sum()), len(tok)
    SB = int(n_refs.max()).bit_length()  # tag bits: tags 0..max refs
    KB = SB + max(B - 1, 1).bit_length()  # tag and row bits
    first = np.cumsum(n_refs) - n_refs  # (B,) index of each row's first reference
    r_row = np.repeat(np.arange(B), n_refs)  # (R,) hypothesis row of each reference
    seq_code = np.concatenate([np.arange(B) << SB, (r_row << SB) | (1 + np.arange(len(r_len)) - first[r_row])])
    lens = np.concatenate([h_len, r_len])
    code = np.repeat(seq_code, lens)  # (N,) row << SB | tag of every token
    notlast = np.ones(N + max_order, dtype=bool)  # token is not the last of its sequence (padded with False)
    notlast[np.cumsum(lens)[lens > 0] - 1] = False
    notlast[N:] = False
    ids, V = _dense_ids(tok, _KEY_LIMIT >> KB)

    # Unigrams (id, row): the hypothesis' in a hash table; a reference token is kept if its (id, row) is there.
    v = (ids << KB) | code
    bits = min(max(10, (16 * Nh).bit_length()), 26)  # ≥ 16 slots per hypothesis token
    table = np.zeros(1 << bits, dtype=bool)
    table[_hash(v[:Nh], bits)] = True
    present = np.zeros(N + max_order, dtype=bool)
    present[:Nh] = True
    present[Nh:N] = table[_hash(v[Nh:] & ~((1 << SB) - 1), bits)]
    start = np.flatnonzero(present)  # candidate n-gram starts: every hypothesis token, kept reference tokens

    correct = np.zeros((B, max_order))
    key, K = ids[start], V  # key of the n-gram at each start, in [0, K)
    for n in range(1, max_order + 1):
        if not (h_len >= n).any():  # no hypothesis has an n-gram of this order (nor of a higher one)
            break
        if n > 1:  # extend by token start + n - 1: in the same sequence and present
            ok = notlast[start + n - 2] & present[start + n - 1]
            start, key = start[ok], key[ok]
            if K * V >= _KEY_LIMIT >> KB:  # re-rank the (n-1)-gram keys densely: K drops to ≤ N
                key = np.unique(key, return_inverse=True)[1].reshape(-1)
                K = int(key.max()) + 1
                if K * V >= _KEY_LIMIT >> KB:
                    raise ValueError("batch too large for int64 n-gram keys; score it in smaller chunks")
            key, K = key * V + ids[start + n - 1], K * V
        v = (key << KB) | code[start]
        v.sort()
        run = _run_starts(v)  # runs of equal v
        cnt = np.diff(run, append=len(v))  # c(g, row, tag)
        grp = v[run] >> SB  # key << (KB - SB) | row
        tag = v[run] & ((1 << SB) - 1)
        g0 = _run_starts(grp)  # first run of each (g, row)
        c_h = np.where(tag[g0] == 0, cnt[g0], 0)
        c_r = np.maximum.reduceat(np.where(tag > 0, cnt, 0), g0)
        m = np.minimum(c_h, c_r)
        hit = np.flatnonzero(m)
        correct[:, n - 1] = np.bincount(grp[g0[hit]] & ((1 << (KB - SB)) - 1), weights=m[hit], minlength=B)
    return correct


def _run_starts(x: np.ndarray) -> np.ndarray:
    """Indices where a run of equal values starts in a non-empty 1-D array."""
    new = np.empty(len(x), dtype=bool)
    new[0] = True
    np.not_equal(x[1:], x[:-1], out=new[1:])
    return np.flatnonzero(new)


def _hash(x: np.ndarray, bits: int) -> np.ndarray:
    """Multiplicative (Fibonacci) hash of non-negative int64 to [0, 2^bits)."""
    return (x.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits)


def _closest_ref_len(h_len: np.ndarray, r_len: np.ndarray, n_refs: np.ndarray) -> np.ndarray:
    """(B,) reference length closest to each hypothesis length; a tie goes to the shorter reference
    (sacrebleu ``BLEU._get_closest_ref_len``)."""
    h = np.repeat(h_len, n_refs)
    M = int(max(h_len.max(), r_len.max())) + 1
    score = np.abs(h - r_len) * M + r_len  # lexicographic (|c − r|, r) in one int64
    best = np.minimum.reduceat(score, np.cumsum(n_refs) - n_refs)
    return best % M


def _bleu_from_stats(correct: np.ndarray, h_len: np.ndarray, ref_len: np.ndarray) -> np.ndarray:
    """BLEU in [0, 1] from m (B, N), c (B,), r (B,) with exp smoothing and effective order."""
    N = correct.shape[1]
    total = np.maximum(h_len[:, None] - np.arange(N)[None, :], 0)  # (B, N) t_n = c − n + 1
    c = h_len.astype(np.float64)
    r = ref_len.astype(np.float64)
    bp = np.where(c < r, np.exp(1.0 - r / np.maximum(c, 1.0)), 1.0)  # c = 0 gives m_1 = 0, so BLEU = 0 below
    order = np.minimum(h_len, N)  # N' effective order: the orders with t_n > 0
    active = np.arange(N)[None, :] < order[:, None]  # (B, N)
    k = np.cumsum(active & (correct == 0), axis=1)  # the k-th unmatched order gets p_n = 1 / (2^k t_n)
    p = np.where(correct > 0, correct, 0.5**k) / np.maximum(total, 1)  # > 0 everywhere
    log_mean = np.where(active, np.log(p), 0.0).sum(axis=1) / np.maximum(order, 1)
    return np.where(correct[:, 0] > 0, bp * np.exp(log_mean), 0.0)
