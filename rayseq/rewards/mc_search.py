"""Monte-Carlo search for SeqGAN's action values (Yu et al. 2017, Eq. 4-5).

    Q(s = Y_1:t−1, a = y_t) = (1/N) Σ_n D(Y^n_1:T),  Y^n_1:T ∈ MC^{G_β}(Y_1:t; N)   for t < T
                            = D(Y_1:T)                                           for t = T

Every prefix Y_1:t (t = 1..T−1) of every sequence is completed N times by the rollout policy G_β.
The policy is any model of the protocol (:mod:`rayseq.models.protocol`): its ``prefix_states``, ``advance``,
``output_logits``, ``state_index`` and ``state_cat`` — a GRU's recurrent state and a Transformer's key/value cache
alike (every active row at position p has read p + 1 tokens, so cached keys/values of joining and running rows
have one length and join along the batch).

:func:`mc_search` does this as ONE batch of B·(T−1)·N continuations. A single teacher-forced pass
over the B sampled sequences caches the decoder state after each prefix; a continuation starts from
that cached state (no prefix re-run). The loop runs over absolute time: at position p the N copies of
every prefix of length p join the active set, so the work is exactly B·N·T(T−1)/2 decoder steps with
no padding. Sampling is inverse CDF with uniforms U[b, t−1, n, p] drawn up front, fused with the output
projection (:func:`rayseq.models.sampling.sample_projected`: the (R, V) logits are never written whole, and
the cdf is searched by blocks). :func:`mc_search_loop` is the plain per-(n, t) loop of public implementations
(re-run the prefix from zero, sample to the end one position at a time with ``sample_with_logp`` on the full
logits), and under the same U both give identical sequences (test_mc_search.py, exact in float64: float32
logits of a batched and a per-row matmul, or cdfs summed in another order, may differ in the last bit, which
can flip a token when u lands on a cdf boundary). :func:`q_values` averages the discriminator's
probabilities into Q; the scorer gets D of the continuations from
:meth:`rayseq.models.discriminator.CNNDiscriminator.score_shared_prefix` (each prefix's windows convolved
once for its N continuations). Math layer: torch only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rayseq.models.sampling import multinomial_sample, sample_projected, sample_with_logp


class Continuations(NamedTuple):
    tokens: torch.Tensor  # (B, T−1, N, T) int64: prefix Y_1:t of sequence b, then G_β's continuation; pad after end
    lengths: torch.Tensor  # (B, T−1, N) int64 real tokens (EOS included)


def sequence_lengths(token_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) mask -> (B,) int64 lengths."""
    return (token_mask > 0).sum(1).long()


def prefix_states(policy, src, src_len, tokens):
    """Outputs (B, H) and decoding states after each prefix <bos>, y_1..y_t for t = 1..T−1 (what gives y_{t+1}):
    the policy's own ``prefix_states`` (an RNN steps its decoder; a Transformer slices one pass's key/value cache)."""
    return policy.prefix_states(src, src_len, tokens)


def draw_uniforms(B: int, T: int, N: int, generator: torch.Generator | None = None, device="cpu"):
    """U (B, T−1, N, T): U[b, t−1, n, p] drives position p of continuation n of prefix t of row b."""
    return torch.rand(B, max(T - 1, 0), N, T, generator=generator, device=device)


@torch.no_grad()
def mc_search(policy, src, src_len, tokens, token_mask, n_rollouts: int, *, temperature: float = 1.0,
              generator: torch.Generator | None = None, u: torch.Tensor | None = None) -> Continuations:
    """Batched cached Monte-Carlo search: completes each prefix Y_1:t (t < length) N times with ``policy``.

    src (B, S), src_len (B,), tokens (B, T) sampled sequences, token_mask (B, T) -> Continuations.
    Prefixes at or past a sequence's end are not searched (their Q is D(Y), :func:`q_values`); their
    rows hold the sequence itself. ``u`` (B, T−1, N, T) overrides the uniforms (tests).
    """
    B, T = tokens.shape
    N = n_rollouts
    dev = tokens.device
    lengths = sequence_lengths(token_mask)
    if u is None:
        u = draw_uniforms(B, T, N, generator, dev)
    # every row starts as the full sequence; continuations overwrite positions >= t
    cont = tokens[:, None, None, :].expand(B, max(T - 1, 0), N, T).clone()
    cont_len = lengths[:, None, None].expand(B, max(T - 1, 0), N).clone()
    if T < 2:
        return Continuations(cont, cont_len)
    outs, hs = prefix_states(policy, src, src_len, tokens)
    # a linear output layer (both built-in policies): the fused sampler, without the (R, V) logits in memory
    projection = policy.output_projection() if hasattr(policy, "output_projection") else None
    n_idx = torch.arange(N, device=dev)
    act_out = act_h = None  # active rows: top outputs (R, H), recurrent state
    act_b = act_t = act_n = torch.zeros(0, dtype=torch.long, device=dev)
    alive = torch.zeros(0, dtype=torch.bool, device=dev)
    for p in range(1, T):  # 0-based position of the token being sampled
        # prefixes of length t = p join: rows (b, n) for every open sequence b (length > p), N copies each
        rows = torch.nonzero(lengths > p).squeeze(1)
        if len(rows):
            jb = rows.repeat_interleave(N)
            jn = n_idx.repeat(len(rows))
            j_out = outs[p - 1].index_select(0, jb)
            j_h = policy.state_index(hs[p - 1], jb)
            cont[jb, p - 1, jn, p:] = policy.pad_id
            act_out = j_out if act_out is None else torch.cat([act_out, j_out])
            act_h = j_h if act_h is None else policy.state_cat([act_h, j_h])
            act_b, act_n = torch.cat([act_b, jb]), torch.cat([act_n, jn])
            act_t = torch.cat([act_t, torch.full_like(jb, p)])
            alive = torch.cat([alive, torch.ones_like(jb, dtype=torch.bool)])
        if act_out is None:
            continue
        if projection is not None:
            y = sample_projected(act_out, *projection, u[act_b, act_t - 1, act_n, p], temperature)
        else:
            logits = policy.output_logits(act_out)  # banned ids at −inf
            if temperature != 1.0:
                logits.div_(temperature)
            y, _ = sample_with_logp(logits, u[act_b, act_t - 1, act_n, p])
        y = torch.where(alive, y, policy.pad_id)
        cont[act_b, act_t - 1, act_n, p] = y
        alive = alive & (y != policy.eos_id)
        if p < T - 1:
            act_out, act_h = policy.advance(y, act_h)
    # lengths: real tokens = up to and including the first EOS, else T
    is_eos = cont == policy.eos_id
    first_eos = torch.where(is_eos.any(-1), is_eos.float().argmax(-1) + 1, torch.full_like(cont_len, T))
    searched = torch.arange(1, T, device=dev)[None, :, None] < lengths[:, None, None]
    cont_len = torch.where(searched, first_eos, cont_len)
    return Continuations(cont, cont_len)


@torch.no_grad()
def mc_search_loop(policy, src, src_len, tokens, token_mask, n_rollouts: int, *, temperature: float = 1.0,
                   u: torch.Tensor | None = None, generator: torch.Generator | None = None,
                   score=None) -> tuple[Continuations, torch.Tensor | None]:
    """The plain loop of public SeqGAN implementations, for tests and the throughput baseline.

    for n in 1..N: for t in 1..T−1: re-run the prefix Y_1:t from scratch, sample y_{t+1..T} one position
    at a time for the B rows, and (optionally) ``score`` the B completed sequences right away.
    With ``u`` it samples by inverse CDF from U[b, t−1, n, p] (equal to :func:`mc_search`); without,
    by ``torch.multinomial`` (what the public code does). Returns the continuations and, with
    ``score(tokens (B, T), lengths (B,)) -> (B,)``, the scores (B, T−1, N).
    """
    B, T = tokens.shape
    N = n_rollouts
    lengths = sequence_lengths(token_mask)
    cont = tokens[:, None, None, :].expand(B, max(T - 1, 0), N, T).clone()
    cont_len = lengths[:, None, None].expand(B, max(T - 1, 0), N).clone()
    scores = torch.zeros(B, max(T - 1, 0), N) if score is not None else None
    for n in range(N):
        for t in range(1, T):
            h = policy.encode(src, src_len)
            tok = torch.full((B,), policy.bos_id, dtype=torch.long, device=tokens.device)
            for p in range(t):  # re-run the prefix from zero
                logits, _, h = policy.decode_step(tok, h)
                tok = tokens[:, p]
            seq = tokens.clone()
            seq[:, t:] = policy.pad_id
            alive = lengths > t
            for p in range(t, T):
                logits, _, h = policy.decode_step(tok, h)
                if temperature != 1.0:
                    logits = logits / temperature
                if u is not None:
                    y, _ = sample_with_logp(logits, u[:, t - 1, n, p])
                else:
                    y = multinomial_sample(logits, generator)
                y = torch.where(alive, y, policy.pad_id)
                seq[:, p] = y
                alive = alive & (y != policy.eos_id)
                tok = y
            open_rows = lengths > t
            cont[open_rows, t - 1, n] = seq[open_rows]
            is_eos = seq == policy.eos_id
            first = torch.where(is_eos.any(-1), is_eos.float().argmax(-1) + 1, torch.full_like(lengths, T))
            cont_len[open_rows, t - 1, n] = first[open_rows]
            if score is not None:
                scores[:, t - 1, n] = score(cont[:, t - 1, n], cont_len[:, t - 1, n])
    return Continuations(cont, cont_len), scores


def q_values(d_cont: torch.Tensor, d_full: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """SeqGAN Eq. 4: d_cont (B, T−1, N) = D of each continuation, d_full (B,) = D(Y), lengths (B,)
    -> Q (B, T): mean over N for prefixes shorter than the sequence, D(Y) from its last token on."""
    B, Tm1, _ = d_cont.shape
    T = Tm1 + 1
    q = torch.empty(B, T, dtype=d_cont.dtype, device=d_cont.device)
    q[:, :Tm1] = d_cont.mean(-1)
    t = torch.arange(1, T + 1, device=d_cont.device)[None, :]
    return torch.where(t >= lengths[:, None], d_full[:, None].to(q.dtype), q)
