"""Scheduled sampling (Bengio et al. 2015, "Scheduled Sampling for Sequence Prediction with Recurrent
Neural Networks"; the ERPO baseline of Tan et al. 2018, Supp. C.2).

Training stays on the reference y* (teacher forcing) except for the decoder's *inputs*: at step t ≥ 1
the input is, independently per row and step, the reference token y*_{t−1} with probability ε_i, or
else a token ŷ_{t−1} ~ softmax(logits_{t−1}) sampled from the model's own distribution at the previous
step (temperature 1, detached: no gradient flows through the choice or the sample). The loss is the NLL
of the *reference* token at every step given those inputs,

    L(θ) = − (1 / Σ_b |y*_b|) Σ_b Σ_{t ≤ |y*_b|} log p_θ(y*_t | x, z_<t),
    z_s = y*_s  with probability ε_i,  z_s = ŷ_s ~ p_θ(· | x, z_<s)  otherwise,

with |y*| counting the final EOS. The curriculum is the inverse-sigmoid decay (Bengio et al. Sec. 2.4,
ERPO Supp. C.2, k = 500 for translation, 600 for summarisation)

    ε_i = k / (k + exp(i / k)),

which starts at k/(k+1) ≈ 1 (pure teacher forcing), crosses 1/2 at i = k·ln k (≈ 3107 for k = 500) and
decays to 0. ε_i is the probability of the *reference* token, as in Bengio et al. (ERPO's sentence calls
it "the probability of sampling from model", which would start fully model-fed and contradict the
curriculum the decay is for; the ``ss_k`` field documents the Bengio reading used here).

Randomness: per update a ``torch.Generator`` seeded from the run's seed and the iteration draws ``coins`` (B, T)
(input at t ≥ 1 is the reference iff ``coins[:, t] < ε``) and ``uniforms`` (B, T) (``uniforms[:, t]`` picks the
model token fed at step t by inverse CDF, :func:`rayseq.models.sampling.sample_with_logp`); column 0
of both is unused (step 0's input is always BOS). A given (coins, uniforms) therefore fixes every
choice, which lets the batched decoder be checked exactly against a per-row loop.

Cost: one decoder step (:meth:`Seq2SeqGRU.decode_step`) per target position (T ≤ ~22), batched over rows; each
step's logits serve both the loss and, detached, the sample of the model-fed rows (one inverse-CDF draw on
those rows only). When no coin asks for a model token (ε = 1, or by chance) the single teacher-forced pass
:meth:`Seq2SeqGRU.logprobs` is used instead. Measured on CPU (1 thread, B = 128, T = 21, H = 128,
V = 4000) the step loop is not slower than that pass: the per-step (B, V) log-softmax stays in cache
where the (B, T, V) one does not.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from pydantic import Field

from rayseq.algos.common import LearnerState, SupervisedAlgo, grad_pass, optimizer_step
from rayseq.losses import token_nll_loss
from rayseq.models.sampling import sample_with_logp
from rayseq.seeding import derive_seed
from rayseq.types import PromptBatch, to_torch


def inverse_sigmoid_decay(i: int | float, k: float) -> float:
    """ε_i = k / (k + exp(i/k)) = σ(ln k − i/k), computed without overflow for large i."""
    if k <= 0:
        raise ValueError(f"k must be > 0, got {k}")
    x = math.log(k) - i / k
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def scheduled_sampling_logprobs(
    generator,
    src: torch.Tensor,
    src_len: torch.Tensor,
    tgt: torch.Tensor,
    eps: float,
    coins: torch.Tensor,
    uniforms: torch.Tensor,
    tgt_len: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step-by-step decoding on the reference ``tgt`` (B, T) with scheduled-sampling inputs, batched over rows.

    Returns ``(logp, model_fed)``: logp (B, T) = log p_θ(y*_t | x, z_<t) of the reference tokens, and
    model_fed (B, T) float, 1 at the steps whose input was the model's sample. The input at t ≥ 1 is
    the reference ``tgt[:, t−1]`` iff ``coins[:, t] < eps``, else the token drawn by inverse CDF with
    ``uniforms[:, t]`` from softmax of the step-(t−1) logits (temperature 1, banned ids excluded, as
    in :meth:`Seq2SeqGRU.sample`), detached. Works for GRU and LSTM states and any number of layers.

    ``tgt_len`` (B,) is optional: steps t ≥ tgt_len (after the reference's EOS, masked in any loss)
    then always take the reference input, are not sampled and have model_fed 0; logp at t < tgt_len is
    unchanged by it.
    """
    B, T = tgt.shape
    dev = tgt.device
    use_model = coins.to(dev) >= eps  # (B, T)
    use_model[:, 0] = False  # step 0's input is BOS
    if tgt_len is not None:
        use_model &= torch.arange(T, device=dev)[None, :] < tgt_len.to(dev)[:, None]
    if not bool(use_model.any()):  # every input is the reference: teacher forcing in one pass
        return grad_pass(generator, src, src_len, tgt).logp, use_model.float()

    uniforms = uniforms.to(dev)
    h = generator.encode(src, src_len)
    tok = torch.full((B,), generator.bos_id, dtype=torch.long, device=dev)
    logps = []
    for t in range(T):
        logits, _, h = generator.decode_step(tok, h)  # _logits: dropout, banned ids at −inf
        logps.append(generator.token_logp(logits, tgt[:, t]))
        if t + 1 == T:
            break
        tok = tgt[:, t]
        rows = use_model[:, t + 1].nonzero().squeeze(1)
        if rows.numel():  # the next input of these rows: a sample of this step's distribution, detached
            with torch.no_grad():
                sampled, _ = sample_with_logp(logits.detach().index_select(0, rows),
                                              uniforms[:, t + 1].index_select(0, rows))
            tok = tok.index_copy(0, rows, sampled)
    logp = torch.stack(logps, 1)
    return logp, use_model.float()


class ScheduledSampling(SupervisedAlgo):
    """Learner-side update: NLL of y* under scheduled-sampling inputs with ε_i = inverse_sigmoid_decay(i, ss_k)."""

    name = "scheduled_sampling"
    fields = {
        "ss_k": (float, Field(
            500.0, gt=0, description="Scheduled sampling: k of the inverse-sigmoid decay ε_i = k/(k + exp(i/k)), the "
            "probability of feeding the reference token at iteration i (ERPO Supp. C.2: 500).")),
    }
    needs_targets = True

    def epsilon(self, iteration: int) -> float:
        return inverse_sigmoid_decay(iteration, self.cfg.ss_k)

    def update(self, state: LearnerState, batch: PromptBatch, iteration: int) -> dict:
        """One Adam step on ``batch`` (with targets). Metrics: loss/nll (per real token), ss/epsilon (ε_i),
        ss/model_fed_frac (share of real target tokens whose input was a model sample; step 0 never is),
        policy/grad_norm (before clipping at ``max_grad_norm``), data/tokens."""
        dev = state.device
        tgt = to_torch(batch.tgt, dev)
        tgt_len = to_torch(batch.tgt_len, dev)
        B, T = tgt.shape
        mask = (torch.arange(T, device=dev)[None, :] < tgt_len[:, None]).float()
        eps = self.epsilon(iteration)
        g = torch.Generator().manual_seed(derive_seed(self.seed, "scheduled_sampling", iteration))
        coins = torch.rand(B, T, generator=g)  # drawn on the CPU: the same on every device
        uniforms = torch.rand(B, T, generator=g)
        logp, model_fed = scheduled_sampling_logprobs(
            state.generator, to_torch(batch.src, dev), to_torch(batch.src_len, dev), tgt, eps, coins, uniforms,
            tgt_len=tgt_len,
        )
        loss, stats = token_nll_loss(logp, mask)
        grad_norm = optimizer_step(state.gen_opt, loss, state.generator.parameters(), self.cfg.max_grad_norm)
        return {
            "loss/nll": float(stats.nll),
            "ss/epsilon": eps,
            "ss/model_fed_frac": float((model_fed * mask).sum() / mask.sum().clamp(min=1.0)),
            "policy/grad_norm": grad_norm,
            "data/tokens": float(np.sum(batch.tgt_len)),
        }


__all__ = ["ScheduledSampling", "inverse_sigmoid_decay", "scheduled_sampling_logprobs"]
