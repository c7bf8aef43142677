"""Reward-augmented maximum likelihood (RAML; Norouzi et al. 2016), as in ERPO (Tan et al. 2018) Sec. 3.3.

RAML maximises the likelihood of samples from the exponentiated reward distribution around each reference
(ERPO Eq. 7):

    L_RAML(θ) = E_{y ~ e(y|y*)} [log p_θ(y | x)],      e(y|y*) ∝ exp{R(y|y*) / τ}.

In the ERPO framework (Eqs. 1-2) this is the configuration (R = the task reward, α → 0, β = τ) (Sec. 3.3
and its footnote 3): with α → 0 the E-step's q ignores the model and equals e(y|y*), and the M-step is
MLE on samples of q. MLE is the same configuration with the δ-reward R_δ (Eq. 6) instead of R.

Sampling from e(y|y*) follows the n-gram replacement sampler of Ma et al. (2017) that the ERPO authors
used (Supplement C.2: 10 samples per example, τ = 0.4): per example, a pool of ``raml_pool`` candidates —
the reference itself and ``raml_pool − 1`` copies of it with one n-gram replaced by uniformly drawn
non-special tokens — is scored with the task reward R(y|y*), and ``raml_samples`` candidates are drawn
with replacement with probabilities softmax(R/τ) over the pool (e(y|y*) restricted to the pool).

The replacement (per candidate, L = the reference's tokens before its final EOS):
- n uniform in 1..min(L − 1, raml_max_ngram) (1 when L = 1; no replacement when L = 0),
- start uniform in 0..L − n,
- tokens start..start+n−1 replaced by ids drawn uniformly from the non-special vocabulary (ids ≥ 4).
The final EOS (when the reference ends in one; counting's references have none) is never replaced, so
every candidate keeps the reference's length.

Split between processes: :meth:`RAML.augment` (driver, numpy only) builds the batch of samples;
:meth:`RAML.update` (learner) is MLE on it (:class:`rayseq.algos.mle.MLE`).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from rayseq.algos.common import SupervisedAlgo
from rayseq.algos.mle import MLE
from rayseq.types import PromptBatch

FIRST_WORD_ID = 4  # ids 0..3 are <pad>, <bos>, <eos>, <unk> (rayseq.vocab.Specials)


# -- helpers shared with data noising -----------------------------------------------------------------
def content_lengths(tgt: np.ndarray, tgt_len: np.ndarray, eos: int) -> np.ndarray:
    """(B,) L: real tokens before the final EOS (tgt_len − 1 when the last real token is EOS, else tgt_len)."""
    tgt_len = np.asarray(tgt_len, dtype=np.int64)
    last = tgt[np.arange(len(tgt_len)), np.maximum(tgt_len - 1, 0)]
    return tgt_len - ((tgt_len > 0) & (last == eos)).astype(np.int64)


def length_mask(lengths: np.ndarray, width: int) -> np.ndarray:
    """(B, width) float32, 1 for the first ``lengths[b]`` positions."""
    return (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)


# -- the n-gram replacement sampler (Ma et al. 2017) --------------------------------------------------
def draw_ngram_params(rng: np.random.Generator, L: np.ndarray, k: int, max_ngram: int, vocab_size: int,
                      first_id: int = FIRST_WORD_ID) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random draws of ``k`` n-gram replacements per example, in a fixed order:

    1. ``rng.random((B, k))`` → n = 1 + ⌊u·n_max⌋, n_max = max(1, min(L − 1, max_ngram)) (n = 0 where L = 0),
    2. ``rng.random((B, k))`` → start = ⌊u·(L − n + 1)⌋, uniform in 0..L − n,
    3. ``rng.integers(first_id, vocab_size, (B, k, max_ngram))`` → the new ids (the first n are used).

    Returns n (B, k), start (B, k), new_ids (B, k, max_ngram), all int64.
    """
    L = np.asarray(L, dtype=np.int64)
    B = len(L)
    if vocab_size <= first_id:
        raise ValueError(f"vocabulary of {vocab_size} ids has no non-special token (ids >= {first_id})")
    n_max = np.where(L > 0, np.maximum(1, np.minimum(L - 1, max_ngram)), 0)
    n = 1 + np.floor(rng.random((B, k)) * n_max[:, None]).astype(np.int64)
    n = np.where(L[:, None] > 0, np.minimum(n, n_max[:, None]), 0)
    span = L[:, None] - n + 1
    start = np.minimum(np.floor(rng.random((B, k)) * span).astype(np.int64), span - 1)
    new_ids = rng.integers(first_id, vocab_size, size=(B, k, max_ngram), dtype=np.int64)
    return n, start, new_ids


def ngram_replace(tgt: np.ndarray, n: np.ndarray, start: np.ndarray, new_ids: np.ndarray) -> np.ndarray:
    """(B, k, T) candidates: candidate (b, j) is ``tgt[b]`` with positions start[b,j] .. start[b,j]+n[b,j]−1
    replaced by new_ids[b, j, :n[b,j]] (n = 0: the reference unchanged). Pure; vectorised."""
    T = tgt.shape[1]
    offset = np.arange(T)[None, None, :] - start[:, :, None]  # (B, k, T) position within the n-gram
    inside = (offset >= 0) & (offset < n[:, :, None])
    repl = np.take_along_axis(new_ids, np.clip(offset, 0, new_ids.shape[2] - 1), axis=2)
    return np.where(inside, repl, tgt[:, None, :]).astype(tgt.dtype)


def raml_pool(rng: np.random.Generator, tgt: np.ndarray, tgt_len: np.ndarray, pool: int, max_ngram: int,
              vocab_size: int, eos: int) -> np.ndarray:
    """(B, pool, T): the reference (candidate 0) and ``pool − 1`` n-gram replacements of it."""
    L = content_lengths(tgt, tgt_len, eos)
    n, start, new_ids = draw_ngram_params(rng, L, pool - 1, max_ngram, vocab_size)
    return np.concatenate([tgt[:, None, :], ngram_replace(tgt, n, start, new_ids)], axis=1)


# -- sampling from e(y|y*) ∝ exp(R/τ) on the pool -----------------------------------------------------
def exp_reward_probs(R: np.ndarray, tau: float) -> np.ndarray:
    """(B, P) softmax(R/τ) over each row (numerically stable)."""
    z = np.asarray(R, dtype=np.float64) / tau
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


def categorical_from_uniforms(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """(B, k) inverse-CDF draws: index i of row b with cdf[b, i−1] <= u[b, j] < cdf[b, i]. Pure."""
    cdf = np.cumsum(probs, axis=1)
    idx = (u[:, :, None] >= cdf[:, None, :]).sum(axis=2)
    return np.minimum(idx, probs.shape[1] - 1)  # u ≥ cdf[-1] only through rounding


def sample_exponentiated(rng: np.random.Generator, R: np.ndarray, tau: float, k: int) -> np.ndarray:
    """(B, k) pool indices drawn with replacement with probabilities softmax(R/τ) (``rng.random((B, k))``)."""
    return categorical_from_uniforms(exp_reward_probs(R, tau), rng.random((len(R), k)))


def distinct_per_row(seqs: np.ndarray) -> np.ndarray:
    """(B,) number of distinct sequences among seqs[b] of shape (B, k, T)."""
    B, k, T = seqs.shape
    rows = np.concatenate([np.repeat(np.arange(B), k)[:, None], seqs.reshape(B * k, T)], axis=1)
    uniq = np.unique(rows, axis=0)
    return np.bincount(uniq[:, 0], minlength=B)


class RAML(SupervisedAlgo):
    """RAML: MLE on samples of e(y|y*) ∝ exp(R(y|y*)/τ) (ERPO Eq. 7; R = task reward, α → 0, β = τ)."""

    name = "raml"
    fields = {
        "raml_tau": (float, Field(
            0.4, gt=0, description="RAML: temperature τ of e(y|y*) ∝ exp(R(y|y*)/τ) (ERPO Supp. C.2: 0.4).")),
        "raml_samples": (int, Field(
            10, ge=1, description="RAML: samples drawn from e(y|y*) per example (ERPO Supp. C.2: 10).")),
        "raml_pool": (int, Field(
            100, ge=2, description="RAML: n-gram-replacement candidates per example (the reference is one of them) "
            "among which the samples are drawn by exp(R/τ) (Ma et al. 2017's sampler: 100).")),
        "raml_max_ngram": (int, Field(4, ge=1, description="RAML: longest replaced n-gram (Ma et al. 2017: 4).")),
    }
    needs_targets = True
    needs_task_reward = True  # the pool is weighted by exp(R/τ)

    def __init__(self, cfg, seed: int = 0):
        super().__init__(cfg, seed)
        self.mle = MLE(cfg, seed)

    def augment(self, task, batch: PromptBatch, rng: np.random.Generator, iteration: int) -> tuple[PromptBatch, dict]:
        """(B·raml_samples rows: the samples of each example in consecutive rows, inputs/lengths/key repeated;
        metrics). Draws, in order: the pool's n-gram replacements (:func:`draw_ngram_params`), then the
        samples' uniforms (:func:`sample_exponentiated`)."""
        c = self.cfg
        tgt, tgt_len = batch.tgt, np.asarray(batch.tgt_len, dtype=np.int64)
        if tgt is None or tgt_len is None:
            raise ValueError("RAML needs reference targets (PromptBatch.tgt, tgt_len)")
        B, T = tgt.shape
        P, k = c.raml_pool, c.raml_samples
        cands = raml_pool(rng, tgt, tgt_len, P, c.raml_max_ngram, len(task.vocab), task.specials.eos)
        flat = batch.repeat(P, tgt=cands.reshape(B * P, T))
        _, score = task.rewards(flat.src, flat.src_len, flat.tgt, length_mask(flat.tgt_len, T), key=flat.key)
        R = np.asarray(score, dtype=np.float64).reshape(B, P)
        idx = sample_exponentiated(rng, R, c.raml_tau, k)  # (B, k)
        drawn = np.take_along_axis(cands, idx[:, :, None], axis=1)  # (B, k, T)
        out = batch.repeat(k, tgt=drawn.reshape(B * k, T))
        metrics = {
            "raml/reward_mean": float(np.take_along_axis(R, idx, axis=1).mean()),
            "raml/reward_ref": float(R[:, 0].mean()),
            "raml/reward_pool": float(R.mean()),
            "raml/unique_frac": float((distinct_per_row(drawn) / k).mean()),
            "raml/rows": float(B * k),
        }
        return out, metrics

    def update(self, state, batch: PromptBatch, iteration: int) -> dict:
        """MLE (teacher forcing) on the augmented batch."""
        return self.mle.update(state, batch, iteration)
