"""Exact categorical sampling that is cheaper than ``torch.multinomial`` on CPU.

Inverse CDF: with u ~ U(0, 1) per row, y = min{k : Σ_{j≤k} w_k > u·Σ_j w_j}, w = exp(logits − max).
One uniform per row (Gumbel-max needs V of them and two logarithms each); the cost is one ``exp``, one
``cumsum`` and a binary search over V, done on row chunks that stay in cache. The
distribution is exactly softmax(logits) (tests/rewards/test_mc_search.py compares it with ``torch.multinomial``
by a chi-square test), and a given ``u`` always picks the same token, which lets the batched
Monte-Carlo search be checked exactly against a plain loop that shares the same uniforms.

Measured here (1 thread, 16,384 rows × V = 5,000): ``torch.multinomial`` 2.36 s, Gumbel-max 1.60 s,
inverse CDF on the whole tensor 0.87 s, inverse CDF on chunks of 256 rows 0.35 s including the
output projection.
"""

from __future__ import annotations

import torch

CHUNK_ROWS = 256  # rows × V floats per chunk: 5 MB at V = 5000, stays in cache


def _search(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """cdf (R, V) non-decreasing unnormalised, u (R,) -> index of the first cdf entry > u·total."""
    target = (u.to(cdf.dtype) * cdf[:, -1]).unsqueeze(1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return idx.clamp_(max=cdf.shape[1] - 1)  # u·total may round up to the total


def inverse_cdf_sample(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """logits (R, V) (−inf allowed), u (R,) in [0, 1) -> tokens (R,) int64 distributed as softmax(logits).

    ``logits`` is not modified."""
    return sample_with_logp(logits, u)[0]


def sample_with_logp(
    logits: torch.Tensor, u: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw y ~ softmax(logits / temperature) by inverse CDF, in row chunks.

    logits (R, V), u (R,) -> tokens (R,) int64, logp (R,) = log softmax(logits)[y] at temperature 1
    (the policy's log-probability, what PPO's ratio needs).
    """
    R, V = logits.shape
    tokens = torch.empty(R, dtype=torch.long, device=logits.device)
    logp = torch.empty(R, dtype=logits.dtype, device=logits.device)
    chunk = CHUNK_ROWS if logits.device.type == "cpu" else max(R, 1)  # GPUs prefer one big kernel
    for a in range(0, R, chunk):
        z = logits[a : a + chunk]
        ua = u[a : a + z.shape[0]]
        z = z - z.amax(dim=-1, keepdim=True)  # the top logit is 0; a chunk-sized copy (amax: no indices)
        lse = torch.log(z.exp().sum(-1)) if temperature != 1.0 else None
        scaled = z if temperature == 1.0 else z / temperature
        cdf = scaled.exp().cumsum_(-1)  # unnormalised cdf of softmax(logits / temperature)
        y = _search(cdf, ua)
        if lse is None:
            lse = torch.log(cdf[:, -1])
        lp = z.gather(1, y[:, None]).squeeze(1) - lse
        tokens[a : a + z.shape[0]] = y
        logp[a : a + z.shape[0]] = lp
    return tokens, logp


def sample_projected(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, u: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Draw y ~ softmax((h Wᵀ + bias) / temperature) by inverse CDF without materialising the (R, V) logits.

    h (R, H), weight (V, H), bias (V,) (the output layer's bias plus any −inf ban), u (R,) -> tokens (R,) int64.
    The same tokens as :func:`sample_with_logp` on ``(h Wᵀ + bias) / temperature`` (the same ops on the same
    values), but each chunk's logits are made, shifted, exponentiated and summed in place while they are in cache:
    the Monte-Carlo search samples 194,560 tokens over V = 5,000 per SeqGAN update, and writing the whole (R, V)
    logits (copy of the bias, a second pass for the ban, then ``sample_with_logp``'s chunk copies) was half its time.
    """
    R = h.shape[0]
    tokens = torch.empty(R, dtype=torch.long, device=h.device)
    chunk = CHUNK_ROWS if h.device.type == "cpu" else max(R, 1)
    wt = weight.t()
    for a in range(0, R, chunk):
        z = torch.addmm(bias, h[a : a + chunk], wt)  # (r, V) logits of this chunk only
        if temperature != 1.0:
            z.div_(temperature)
        z.sub_(z.amax(dim=-1, keepdim=True)).exp_().cumsum_(-1)  # unnormalised cdf, in place
        tokens[a : a + z.shape[0]] = _search(z, u[a : a + z.shape[0]])
    return tokens


def multinomial_sample(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """The reference sampler (public SeqGAN implementations): ``torch.multinomial`` on softmax(logits)."""
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(1)
