"""Transformer generators (``model.arch=transformer``) in plain torch, with a key/value cache (Vaswani et al. 2017,
pre-LayerNorm as in GPT-2): an encoder-decoder for the seq2seq tasks (counting, pairs, chit-chat) and, with
``conditional=False``, a decoder-only language model for unconditional tasks (SeqGAN's oracle), the roles the
GRU encoder-decoder and SeqGAN's LSTM play for ``model.arch=rnn``.

It follows the policy protocol of :mod:`rayseq.models.protocol`, so every algorithm, Monte-Carlo search, serving
and the RLlib module use it unchanged. The decoding state is the cache: a flat tuple of tensors with the batch in
dim 0,

    (k_1, v_1, ..., k_L, v_L)                                  decoder-only
    (k_1, v_1, ..., k_L, v_L, m_1, n_1, ..., m_L, n_L, mask)    encoder-decoder

k_l, v_l (B, heads, t, H/heads) are layer l's self-attention keys/values of the t tokens read so far (<bos>
first); m_l, n_l (B, heads, S, H/heads) its cross-attention keys/values of the encoder output, computed once by
:meth:`TransformerGenerator.encode`; mask (B, 1, 1, S) bool, True at real source tokens. A step (:meth:`advance`)
appends one position's keys/values and attends over the cache: O(t) per token instead of re-running the prefix,
O(t²). :meth:`prefix_states` runs one teacher-forced pass and slices its keys/values per prefix, so Monte-Carlo
search continues every prefix from its cached state exactly as it does from a GRU's hidden state.

Keys it reads from ``model.*``: ``hidden_dim`` (the width d_model; also the per-step state size the baseline and
critic read), ``num_layers`` (layers of the encoder and of the decoder each), ``n_heads``, ``ff_dim``
(feed-forward inner size), ``max_positions`` (learned position embeddings: the longest source and the longest
decoded sequence, <bos> included), ``dropout`` (on embeddings, attention weights, residual branches and the output,
as in the GRU). ``emb_dim`` and ``cell`` are the RNN's (token embeddings here are d_model wide).

Activation checkpointing (``learner.activation_checkpointing``, :meth:`TransformerGenerator.enable_checkpointing`):
in a pass with gradients in training mode, each layer runs under ``torch.utils.checkpoint`` (non-reentrant), so
backward keeps only the layers' inputs and recomputes their insides (attention, feed-forward) — the activation
memory of L layers becomes about one layer's plus L inputs of (B, T, d), for about one more forward pass of compute.
The recomputation replays the forward's random state, so dropout draws the same masks and the gradients are the
ones without checkpointing. Passes without gradients (sampling, evaluation, the learner's no-gradient passes) are
unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from rayseq.models.protocol import GeneratorOutput, StepDecoding


class Attention(nn.Module):
    """Multi-head attention with separate query and key/value projections (so the keys/values of a cache are
    computed once per position, and those of the encoder output once per input)."""

    def __init__(self, d: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads, self.p = n_heads, dropout
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.o = nn.Linear(d, d)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d) -> (B, heads, T, d / heads)."""
        B, T, d = x.shape
        return x.view(B, T, self.n_heads, d // self.n_heads).transpose(1, 2)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, d) -> keys, values (B, heads, T, d / heads)."""
        k, v = self.kv(x).chunk(2, dim=-1)
        return self.split(k), self.split(v)

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                causal: bool = False) -> torch.Tensor:
        """Queries from x (B, T, d) over keys/values (B, heads, S, d / heads) -> (B, T, d)."""
        y = F.scaled_dot_product_attention(self.split(self.q(x)), k, v, attn_mask=mask, is_causal=causal,
                                           dropout_p=self.p if self.training else 0.0)
        B, h, T, dh = y.shape
        return self.o(y.transpose(1, 2).reshape(B, T, h * dh))


class Block(nn.Module):
    """A pre-LN layer: self-attention, cross-attention (decoder of an encoder-decoder), feed-forward."""

    def __init__(self, d: int, n_heads: int, ff_dim: int, dropout: float, cross: bool):
        super().__init__()
        self.ln1, self.self_attn = nn.LayerNorm(d), Attention(d, n_heads, dropout)
        if cross:
            self.ln2, self.cross_attn = nn.LayerNorm(d), Attention(d, n_heads, dropout)
        self.ln3 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff_dim), nn.GELU(), nn.Linear(ff_dim, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, past_k=None, past_v=None, self_mask=None, causal=False, mem_k=None, mem_v=None,
                mem_mask=None):
        """x (B, T, d) -> (x, k, v): the layer's output and its self-attention keys/values with ``past_k/v`` (the
        cache) before them."""
        h = self.ln1(x)
        k, v = self.self_attn.keys_values(h)
        if past_k is not None:
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        x = x + self.drop(self.self_attn(h, k, v, self_mask, causal))
        if mem_k is not None:
            x = x + self.drop(self.cross_attn(self.ln2(x), mem_k, mem_v, mem_mask))
        x = x + self.drop(self.ff(self.ln3(x)))
        return x, k, v


class TransformerGenerator(StepDecoding, nn.Module):
    """Encoder-decoder (``conditional=True``) or decoder-only (``False``) Transformer policy with a KV cache."""

    def __init__(
        self,
        vocab_size: int,
        hidden_dim: int = 128,
        num_layers: int = 2,
        n_heads: int = 4,
        ff_dim: int = 512,
        max_positions: int = 128,
        dropout: float = 0.0,
        pad_id: int = 0,
        bos_id: int = 1,
        eos_id: int = 2,
        *,
        conditional: bool = True,
        banned_ids: tuple[int, ...] = (),
    ):
        super().__init__()
        if hidden_dim % n_heads:
            raise ValueError(f"hidden_dim={hidden_dim} must be a multiple of n_heads={n_heads}")
        self.vocab_size, self.pad_id, self.bos_id, self.eos_id = vocab_size, pad_id, bos_id, eos_id
        self.hidden_dim, self.num_layers, self.n_heads = hidden_dim, num_layers, n_heads
        self.max_positions, self.conditional = max_positions, conditional
        d = hidden_dim
        self.embedding = nn.Embedding(vocab_size, d, padding_idx=pad_id)  # shared by encoder and decoder
        self.dec_pos = nn.Embedding(max_positions, d)
        if conditional:
            self.enc_pos = nn.Embedding(max_positions, d)
            self.encoder = nn.ModuleList(Block(d, n_heads, ff_dim, dropout, cross=False) for _ in range(num_layers))
            self.enc_ln = nn.LayerNorm(d)
        self.decoder = nn.ModuleList(Block(d, n_heads, ff_dim, dropout, cross=conditional) for _ in range(num_layers))
        self.dec_ln = nn.LayerNorm(d)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(d, vocab_size)
        for emb in (self.embedding, self.dec_pos, *((self.enc_pos,) if conditional else ())):
            nn.init.normal_(emb.weight, std=d**-0.5)  # unit-scale inputs to the first LayerNorm'd residual
        with torch.no_grad():
            self.embedding.weight[pad_id].zero_()
        self.banned_ids = tuple(sorted({pad_id, bos_id, *banned_ids}))  # never valid outputs
        ban = torch.zeros(vocab_size)
        ban[list(self.banned_ids)] = float("-inf")
        self.register_buffer("logit_bias", ban, persistent=False)  # (V,) 0 or −inf
        self.checkpointing = False  # layers recomputed in backward (enable_checkpointing)

    def enable_checkpointing(self, on: bool = True) -> None:
        """Recompute each layer's activations in the backward pass instead of keeping them (module docstring)."""
        self.checkpointing = on

    def _layer(self, blk: Block, x: torch.Tensor, *args, **kwargs):
        """``blk(x, ...)``, checkpointed in a training pass with gradients when :meth:`enable_checkpointing` is on."""
        if self.checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(blk, x, *args, use_reentrant=False, **kwargs)
        return blk(x, *args, **kwargs)

    @classmethod
    def from_config(cls, cfg, task) -> TransformerGenerator:
        """The task's Transformer from ``cfg.model``: hidden_dim, num_layers, n_heads, ff_dim, max_positions,
        dropout (module docstring)."""
        m, sp = cfg.model, task.specials
        return cls(len(task.vocab), hidden_dim=m.hidden_dim, num_layers=m.num_layers, n_heads=m.n_heads,
                   ff_dim=m.ff_dim, max_positions=m.max_positions, dropout=m.dropout, pad_id=sp.pad, bos_id=sp.bos,
                   eos_id=sp.eos, conditional=task.conditional, banned_ids=tuple(task.banned_ids))

    # -- building blocks -------------------------------------------------------------------------
    def _check_positions(self, n: int, what: str) -> None:
        if n > self.max_positions:
            raise ValueError(f"the Transformer has model.max_positions={self.max_positions} position embeddings but "
                             f"the {what} needs {n}; raise model.max_positions")

    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """src (B, S), src_len (B,) -> the cache before <bos>: empty self-attention keys/values per layer and, for
        an encoder-decoder, every decoder layer's cross-attention keys/values of the encoder output and the mask."""
        B, w = src.shape[0], self.embedding.weight
        hd = self.hidden_dim // self.n_heads
        empty = w.new_zeros(B, self.n_heads, 0, hd)
        cache = tuple(empty for _ in range(2 * self.num_layers))
        if not self.conditional:
            return cache
        S = src.shape[1]
        self._check_positions(S, "source")
        # a source of length 0 attends to its first slot (a pad embedding, zero), as the GRU reads one pad
        keep = torch.arange(S, device=src.device)[None, :] < src_len.clamp(min=1)[:, None]  # (B, S)
        mask = keep[:, None, None, :]  # (B, 1, 1, S) True = attend
        x = self.dropout(self.embedding(src) + self.enc_pos(torch.arange(S, device=src.device)))
        for blk in self.encoder:
            x, _, _ = self._layer(blk, x, self_mask=mask)
        mem = self.enc_ln(x)
        kvs = [t for blk in self.decoder for t in blk.cross_attn.keys_values(mem)]
        return (*cache, *kvs, mask)

    def _split(self, state):
        """cache -> (self keys/values per layer [(k, v)], cross keys/values per layer [(m, n)] or Nones, mask)."""
        L = self.num_layers
        own = [(state[2 * i], state[2 * i + 1]) for i in range(L)]
        if not self.conditional:
            return own, [(None, None)] * L, None
        mem = [(state[2 * L + 2 * i], state[2 * L + 2 * i + 1]) for i in range(L)]
        return own, mem, state[-1]

    def _decode(self, tokens: torch.Tensor, state, start: int, causal: bool):
        """Decoder over ``tokens`` (B, T) at positions start..start+T−1 after the cache ``state`` -> final outputs
        (B, T, H) and the new cache (the keys/values of these positions appended)."""
        T = tokens.shape[1]
        self._check_positions(start + T, "decoded sequence (<bos> included)")
        pos = torch.arange(start, start + T, device=tokens.device)
        x = self.dropout(self.embedding(tokens) + self.dec_pos(pos))
        own, mem, mask = self._split(state)
        new = []
        for blk, (pk, pv), (mk, mv) in zip(self.decoder, own, mem):
            x, k, v = self._layer(blk, x, pk, pv, causal=causal, mem_k=mk, mem_v=mv, mem_mask=mask)
            new += [k, v]
        return self.dec_ln(x), (*new, *state[2 * self.num_layers:])

    def advance(self, tok: torch.Tensor, state):
        """Feed one token: tok (B,), cache -> output (B, H), the cache one position longer."""
        out, state = self._decode(tok[:, None], state, state[0].shape[2], causal=False)  # a step sees the whole cache
        return out[:, 0], state

    def output_logits(self, states: torch.Tensor) -> torch.Tensor:
        """Output logits with the banned ids at −inf (in place: no second (B, V) copy)."""
        return self.out(self.dropout(states)).add_(self.logit_bias)

    def state_index(self, state, idx: torch.Tensor):
        """Rows ``idx`` of a cache (batch in dim 0)."""
        return tuple(x.index_select(0, idx) for x in state)

    def state_cat(self, states: list):
        """Caches of one length joined along the batch."""
        return tuple(torch.cat(parts, 0) for parts in zip(*states))

    # -- phase methods ----------------------------------------------------------------------------
    def logprobs(self, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor) -> GeneratorOutput:
        """Teacher-forced log-probs of ``tokens`` (B, T) in one causal pass: decoder input is BOS, y_1..y_{T−1}."""
        states, _ = self._teacher_forced(src, src_len, tokens)
        logits = self.output_logits(states)
        return GeneratorOutput(self.token_logp(logits, tokens), states, logits)

    def _teacher_forced(self, src, src_len, tokens):
        bos = torch.full_like(tokens[:, :1], self.bos_id)
        dec_in = torch.cat([bos, tokens[:, :-1]], dim=1)
        return self._decode(dec_in, self.encode(src, src_len), 0, causal=True)

    @torch.no_grad()
    def prefix_states(self, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor):
        """One causal pass over <bos>, y_1..y_{T−1}; the state after prefix t is the first t + 1 positions of its
        keys/values (views, no copy) -> outputs [(B, H)] and caches for t = 1..T−1."""
        outs, cache = self._teacher_forced(src, src_len, tokens)
        L2 = 2 * self.num_layers
        T = tokens.shape[1]
        states = [tuple(x[:, :, : t + 1] for x in cache[:L2]) + cache[L2:] for t in range(1, T)]
        return [outs[:, t] for t in range(1, T)], states


__all__ = ["TransformerGenerator"]
