"""Token log-probs and entropies through an output layer, a chunk of positions at a time, with gradients, so that no
(B, T, V) logits tensor is held for the backward pass.

A policy's gradient pass needs, at each reply position t, log π(y_t | s_t) = log softmax(W h_t + b)[y_t] and (for the
entropy bonus, or the high-entropy token selection) H(π(·|s_t)). Written directly, autograd keeps the fp32 logits,
their log-softmax and the entropy's terms, each (B, T, V): at V = 128k, 16 rows and 1k reply tokens that is 8.4 GB a
tensor. Here the positions are cut into chunks of ``chunk`` rows of (B·T, H); each chunk's logits are computed,
reduced to its log-probs and entropies, and dropped, and the backward pass recomputes them one chunk at a time
(activation checkpointing per chunk, ``torch.utils.checkpoint`` without re-entry). At most one chunk's (chunk, V)
logits and their by-products exist at once, forwards and backwards, for one more head matmul per chunk.

The same idea elsewhere: Liger-Kernel's fused linear RLHF losses (``LigerFusedLinearRLHFBase``, an autograd
function that runs the head chunk by chunk and computes its gradient in the forward pass), prime-rl's
``chunked_selective_log_softmax`` (the head and the log-softmax per chunk of positions), veRL's
``entropy_from_logits_with_chunking`` (the entropy over row chunks), NeMo RL's ``ChunkedDistributedGatherLogprob``
and ``ChunkedDistributedEntropy``. Recomputation keeps this one to the torch operators of the unchunked pass, so its
values are the same and its gradients agree to float rounding (the head's weight gradient is summed chunk by chunk).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

# fp32 logit elements per chunk: 2^25 = 128 MiB (256 positions at V = 128,256)
LOGIT_ELEMENTS = 1 << 25


def positions_per_chunk(vocab_size: int, elements: int = LOGIT_ELEMENTS) -> int:
    """Positions whose (positions, V) fp32 logits hold about ``elements`` numbers (at least 1)."""
    return max(1, elements // max(int(vocab_size), 1))


def _token_logp(logits: torch.Tensor, tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    # as StepDecoding.token_logp: fp32 log-softmax, 0 at <pad>
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.where(tokens == pad_id, 0.0, logp)


def entropy_of_logits(logits: torch.Tensor) -> torch.Tensor:
    """H(π(·|s)) (...) from logits (..., V): rayseq.losses.menu.token_entropy's arithmetic (the models do not import
    the losses); banned ids (−inf) add nothing."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    logp = torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))
    return -(logp.exp() * logp).sum(-1)


def chunked_token_logprobs(head: Callable[[torch.Tensor], torch.Tensor], states: torch.Tensor, tokens: torch.Tensor,
                           pad_id: int, chunk: int, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(y_t | s_t) and (``entropy``) H(π(·|s_t)) at every position, ``chunk`` positions at a time.

    Args:
        head: the output layer, states (n, H) -> fp32 logits (n, V) with the banned ids at −inf.
        states: (B, T, H) the states that produce each token's distribution.
        tokens: (B, T) int64 the tokens whose log-probs are taken.
        pad_id: the padding id (its positions get log-prob 0).
        chunk: positions of (B·T) per chunk.
        entropy: also return the entropies.

    Returns:
        logp (B, T), and entropy (B, T) or None. With gradients enabled and more than one chunk, each chunk's logits are
        recomputed in the backward pass instead of kept.
    """
    B, T, H = states.shape
    flat_h, flat_y = states.reshape(B * T, H), tokens.reshape(B * T)

    def piece(h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits = head(h)
        return (_token_logp(logits, y, pad_id),) + ((entropy_of_logits(logits),) if entropy else ())

    n = B * T
    if n <= chunk or not torch.is_grad_enabled():
        outs = [piece(flat_h[i : i + chunk], flat_y[i : i + chunk]) for i in range(0, max(n, 1), chunk)]
    else:
        outs = [checkpoint(piece, flat_h[i : i + chunk], flat_y[i : i + chunk], use_reentrant=False)
                for i in range(0, n, chunk)]
    columns = [torch.cat(c) if len(c) > 1 else c[0] for c in zip(*outs)]
    logp = columns[0].reshape(B, T)
    return logp, (columns[1].reshape(B, T) if entropy else None)


__all__ = ["LOGIT_ELEMENTS", "chunked_token_logprobs", "entropy_of_logits", "positions_per_chunk"]
