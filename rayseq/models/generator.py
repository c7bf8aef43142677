"""RNN generators: GRU/LSTM encoder-decoder (Tuan et al. Sec. 3: seq2seq policy π_θ(y_t | x, y_<t)) and,
with ``conditional=False``, the unconditional LSTM language model of SeqGAN (Yu et al. Sec. 4: G_θ(y_t | Y_1:t−1);
its initial state is zero and ``src`` is ignored).

Phase methods (STYLE.md 4):
- :meth:`Seq2SeqGRU.logprobs` — teacher-forced log-probs of given tokens (training, PPO ratios),
- :meth:`Seq2SeqGRU.sample` — ancestral sampling with temperature, optional forced prefix (rollouts,
  MIXER), or greedy decoding (evaluation, serving),
- :meth:`Seq2SeqGRU.first_step_logprobs` — the distribution of y_1 (counting's Fig. 2 / Supp. D).

Shapes: B batch, S source length, T target length, H hidden, V vocabulary. Sources are right-padded;
``src_len`` gives lengths. Decoding starts from ``bos_id`` and a sequence ends at ``eos_id`` (kept
in the output and in the masks) or at ``max_len``. ``<pad>`` and ``<bos>`` are never valid outputs, and
a task may ban more ids (``banned_ids``: the oracle task bans every special, which fixes the length at
``max_len`` as in SeqGAN): all of them get logit −inf in :meth:`Seq2SeqGRU._logits`, the one place every
phase method takes its logits from, so the policy that is trained, evaluated and served is one
distribution. Log-probs of ``<pad>`` positions (after a sequence's end) are 0, not −inf, so masked
losses stay finite. The recurrent state ``h`` is a tensor (L, B, H) for GRU and a pair
of them for LSTM; :func:`state_index` / :func:`state_cat` handle both.

Sampling is inverse-CDF (:func:`rayseq.models.sampling.inverse_cdf_sample`): exact, one uniform per
row and step, and several times faster than ``torch.multinomial`` on CPU at V = 5000.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from rayseq.models.sampling import sample_with_logp


class GeneratorOutput(NamedTuple):
    logp: torch.Tensor  # (B, T) log π(y_t | x, y_<t) of the given tokens
    states: torch.Tensor  # (B, T, H) decoder states s_t that produced the distribution of y_t
    logits: torch.Tensor  # (B, T, V)


class SampleOutput(NamedTuple):
    tokens: torch.Tensor  # (B, T) int64, pad after the end
    token_mask: torch.Tensor  # (B, T) float, 1 for real tokens (EOS included)
    action_mask: torch.Tensor  # (B, T) float, 1 where the token was sampled (not forced)
    logp: torch.Tensor  # (B, T) float, log π(y_t | ...) at temperature 1, 0 where masked


def state_index(h, idx: torch.Tensor):
    """Rows ``idx`` of a recurrent state (batch is dim 1): GRU tensor or LSTM (h, c) pair."""
    if isinstance(h, tuple):
        return tuple(x.index_select(1, idx) for x in h)
    return h.index_select(1, idx)


def state_cat(hs: list):
    """Concatenate recurrent states along the batch."""
    if isinstance(hs[0], tuple):
        return tuple(torch.cat(parts, 1) for parts in zip(*hs))
    return torch.cat(hs, 1)


class Seq2SeqGRU(nn.Module):
    """Encoder-decoder (``conditional=True``) or decoder-only (``False``) RNN policy; ``cell`` gru|lstm."""

    def __init__(
        self,
        vocab_size: int,
        emb_dim: int = 128,
        hidden_dim: int = 128,
        num_layers: int = 1,
        dropout: float = 0.0,
        pad_id: int = 0,
        bos_id: int = 1,
        eos_id: int = 2,
        *,
        cell: str = "gru",
        conditional: bool = True,
        banned_ids: tuple[int, ...] = (),
    ):
        super().__init__()
        if cell not in ("gru", "lstm"):
            raise ValueError(f"cell must be 'gru' or 'lstm', got {cell!r}")
        self.vocab_size, self.pad_id, self.bos_id, self.eos_id = vocab_size, pad_id, bos_id, eos_id
        self.hidden_dim, self.num_layers, self.cell, self.conditional = hidden_dim, num_layers, cell, conditional
        self.embedding = nn.Embedding(vocab_size, emb_dim, padding_idx=pad_id)
        rnn_dropout = dropout if num_layers > 1 else 0.0
        rnn = nn.GRU if cell == "gru" else nn.LSTM
        if conditional:
            self.encoder = rnn(emb_dim, hidden_dim, num_layers, batch_first=True, dropout=rnn_dropout)
        self.decoder = rnn(emb_dim, hidden_dim, num_layers, batch_first=True, dropout=rnn_dropout)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_dim, vocab_size)
        self.banned_ids = tuple(sorted({pad_id, bos_id, *banned_ids}))  # never valid outputs
        ban = torch.zeros(vocab_size)
        ban[list(self.banned_ids)] = float("-inf")
        self.register_buffer("logit_bias", ban, persistent=False)  # (V,) 0 or −inf

    @classmethod
    def from_config(cls, cfg, task) -> Seq2SeqGRU:
        """``model.arch=rnn``: the task's generator (conditional or not, banned ids) from the ``model.*`` sizes."""
        return build_generator(len(task.vocab), cfg.model, task.specials, conditional=task.conditional,
                               banned_ids=task.banned_ids)

    # -- building blocks -------------------------------------------------------------------------
    def encode(self, src: torch.Tensor, src_len: torch.Tensor):
        """src (B, S), src_len (B,) -> initial decoder state ((L, B, H), or a pair for LSTM).

        Unconditional models start from zeros (SeqGAN's h_0 = c_0 = 0)."""
        if not self.conditional:
            w = self.embedding.weight
            z = torch.zeros(self.num_layers, src.shape[0], self.hidden_dim, device=w.device, dtype=w.dtype)
            return (z, z.clone()) if self.cell == "lstm" else z
        emb = self.embedding(src)
        packed = nn.utils.rnn.pack_padded_sequence(
            emb, src_len.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False
        )
        _, h = self.encoder(packed)
        return h

    def _logits(self, states: torch.Tensor) -> torch.Tensor:
        """Output logits with the banned ids at −inf (in place: no second (B, V) copy)."""
        return self.out(self.dropout(states)).add_(self.logit_bias)

    def token_logp(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """log softmax(logits)[tokens]: logits (..., V), tokens (...) -> (...); 0 at ``<pad>`` (no token there)."""
        logp = torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return torch.where(tokens == self.pad_id, 0.0, logp)

    def decode_step(self, tok: torch.Tensor, h):
        """One decoder step (sampling, decoding, Monte-Carlo search, ERPO's sampler and scheduled sampling advance
        the policy with it): tok (B,), h state -> logits (B, V) with the banned ids at −inf, state (B, H), new h."""
        out, h = self.decoder(self.embedding(tok).unsqueeze(1), h)
        state = out[:, 0]
        return self._logits(state), state, h

    # -- phase methods ----------------------------------------------------------------------------
    def logprobs(self, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor) -> GeneratorOutput:
        """Teacher-forced log-probs of ``tokens`` (B, T): decoder input is BOS, y_1..y_{T-1}."""
        h0 = self.encode(src, src_len)
        bos = torch.full_like(tokens[:, :1], self.bos_id)
        dec_in = torch.cat([bos, tokens[:, :-1]], dim=1)
        states, _ = self.decoder(self.embedding(dec_in), h0)
        logits = self._logits(states)
        return GeneratorOutput(self.token_logp(logits, tokens), states, logits)

    def first_step_logprobs(self, src: torch.Tensor, src_len: torch.Tensor) -> torch.Tensor:
        """log π(y_1 | x) over the vocabulary, (B, V)."""
        h = self.encode(src, src_len)
        logits, _, _ = self.decode_step(torch.full_like(src_len, self.bos_id), h)
        return torch.log_softmax(logits, dim=-1)

    @torch.no_grad()
    def sample(
        self,
        src: torch.Tensor,
        src_len: torch.Tensor,
        max_len: int,
        *,
        temperature: float = 1.0,
        greedy: bool = False,
        prefix: torch.Tensor | None = None,
        prefix_len: torch.Tensor | int | None = None,
        generator: torch.Generator | None = None,
    ) -> SampleOutput:
        """Decode up to ``max_len`` tokens per row, batched.

        ``greedy`` takes the argmax; otherwise y_t ~ softmax(logits / temperature). The returned
        ``logp`` is always under the temperature-1 policy π_θ (what PPO's ratio needs). With
        ``prefix`` (B, P) row b's first ``prefix_len[b]`` tokens (an int: the same for every row) are forced
        (MIXER's len(y*) − δ reference tokens); forced tokens have action_mask 0. One uniform is drawn per
        row and step whether or not the row is forced, so a row's draws do not depend on its neighbours'
        prefixes. ``generator`` makes sampling reproducible per call.
        """
        B = src.shape[0]
        dev = src.device
        h = self.encode(src, src_len)
        tok = torch.full((B,), self.bos_id, dtype=torch.long, device=dev)
        alive = torch.ones(B, dtype=torch.bool, device=dev)
        plen = None
        if prefix is not None and prefix_len is not None:
            plen = torch.as_tensor(prefix_len, device=dev).expand(B).clamp(max=prefix.shape[1])
        tokens, token_mask, action_mask, logps = [], [], [], []
        for t in range(max_len):
            logits, _, h = self.decode_step(tok, h)
            if greedy:
                nxt = logits.argmax(dim=-1)
                lp = self.token_logp(logits, nxt)
            else:
                u = torch.rand(B, generator=generator, device=dev)
                nxt, lp = sample_with_logp(logits, u, temperature)
            forced = (t < plen) if plen is not None else torch.zeros(B, dtype=torch.bool, device=dev)
            if bool(forced.any()):
                ref = prefix[:, min(t, prefix.shape[1] - 1)]
                nxt = torch.where(forced, ref, nxt)
                lp = torch.where(forced, self.token_logp(logits, ref), lp)
            nxt = torch.where(alive, nxt, torch.full_like(nxt, self.pad_id))
            tokens.append(nxt)
            token_mask.append(alive.float())
            action_mask.append((alive & ~forced).float())
            logps.append(torch.where(alive, lp, 0.0))
            alive = alive & (nxt != self.eos_id)
            tok = nxt
            if not alive.any():
                break
        return SampleOutput(
            torch.stack(tokens, 1), torch.stack(token_mask, 1), torch.stack(action_mask, 1),
            torch.stack(logps, 1),
        )

    @torch.no_grad()
    def generate(
        self,
        src: torch.Tensor,
        src_len: torch.Tensor,
        max_len: torch.Tensor,
        temperature: torch.Tensor,
        top_k: torch.Tensor,
        generators: list[torch.Generator | None],
        top_p: torch.Tensor | None = None,
    ) -> SampleOutput:
        """Serving-time decoding with per-row settings, batched across requests.

        ``max_len`` (B,) int, ``temperature`` (B,) float (0 = greedy), ``top_k`` (B,) int (0 = whole
        vocabulary), ``top_p`` (B,) float in (0, 1] (nucleus sampling, Holtzman et al. 2020: only the most
        likely tokens whose probabilities, after temperature and top-k, first reach ``top_p`` in total;
        1 or None = no cut). Sampling is Gumbel-max, argmax(logits / T + G) with G = −log(−log U), U drawn
        from row ``i``'s own ``generators[i]``: a row's tokens depend only on its input and its generator,
        never on which other requests share the batch (reproducible replies per seed). ``logp`` is
        log π_θ(y_t) at temperature 1, whatever the row's sampling settings.
        """
        B = src.shape[0]
        dev = src.device
        h = self.encode(src, src_len)
        tok = torch.full((B,), self.bos_id, dtype=torch.long, device=dev)
        alive = torch.ones(B, dtype=torch.bool, device=dev)
        greedy = temperature <= 0
        temp = torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(1)
        T = int(max_len.max()) if B else 0
        # each row's uniforms in one call of its own generator, max_len_i × V of them (so a row's draw
        # does not depend on its neighbours' lengths), padded to (B, T, V)
        u = torch.full((B, T, self.vocab_size), 0.5, device=dev)
        for i, (g, n) in enumerate(zip(generators, max_len.tolist())):
            u[i, :n] = torch.rand(n, self.vocab_size, generator=g, device=dev)
        gumbel_all = -torch.log(-torch.log(u.clamp_(min=1e-20, max=1.0 - 1e-7)))
        k = top_k.clamp(min=0, max=self.vocab_size)
        use_top_k = bool((k > 0).any())
        p_cut = None if top_p is None or not bool((top_p < 1).any()) else top_p.unsqueeze(1)  # (B, 1)
        tokens, token_mask, logps = [], [], []
        for t in range(T):
            alive = alive & (t < max_len)
            if not alive.any():
                break
            logits, _, h = self.decode_step(tok, h)
            logp_all = torch.log_softmax(logits, dim=-1)
            scaled = logits / temp
            if use_top_k:
                kth = scaled.sort(dim=-1, descending=True).values.gather(1, (k - 1).clamp(min=0).unsqueeze(1))
                scaled = torch.where((k.unsqueeze(1) > 0) & (scaled < kth), float("-inf"), scaled)
            if p_cut is not None:
                # drop a token when the tokens more likely than it already hold top_p (the first never);
                # rows with top_p = 1 are left alone, not cut by rounding in the cumulative sum
                srt, order = scaled.sort(dim=-1, descending=True, stable=True)
                probs = torch.softmax(srt, dim=-1)
                drop = ((probs.cumsum(-1) - probs) >= p_cut) & (p_cut < 1)
                scaled = scaled.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
            nxt = torch.where(greedy, logits.argmax(-1), (scaled + gumbel_all[:, t]).argmax(-1))
            nxt = torch.where(alive, nxt, torch.full_like(nxt, self.pad_id))
            tokens.append(nxt)
            token_mask.append(alive.float())
            logps.append(torch.where(alive, logp_all.gather(1, nxt[:, None]).squeeze(1), 0.0))
            alive = alive & (nxt != self.eos_id)
            tok = nxt
        if not tokens:
            empty = torch.zeros(B, 0, device=dev)
            return SampleOutput(empty.long(), empty, empty, empty)
        token_mask_t = torch.stack(token_mask, 1)
        return SampleOutput(torch.stack(tokens, 1), token_mask_t, token_mask_t, torch.stack(logps, 1))

    def greedy(self, src: torch.Tensor, src_len: torch.Tensor, max_len: int) -> torch.Tensor:
        """Greedy decode, (B, T) tokens (evaluation and serving)."""
        return self.sample(src, src_len, max_len, greedy=True).tokens


def build_generator(vocab_size: int, model_cfg, specials, *, conditional: bool = True,
                    banned_ids: tuple[int, ...] = ()) -> Seq2SeqGRU:
    """Generator from a ModelConfig and a vocabulary's special ids (the task says conditional/banned)."""
    return Seq2SeqGRU(
        vocab_size,
        emb_dim=model_cfg.emb_dim,
        hidden_dim=model_cfg.hidden_dim,
        num_layers=model_cfg.num_layers,
        dropout=model_cfg.dropout,
        pad_id=specials.pad,
        bos_id=specials.bos,
        eos_id=specials.eos,
        cell=getattr(model_cfg, "cell", "gru"),
        conditional=conditional,
        banned_ids=banned_ids,
    )


__all__ = ["GeneratorOutput", "SampleOutput", "Seq2SeqGRU", "build_generator", "state_cat", "state_index"]
