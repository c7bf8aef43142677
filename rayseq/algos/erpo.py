"""ERPO's token-level sampling distribution q and its M-step (Tan, Hu, Yang, Salakhutdinov & Xing 2018,
"Connecting the Dots Between MLE and RL for Sequence Generation"), shared by ``spg`` and
``erpo_interpolation``.

The E-step of the generalised entropy-regularised policy optimisation (Eq. 2), written per token (Eq. 4):

    q(y|x) ∝ Π_t exp{ (α · log p_θ(y_t | y_1:t−1, x) + ΔR(y_t | y_1:t−1, y*)) / (α + β) }
    ΔR(y_t | y_1:t−1, y*) = R(y_1:t | y*) − R(y_1:t−1 | y*)                                   (Eq. 3)

and the M-step maximises log p_θ(y|x) of samples y ~ q. Here R is the task's sentence BLEU-2 in [0, 1]
against all references of the input (the chatbot reward; :func:`rayseq.rewards.bleu_delta.bleu_increments`
computes ΔR for every candidate token at once). The end token adds no reply token, so ΔR(EOS) = 0;
<pad> and <bos> are never sampled (the model's ``logit_bias``, also in the reward-only branch).

- ``mode="spg"`` (Sec. 3.4, α = 1, β = 0): q_t(v) ∝ p_θ(v) · exp(c · ΔR(v)), a product of experts
  (Ding & Soricut 2017's softmax policy gradient); c = ``algo.erpo_c`` scales the reward (1 in Eq. 4).
- ``mode="interpolation"`` (Sec. 4, Supplement Algorithm 1): per token z ~ Cat(λ1, λ2, λ3) (spike and
  slab): z = 1 draws v ∝ exp{c · log p_θ(v)}, z = 2 draws v ∝ exp{c · ΔR(v)}, z = 3 takes the reference
  token y*_t (the end token once the reference is used up).

Sampling runs on the rollout workers (the model and the references are there), as the algorithms' requests ask
(:class:`QSampler`); one uniform per row and step picks the token by inverse CDF, another picks z.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pydantic import Field

from rayseq.algos.common import LearnerState
from rayseq.algos.mle import MLE
from rayseq.algos.sampling import Sampled, SamplingCall
from rayseq.models.generator import SampleOutput
from rayseq.models.sampling import sample_with_logp
from rayseq.rewards.bleu_delta import bleu_increments
from rayseq.types import PromptBatch, Rollout, to_torch

MODES = ("spg", "interpolation")
# the scale c of q's exponents (Eq. 4), read by both modes' rollout requests
ERPO_C_FIELD = {
    "erpo_c": (float, Field(
        1.0, gt=0, description="SPG / interpolation: scale c of the sampling distributions exp{c·(…)} (ERPO Eq. 4, "
        "Supp. Alg. 1; ΔR is sentence BLEU in [0, 1], as the authors' code).")),
}


def _delta_r(task, prefix: np.ndarray, plen: np.ndarray, keys: np.ndarray, V: int, specials) -> torch.Tensor:
    """ΔR (n, V) float32 for the rows given: BLEU increments against the inputs' references; EOS 0."""
    refs = task.references(keys)
    dr = bleu_increments(prefix, plen, refs, V)
    dr[:, specials.eos] = 0.0
    return torch.from_numpy(dr)


@torch.no_grad()
def erpo_sample(
    model,
    src: torch.Tensor,
    src_len: torch.Tensor,
    max_len: int,
    *,
    prompts: PromptBatch,
    task,
    mode: str,
    c: float = 1.0,
    lambdas: tuple[float, float, float] = (0.0, 0.0, 1.0),
    generator_rng: torch.Generator | None = None,
) -> tuple[SampleOutput, dict]:
    """Decode one reply per input from ERPO's q (module docstring); returns the sample (logp under π_θ)
    and the share of tokens each source chose (``erpo/z_model``, ``erpo/z_reward``, ``erpo/z_ref``)."""
    if mode not in MODES:
        raise ValueError(f"erpo mode must be one of {MODES}, got {mode!r}")
    if prompts.key is None:
        raise ValueError("ERPO sampling needs PromptBatch.key (the input's references)")
    lam = torch.tensor(lambdas, dtype=torch.float64)
    if mode == "interpolation":
        if prompts.tgt is None:
            raise ValueError("interpolation needs reference targets (PromptBatch.tgt)")
        if (lam < 0).any() or abs(float(lam.sum()) - 1.0) > 1e-6:
            raise ValueError(f"interpolation lambdas must be a distribution, got {lambdas}")
    sp = task.specials
    B, V, dev = src.shape[0], model.vocab_size, src.device
    h = model.encode(src, src_len)
    tok = torch.full((B,), model.bos_id, dtype=torch.long, device=dev)
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    prefix = np.zeros((B, max_len), dtype=np.int64)  # reply tokens so far (EOS excluded)
    plen = np.zeros(B, dtype=np.int64)
    keys = np.asarray(prompts.key)
    tgt = None if prompts.tgt is None else to_torch(prompts.tgt, dev)
    cum = lam.cumsum(0)
    counts = torch.zeros(3, dtype=torch.float64)
    tokens, token_mask, logps = [], [], []
    for t in range(max_len):
        logits, _, h = model.decode_step(tok, h)
        logp_all = torch.log_softmax(logits, dim=-1)
        u = torch.rand(B, generator=generator_rng, device=dev)  # picks the token
        uz = torch.rand(B, generator=generator_rng, device=dev, dtype=torch.float64)  # picks z (interpolation)
        if mode == "spg":
            z = torch.full((B,), 1, dtype=torch.long, device=dev)
            rows = alive.nonzero().squeeze(1)
            q = logp_all[rows]
            if len(rows):
                r = rows.cpu().numpy()
                q = q + c * _delta_r(task, prefix[r], plen[r], keys[r], V, sp).to(dev)
            nxt = torch.full((B,), sp.pad, dtype=torch.long, device=dev)
            nxt[rows] = sample_with_logp(q, u[rows])[0]
        else:
            z = torch.searchsorted(cum.to(dev), uz[:, None], right=True).squeeze(1).clamp_(max=2) + 1  # 1, 2, 3
            nxt = torch.full((B,), sp.pad, dtype=torch.long, device=dev)
            m1 = (z == 1) & alive
            if m1.any():
                nxt[m1] = sample_with_logp(c * logp_all[m1], u[m1])[0]
            m2 = (z == 2) & alive
            if m2.any():
                r = m2.nonzero().squeeze(1).cpu().numpy()
                q = c * _delta_r(task, prefix[r], plen[r], keys[r], V, sp).to(dev) + model.logit_bias
                nxt[m2] = sample_with_logp(q, u[m2])[0]
            m3 = (z == 3) & alive
            if m3.any():
                ref = tgt[:, t] if t < tgt.shape[1] else torch.full((B,), sp.eos, device=dev, dtype=torch.long)
                ref = torch.where(ref == sp.pad, torch.full_like(ref, sp.eos), ref)  # past the reference: end
                nxt[m3] = ref[m3]
        nxt = torch.where(alive, nxt, torch.full_like(nxt, sp.pad))
        counts += torch.bincount((z - 1)[alive].cpu(), minlength=3).double()
        tokens.append(nxt)
        token_mask.append(alive.float())
        logps.append(torch.where(alive, logp_all.gather(1, nxt[:, None]).squeeze(1), 0.0))
        grow = (alive & (nxt != sp.eos)).cpu().numpy()
        prefix[grow, plen[grow]] = nxt.cpu().numpy()[grow]
        plen += grow
        alive = alive & (nxt != sp.eos)
        tok = nxt
        if not alive.any():
            break
    mask = torch.stack(token_mask, 1)
    total = max(float(counts.sum()), 1.0)
    stats = {} if mode == "spg" else {"erpo/z_model": float(counts[0]) / total,
                                      "erpo/z_reward": float(counts[1]) / total, "erpo/z_ref": float(counts[2]) / total}
    return SampleOutput(torch.stack(tokens, 1), mask, mask.clone(), torch.stack(logps, 1)), stats


@dataclass(frozen=True)
class QSampler:
    """The rollout workers' draw for SPG and the interpolation algorithm: one reply per input from ERPO's q
    (Eq. 4; the module docstring), in place of π_θ, with the request's random stream. ``mode`` ``"spg"``:
    q_t(v) ∝ p_θ(v) · exp(c · ΔR(v)); ``"interpolation"``: per token z ~ Cat(``lambdas``) picks the model
    (∝ exp{c · log p_θ}), the reward (∝ exp{c · ΔR}) or the reference token. The replies carry log π_θ; the info
    the share of tokens each source chose (interpolation). Nothing beside the replies is scored."""

    mode: str
    c: float = 1.0
    lambdas: tuple[float, float, float] = (0.0, 0.0, 1.0)  # (λ1 model, λ2 reward, λ3 reference): interpolation

    def sample(self, call: SamplingCall) -> Sampled:
        out, stats = erpo_sample(call.policy, call.src, call.src_len, call.max_len, prompts=call.prompts,
                                 task=call.task, mode=self.mode, c=self.c, lambdas=self.lambdas, generator_rng=call.rng)
        return Sampled(out, info=stats)

    def score(self, task, rollout: Rollout) -> None:
        """Nothing beside the replies to score."""


def mle_on_samples(state: LearnerState, rollout: Rollout, max_grad_norm: float | None) -> dict:
    """ERPO's M-step: maximise log p_θ(y|x) of the sampled replies (MLE's update with them as targets)."""
    samples = PromptBatch(rollout.src, rollout.src_len, tgt=rollout.tokens,
                          tgt_len=(rollout.token_mask > 0).sum(1).astype(np.int64))
    m = MLE(max_grad_norm=max_grad_norm).update(state, samples, 0)
    info = rollout.info.get("parts", [rollout.info])
    z = {k: float(np.mean([p.get(k, np.nan) for p in info])) for k in ("erpo/z_model", "erpo/z_reward", "erpo/z_ref")}
    return {
        "rollout/reward_mean": float(rollout.score.mean()),
        "rollout/len_mean": float(rollout.token_mask.sum(1).mean()),
        "loss/nll": m["loss/nll"],
        "policy/grad_norm": m["policy/grad_norm"],
        **{k: v for k, v in z.items() if np.isfinite(v)},
    }
