"""Token-level sentence-BLEU increments ΔR(v | prefix) for every candidate next token v, in one call.

ERPO (Tan, Hu, Wang, Zhou & Song, "Connecting the Dots Between MLE and RL for Sequence Generation", 2018)
spreads the sequence reward R over tokens as increments (Eq. 3-4; Supplement, Algorithm 1, line 9)::

    ΔR(y_t | y_1:t−1, y*) = R(y_1:t, y*) − R(y_1:t−1, y*)

and samples the next token with probability ∝ exp(c · ΔR(v | y_1:t−1, y*)), which needs ΔR for *every* v in
the vocabulary at every step. Here R is exactly ``rayseq.rewards.bleu.sentence_bleu`` (sacrebleu sentence
BLEU, effective order, "exp" smoothing, in [0, 1]; R of the empty prefix is 0)::

    bleu_increments(prefix, prefix_len, refs, V)[i, v]
        == sentence_bleu([p_i + [v]], [refs[i]]) − sentence_bleu([p_i], [refs[i]]),   p_i = prefix[i, :prefix_len[i]]

How it is fast: appending v gives every order n exactly one new hypothesis n-gram g_n = (ctx_n, v), ctx_n the
last n − 1 prefix tokens, and the clipped matches grow, m_n' = m_n + [c_p(g_n) < max_r c_r(g_n)] (c_p, c_r:
counts in the prefix and in reference r). A token that occurs in none of the row's references matches
nothing, so all those tokens share one "no-match" value (length |p| + 1, matches unchanged). Within a row
ctx_n is fixed, so g_n is identified by (row, v): the only g_n with max_r c_r > 0 come from reference
n-grams that start with ctx_n, and their counts are run lengths of (row, v[, reference]) keys. Everything is
vectorised over the batch (no Python loop over rows):

  1. m_n of every prefix by ``bleu._matches`` (the sort-based clipped-match counter of ``sentence_bleu``);
  2. per order n: the reference n-grams starting with the row's ctx_n give max_r c_r(ctx_n, v) per (row, v)
     (``np.unique`` counts, ``maximum.reduceat`` over references), the prefix windows starting with ctx_n
     give c_p(ctx_n, v); a (row, v) with c_p < max_r c_r gains a match of order n;
  3. the B prefixes, B no-match entries and the K gaining (row, v) are scored in one ``bleu._bleu_from_stats``
     call (hypothesis length |p| + 1 for every candidate, so the closest reference length is shared within a
     row), and the candidates are scattered into a (B, V) array filled with the row's no-match value.

Speed (a 2-core VM, numpy 2.4, Python 3.11, ``python -m
rayseq.rewards.bleu_delta``, median of 200 calls; prefixes of length 0..22, 1-3 references of 7-13 tokens
per row drawn partly from the prefix so that matches happen; ``_benchmark``), V = 4,000:

    B = 128: 1.6 ms (max_order = 2), 2.2 ms (max_order = 4);   B = 256: 2.6 ms, 3.6 ms

(a Python loop over rows with per-row n-gram Counters took 6.0 ms at B = 128, max_order = 2.) Filling the
(B, V) float32 output is ~0.1 ms of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

from rayseq.rewards.bleu import _bleu_from_stats, _closest_ref_len, _concat, _matches


def bleu_increments(
    prefix: np.ndarray,
    prefix_len: np.ndarray,
    refs: Sequence[Sequence[np.ndarray]],
    vocab_size: int,
    max_order: int = 2,
) -> np.ndarray:
    """prefix (B, T) int64 token ids (padding after prefix_len ignored), prefix_len (B,) int64 ≥ 0,
    refs: B lists of reference id arrays (each list non-empty), -> (B, vocab_size) float32 ΔR.

    ``out[i, v] = BLEU(p_i + [v], refs[i]) − BLEU(p_i, refs[i])``, p_i = prefix[i, :prefix_len[i]], BLEU =
    ``sentence_bleu(..., max_order=max_order)``: ERPO's token-level reward increment ΔR(v | p_i, y*) (Tan
    et al. 2018, Eq. 3-4; Supplement Algorithm 1, line 9). Every id, special and pad ids included, is an
    ordinary token; reference ids must lie in [0, vocab_size) (prefix ids may be anything).
    """
    P = np.asarray(prefix)
    if P.ndim != 2 or P.dtype.kind not in "iu":
        raise ValueError(f"prefix must be a (B, T) integer array, got shape {P.shape}, dtype {P.dtype}")
    P = P.astype(np.int64, copy=False)
    B, T = P.shape
    L = np.asarray(prefix_len, dtype=np.int64)
    if L.shape != (B,) or (B and (L.min() < 0 or L.max() > T)):
        raise ValueError(f"prefix_len must be (B,) = ({B},) with values in [0, {T}], got {L}")
    if len(refs) != B:
        raise ValueError(f"refs has {len(refs)} entries for {B} prefixes (one list of references per row)")
    n_refs = np.fromiter(map(len, refs), dtype=np.int64, count=B)
    if B and n_refs.min() < 1:
        raise ValueError(f"row {int(np.argmin(n_refs))} has no reference (sentence BLEU needs at least one)")
    if max_order < 1:
        raise ValueError(f"max_order must be >= 1, got {max_order}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if B == 0:
        return np.zeros((0, vocab_size), dtype=np.float32)
    V, N = int(vocab_size), max_order

    flat_refs = list(chain.from_iterable(refs))
    r_len = np.fromiter(map(len, flat_refs), dtype=np.int64, count=len(flat_refs))
    rt = _concat(flat_refs)  # (N_r,) every reference token, row by row
    if len(rt) and (rt.min() < 0 or rt.max() >= V):
        raise ValueError(f"reference ids must lie in [0, {V}), got {int(rt.min())}..{int(rt.max())}")

    # 1. Clipped matches m_n of the prefixes.
    in_prefix = np.arange(T) < L[:, None]
    matches = _matches(np.concatenate([P[in_prefix], rt]), L, r_len, n_refs, N)  # (B, N) float64

    # 2. Per order, the (row, v) whose new n-gram (ctx_n, v) adds a match; keys row · V + v.
    first = np.cumsum(n_refs) - n_refs  # (B,) index of each row's first reference
    ref_row = np.repeat(np.arange(B), n_refs)  # (R,)
    t_row = np.repeat(ref_row, r_len)  # (N_r,) row of each reference token
    t_ref = np.repeat(np.arange(len(r_len)) - first[ref_row], r_len)  # its reference's index j within the row
    t_end = np.repeat(np.cumsum(r_len), r_len)  # end (exclusive) of its reference in rt
    J = int(n_refs.max())
    rows = np.arange(B)
    gain_key, gain_order = [], []
    for n in range(1, N + 1):
        if not (L >= n - 1).any():  # no prefix has the n − 1 tokens of a context (nor for higher orders)
            break
        # ctx[k] (B,): token k of each row's context ctx_n = p[L − n + 1 : L] (garbage where L < n − 1)
        ctx = [P[rows, np.clip(L - n + 1 + k, 0, T - 1)] for k in range(n - 1)]
        # Reference side: starts s of n-grams (ctx_n, v) inside one reference, in rows with L ≥ n − 1.
        s = np.flatnonzero((np.arange(len(rt)) + n <= t_end) & (L[t_row] >= n - 1))
        for k in range(n - 1):
            s = s[rt[s + k] == ctx[k][t_row[s]]]
        if len(s) == 0:
            continue
        rv = t_row[s] * V + rt[s + n - 1]  # (row, v) of each matching reference n-gram
        uk, uc = np.unique(rv * J + t_ref[s], return_counts=True)  # c_r(ctx_n, v) per (row, v, reference)
        g = uk // J
        g0 = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        key, ref_max = g[g0], np.maximum.reduceat(uc, g0)  # max_r c_r(ctx_n, v) per (row, v), keys sorted
        # Prefix side: windows p[w : w + n] inside the prefix that start with ctx_n; c_p(ctx_n, v).
        W = max(T - n + 1, 0)
        ok = np.arange(W)[None, :] <= (L - n)[:, None]
        for k in range(n - 1):
            ok &= P[:, k : k + W] == ctx[k][:, None]
        last = P[:, n - 1 : n - 1 + W]
        ok &= (last >= 0) & (last < V)  # other ids equal no reference token (and would alias keys)
        pk = np.sort((rows[:, None] * V + last)[ok])
        c_p = np.searchsorted(pk, key, side="right") - np.searchsorted(pk, key, side="left")
        gain = c_p < ref_max
        gain_key.append(key[gain])
        gain_order.append(np.full(int(gain.sum()), n - 1))

    cand, inv = np.unique(np.concatenate([np.zeros(0, dtype=np.int64), *gain_key]), return_inverse=True)
    inc = np.zeros((len(cand), N))
    if len(cand):
        inc[inv.reshape(-1), np.concatenate(gain_order)] = 1.0
    row, tok = cand // V, cand % V

    # 3. Score prefixes, no-match entries and candidates in one call.
    ref_now = _closest_ref_len(L, r_len, n_refs)  # r for c = |p|
    ref_next = _closest_ref_len(L + 1, r_len, n_refs)  # r for c = |p| + 1, every candidate of the row
    score = _bleu_from_stats(
        np.concatenate([matches, matches, matches[row] + inc]),
        np.concatenate([L, L + 1, L[row] + 1]),
        np.concatenate([ref_now, ref_next, ref_next[row]]),
    )
    base, no_match, cand_score = score[:B], score[B : 2 * B], score[2 * B :]
    out = np.empty((B, V), dtype=np.float32)
    out[:] = (no_match - base)[:, None]
    out[row, tok] = cand_score - base[row]
    return out


def _benchmark(B: int = 128, V: int = 4000, max_order: int = 2, repeats: int = 200, seed: int = 0) -> float:
    """Median seconds per ``bleu_increments`` call on random rows shaped like the chatbot task."""
    import time

    rng = np.random.default_rng(seed)
    T = 22
    prefix = rng.integers(0, V, (B, T))
    lens = rng.integers(0, T + 1, B)
    refs = []
    for i in range(B):  # references share tokens with the prefix so that matches happen
        pool = np.concatenate([prefix[i, : lens[i]], rng.integers(0, V, 10)])
        refs.append([rng.choice(pool, int(rng.integers(7, 14))) for _ in range(int(rng.integers(1, 4)))])
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        bleu_increments(prefix, lens, refs, V, max_order)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


if __name__ == "__main__":
    for b in (128, 256):
        for order in (2, 4):
            print(f"B={b}, V=4000, max_order={order}: {_benchmark(B=b, max_order=order) * 1e3:.2f} ms per call")
