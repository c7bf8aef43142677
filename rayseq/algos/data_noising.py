"""Data noising (unigram noising of Xie et al. 2017), as in ERPO (Tan et al. 2018) Sec. 3.5.

Every reference token y*_t (not the final EOS) is replaced, independently with probability γ
(``noise_gamma``), by a sample from the unigram frequency distribution u of the training targets; the
model is trained by MLE on the noised targets.

In the ERPO framework this is MLE's configuration (α → 0, β = 1) with the δ-reward R_δ (Eq. 6) relaxed
locally to (Eq. 9)

    R_δ^unigram(y|y*) = log( γ^|Δ| (1 − γ)^(T − |Δ|) Π_{y_t ∈ Δ} u(y_t) )   if T = T*, else −∞,

Δ = the positions where y differs from y*: with α → 0 the E-step's q is exp(R_δ^unigram), exactly the
distribution of the noised reference, and the M-step is MLE on its samples. (Eq. 9 counts a replacement
by the same token as unchanged; the sampler below may replace a token by itself, as Xie et al.'s does.)

u: token frequencies (ids ≥ 4, the specials excluded; EOS and padding not counted) over the targets of
``UNIGRAM_PROMPTS`` training pairs drawn once with a fixed seed (``UNIGRAM_SEED``), cached per task.

Split between processes: :meth:`DataNoising.augment` (driver, numpy only) noises the batch;
:meth:`DataNoising.update` (learner) is MLE on it (:class:`rayseq.algos.mle.MLE`).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from rayseq.algos.common import SupervisedAlgo
from rayseq.algos.mle import MLE
from rayseq.algos.raml import FIRST_WORD_ID, content_lengths
from rayseq.types import PromptBatch

UNIGRAM_PROMPTS = 20000
UNIGRAM_SEED = 20170424  # fixed: u does not depend on the run's seed


def unigram_distribution(task, n: int = UNIGRAM_PROMPTS, seed: int = UNIGRAM_SEED,
                         first_id: int = FIRST_WORD_ID) -> np.ndarray:
    """(V,) float64 unigram frequencies of the task's training target tokens (before EOS), 0 for ids < first_id."""
    V = len(task.vocab)
    batch = task.sample_prompts(np.random.default_rng(seed), n, with_targets=True)
    tgt = np.asarray(batch.tgt)
    L = content_lengths(tgt, batch.tgt_len, task.specials.eos)
    toks = tgt[np.arange(tgt.shape[1])[None, :] < L[:, None]]
    toks = toks[(toks >= first_id) & (toks < V)]
    counts = np.bincount(toks, minlength=V).astype(np.float64)
    if counts.sum() == 0:  # no word token at all: uniform over the non-special vocabulary
        counts[first_id:] = 1.0
    counts[:first_id] = 0.0
    return counts / counts.sum()


def unigram_noise(tgt: np.ndarray, L: np.ndarray, u_replace: np.ndarray, u_sample: np.ndarray, gamma: float,
                  unigram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pure, vectorised: (noised tgt, replaced mask), both (B, T).

    Position t < L[b] is replaced where u_replace[b, t] < γ, by the id i with cdf[i−1] <= u_sample[b, t] <
    cdf[i] (cdf = cumsum(unigram)); positions ≥ L (EOS, padding) are kept.
    """
    T = tgt.shape[1]
    replace = (u_replace < gamma) & (np.arange(T)[None, :] < np.asarray(L)[:, None])
    cdf = np.cumsum(unigram)
    last = int(np.nonzero(unigram > 0)[0][-1])  # u_sample ≥ cdf[-1] only through rounding
    new = np.minimum(np.searchsorted(cdf, u_sample, side="right"), last)
    return np.where(replace, new, tgt).astype(tgt.dtype), replace


class DataNoising(SupervisedAlgo):
    """MLE on unigram-noised references (ERPO Sec. 3.5, Eq. 9; Xie et al. 2017)."""

    name = "data_noising"
    fields = {
        "noise_gamma": (float, Field(
            0.1, ge=0.0, le=1.0, description="Data noising: probability γ that a reference token is replaced by a "
            "unigram sample (Xie et al. 2017; ERPO Sec. 3.5).")),
    }
    needs_targets = True

    def __init__(self, cfg, seed: int = 0):
        super().__init__(cfg, seed)
        self.mle = MLE(cfg, seed)
        self._unigram: tuple[object, np.ndarray] | None = None  # (task, u), estimated on first use

    def unigram(self, task) -> np.ndarray:
        """u of ``task`` (estimated once, then cached)."""
        if self._unigram is None or self._unigram[0] is not task:
            self._unigram = (task, unigram_distribution(task))
        return self._unigram[1]

    def augment(self, task, batch: PromptBatch, rng: np.random.Generator, iteration: int) -> tuple[PromptBatch, dict]:
        """(the batch with noised targets, same rows; metrics). Draws ``rng.random((B, T))`` twice, in order:
        the replacement uniforms, then the unigram-sample uniforms."""
        tgt = batch.tgt
        if tgt is None or batch.tgt_len is None:
            raise ValueError("data noising needs reference targets (PromptBatch.tgt, tgt_len)")
        u = self.unigram(task)
        L = content_lengths(tgt, batch.tgt_len, task.specials.eos)
        u_replace, u_sample = rng.random(tgt.shape), rng.random(tgt.shape)
        noised, replaced = unigram_noise(tgt, L, u_replace, u_sample, self.cfg.noise_gamma, u)
        n_tok = max(int(L.sum()), 1)
        out = PromptBatch(batch.src, batch.src_len, noised, batch.tgt_len, batch.key)
        return out, {
            "noise/replaced_frac": float(replaced.sum() / n_tok),
            "noise/changed_frac": float((noised != tgt).sum() / n_tok),
        }

    def update(self, state, batch: PromptBatch, iteration: int) -> dict:
        """MLE (teacher forcing) on the noised batch."""
        return self.mle.update(state, batch, iteration)
