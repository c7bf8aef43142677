"""Exact categorical sampling that is cheaper than ``torch.multinomial`` on CPU.

Inverse CDF: with u ~ U(0, 1) per row, y = min{k : Σ_{j≤k} w_k > u·Σ_j w_j}, w = exp(logits − max).
One uniform per row (Gumbel-max needs V of them and two logarithms each); the cost is one ``exp``, one
``cumsum`` and a binary search over V, done on row chunks that stay in cache. The
distribution is exactly softmax(logits) (tests/rewards/test_mc_search.py compares it with ``torch.multinomial``
by a chi-square test), and a given ``u`` always picks the same token, which lets the batched
Monte-Carlo search be checked exactly against a plain loop that shares the same uniforms.

Measured here (1 thread, 16,384 rows × V = 5,000): ``torch.multinomial`` 2.36 s, Gumbel-max 1.60 s,
inverse CDF on the whole tensor 0.87 s, inverse CDF on chunks of 256 rows 0.35 s including the
output projection. :func:`sample_projected` (the Monte-Carlo search's sampler) also folds the output
projection into the chunk loop and replaces the cumsum over V by block sums and one block's cumsum
(measured: 97,280 rows × V = 5,000, 1 thread, CPU time: 1.03 s against 2.67 s for ``addmm`` + this module's
``sample_with_logp``).
"""

from __future__ import annotations

import torch

CHUNK_ROWS = 256  # rows × V floats per chunk: 5 MB at V = 5000, stays in cache


def _search(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """cdf (R, V) non-decreasing unnormalised, u (R,) -> index of the first cdf entry > u·total."""
    total = cdf[:, -1:]
    # u·total may round up to the total: keep it below, so that the entry found has positive weight (a clamp to
    # the last id would pick it even when it is banned)
    target = torch.minimum(u.to(cdf.dtype)[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(1)


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
    logits = logits.float()  # the cdf and the log-prob in fp32, from bf16 logits too
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


BLOCK = 64  # sample_projected's cdf blocks: one sum per block, then one cumsum of the chosen block


def sample_projected(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, u: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Draw y ~ softmax((h Wᵀ + bias) / temperature) by inverse CDF without materialising the (R, V) logits.

    h (R, H), weight (V, H), bias (V,) (the output layer's bias, −inf at banned ids), u (R,) in [0, 1) -> tokens
    (R,) int64. The Monte-Carlo search samples 194,560 tokens over V = 5,000 per SeqGAN update; writing the whole
    (R, V) logits (the bias copied in, a pass for the ban, the chunk copies of :func:`sample_with_logp`) and a
    sequential ``cumsum`` over V were most of its time. Here, per chunk of rows, in cache: one matmul with the
    bias folded in as an extra column (h | 1)(W | b)ᵀ, the −inf ids filled in, shift, exp, then a two-level
    search: block sums (a vectorised reduction), the block whose cumulative sum first exceeds u·total, and a
    cumsum of that block only. The same inverse CDF as :func:`sample_with_logp` up to the summation order of the
    cdf (tests: equal tokens in float64 for random u; never a −inf id).
    """
    R, V = h.shape[0], weight.shape[0]
    tokens = torch.empty(R, dtype=torch.long, device=h.device)
    banned = torch.isneginf(bias)
    ban_idx = banned.nonzero().squeeze(1) if bool(banned.any()) else None
    w_aug = torch.cat([weight, bias.masked_fill(banned, 0.0)[:, None]], dim=1).t()  # (H + 1, V)
    chunk = CHUNK_ROWS if h.device.type == "cpu" else max(R, 1)
    nb, tail = divmod(V, BLOCK)
    col = torch.arange(BLOCK, device=h.device)
    for a in range(0, R, chunk):
        ha = h[a : a + chunk]
        r = ha.shape[0]
        z = torch.cat([ha, torch.ones(r, 1, dtype=ha.dtype, device=ha.device)], dim=1) @ w_aug  # (r, V) logits
        if ban_idx is not None:
            z.index_fill_(1, ban_idx, float("-inf"))
        if temperature != 1.0:
            z.div_(temperature)
        z.sub_(z.amax(dim=-1, keepdim=True)).exp_()  # unnormalised probabilities
        sums = z[:, : nb * BLOCK].view(r, nb, BLOCK).sum(-1)
        if tail:
            sums = torch.cat([sums, z[:, nb * BLOCK :].sum(-1, keepdim=True)], dim=1)
        cdf = sums.cumsum_(-1)  # (r, blocks)
        total = cdf[:, -1:]
        # u·total below the total (u·total may round up to it): a block, then a token, of positive weight is found
        target = torch.minimum(u[a : a + r, None].to(z.dtype) * total, torch.nextafter(total, torch.zeros_like(total)))
        k = torch.searchsorted(cdf, target, right=True)  # (r, 1) first block whose cumulative sum exceeds target
        before = torch.where(k > 0, cdf.gather(1, (k - 1).clamp(min=0)), torch.zeros_like(target))
        idx = k * BLOCK + col  # (r, BLOCK) ids of the block; past V in a short last block
        inside = idx < V
        local = z.gather(1, idx.clamp(max=V - 1)).masked_fill_(~inside, 0.0).cumsum_(-1)
        rest = torch.minimum(target - before, torch.nextafter(local[:, -1:], torch.zeros_like(total)))
        tokens[a : a + r] = (k * BLOCK + torch.searchsorted(local, rest, right=True)).squeeze(1)
    return tokens


def multinomial_sample(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """The reference sampler (public SeqGAN implementations): ``torch.multinomial`` on softmax(logits)."""
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(1)
