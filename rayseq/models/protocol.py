"""The policy protocol: what a generator class must provide to be ``model.arch`` (built-in: ``rnn``
:class:`rayseq.models.generator.Seq2SeqGRU`, ``transformer`` :class:`rayseq.models.transformer.TransformerGenerator`;
your own as ``model.arch=package.module:Class``), and :class:`StepDecoding`, the phase methods every built-in
policy shares, written once on top of three building blocks.

Every algorithm, the rollout workers, Monte-Carlo search, evaluation, serving and the RLlib module call only the
methods below, so none of them branches on the architecture. Shapes: B batch, S source length, T target length,
H = ``state_dim``, V vocabulary. Sources are right-padded, ``src_len`` (B,) gives lengths; an unconditional model
(``conditional = False``: SeqGAN's oracle task) gets ``src`` (B, 0) and ignores it.

Construction
    ``from_config(cfg: RunConfig, task) -> nn.Module`` (classmethod): the model for a run. It may read ``cfg.model``
    (serving rebuilds a checkpoint's model with only ``cfg.model`` set) and the task's ``vocab`` (its size),
    ``specials`` (``pad``/``bos``/``eos`` ids), ``conditional`` and ``banned_ids``.

Attributes
    ``vocab_size``, ``pad_id``, ``bos_id``, ``eos_id``, ``conditional``; ``banned_ids`` (ids never emitted:
    ``<pad>``, ``<bos>`` and the task's) and ``logit_bias`` (V,) 0 or −inf on them; ``state_dim`` = H, the size
    of the per-step states the value baseline and the critic read.

Building blocks (what :class:`StepDecoding` needs)
    ``encode(src, src_len) -> state``: the decoding state before ``<bos>`` (a GRU's h_0; a Transformer's encoder
    keys/values and an empty self-attention cache).
    ``advance(tok (B,), state) -> (out (B, H), state)``: feed one token; ``out`` produces the next distribution.
    ``output_logits(out (..., H)) -> (..., V)``: logits with the banned ids at −inf, the one place logits come
    from (so the policy trained, evaluated, searched and served is one distribution).
    ``output_projection() -> (weight (V, H), bias (V,)) | None`` (optional; :class:`StepDecoding` gives it for a
    linear ``out`` layer): lets Monte-Carlo search sample without writing the (R, V) logits.
    ``state_index(state, idx (R,)) -> state`` and ``state_cat([state, ...]) -> state``: rows of a state, and states
    joined along the batch (a tensor or a tuple of tensors; :class:`StepDecoding` assumes the batch in dim 1, an
    RNN's (L, B, H) layout; override them otherwise).

Phase methods (given by :class:`StepDecoding`, or your own with the same results)
    ``logprobs(src, src_len, tokens (B, T)) -> GeneratorOutput(logp (B, T), states (B, T, H), logits (B, T, V))``:
    teacher-forced (decoder input ``<bos>``, y_1..y_{T−1}); logp 0 at ``<pad>``. Every model writes its own (one
    pass over the sequence), and it must agree with stepping :meth:`advance` (the tests check it).
    ``decode_step(tok, state) -> (logits (B, V), out (B, H), state)``: :meth:`advance` then :meth:`output_logits`
    (ERPO's sampler and scheduled sampling step the policy with it).
    ``prefix_states(src, src_len, tokens (B, T)) -> (outs, states)``: lists over prefix lengths t = 1..T−1 of the
    output (B, H) and the state after ``<bos>``, y_1..y_t: Monte-Carlo search continues every prefix from these
    (no prefix is re-run). :class:`StepDecoding` steps :meth:`advance`; a model with a one-pass cache (the
    Transformer) overrides it.
    ``token_logp``, ``first_step_logprobs``, ``sample`` (rollouts, MIXER's forced prefix, greedy), ``generate``
    (serving: per-row temperature, top-k, top-p, seeds), ``greedy``: see :class:`StepDecoding`.

Sampling is inverse-CDF (:func:`rayseq.models.sampling.inverse_cdf_sample`): exact, one uniform per row and
step, and several times faster than ``torch.multinomial`` on CPU at V = 5000.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rayseq.models.sampling import sample_with_logp


class GeneratorOutput(NamedTuple):
    logp: torch.Tensor  # (B, T) log π(y_t | x, y_<t) of the given tokens
    states: torch.Tensor  # (B, T, H) decoder states s_t that produced the distribution of y_t
    logits: torch.Tensor | None  # (B, T, V); None from a pass that keeps none (an HF policy's chunked_logprobs)
    entropy: torch.Tensor | None = None  # (B, T) H(π(·|s_t)), from a pass without logits that was asked for it


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


def lean_logprobs(generator, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor) -> tuple:
    """Log-probs (B, T) and states (B, T, H) of ``tokens`` for a pass without gradients (baseline values, the KL
    reference): the model's own ``lean_logprobs`` when it has one (which keeps no (B, T, V) logits: the HF policy runs
    its head a few positions at a time), else :meth:`logprobs`'."""
    lean = getattr(generator, "lean_logprobs", None)
    if lean is not None:
        return lean(src, src_len, tokens)
    out = generator.logprobs(src, src_len, tokens)
    return out.logp, out.states


class StepDecoding:
    """The phase methods of the protocol (module docstring) on top of ``encode``, ``advance`` and
    ``output_logits``; mixed into an ``nn.Module`` that sets the protocol's attributes."""

    @property
    def state_dim(self) -> int:
        return self.hidden_dim

    def state_index(self, state, idx: torch.Tensor):
        return state_index(state, idx)

    def state_cat(self, states: list):
        return state_cat(states)

    def token_logp(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """log softmax(logits)[tokens]: logits (..., V), tokens (...) -> (...); 0 at ``<pad>`` (no token there)."""
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # fp32 always
        return torch.where(tokens == self.pad_id, 0.0, logp)

    def output_projection(self):
        """``(weight (V, H), bias (V,))`` when :meth:`output_logits` is the linear map ``out @ weightᵀ + bias``
        (``bias`` with the banned ids at −inf; dropout is off in the evaluation mode MC search runs in), so that
        Monte-Carlo search samples with :func:`rayseq.models.sampling.sample_projected` without writing the (R, V)
        logits; ``None`` (any other head) makes it call :meth:`output_logits`."""
        out = getattr(self, "out", None)
        if not isinstance(out, torch.nn.Linear) or out.bias is None:
            return None
        return out.weight, out.bias + self.logit_bias

    def decode_step(self, tok: torch.Tensor, state):
        """One decoder step (sampling, decoding, ERPO's sampler and scheduled sampling advance the policy with it):
        tok (B,), state -> logits (B, V) with the banned ids at −inf, out (B, H), the new state."""
        out, state = self.advance(tok, state)
        return self.output_logits(out), out, state

    @torch.no_grad()
    def prefix_states(self, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor):
        """Outputs (B, H) and states after each prefix <bos>, y_1..y_t, t = 1..T−1 (they give y_{t+1})."""
        B, T = tokens.shape
        state = self.encode(src, src_len)
        tok = torch.full((B,), self.bos_id, dtype=torch.long, device=tokens.device)
        outs, states = [], []
        for t in range(T):  # feed BOS, y_1..y_{T−1}; the state after BOS (prefix length 0) is not kept
            out, state = self.advance(tok, state)
            if t > 0:
                outs.append(out)
                states.append(state)
            tok = tokens[:, t]
        return outs, states

    def first_step_logprobs(self, src: torch.Tensor, src_len: torch.Tensor) -> torch.Tensor:
        """log π(y_1 | x) over the vocabulary, (B, V)."""
        state = self.encode(src, src_len)
        logits, _, _ = self.decode_step(torch.full_like(src_len, self.bos_id), state)
        return torch.log_softmax(logits.float(), dim=-1)

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
        state = self.encode(src, src_len)
        tok = torch.full((B,), self.bos_id, dtype=torch.long, device=dev)
        alive = torch.ones(B, dtype=torch.bool, device=dev)
        plen = None
        if prefix is not None and prefix_len is not None:
            plen = torch.as_tensor(prefix_len, device=dev).expand(B).clamp(max=prefix.shape[1])
        tokens, token_mask, action_mask, logps = [], [], [], []
        for t in range(max_len):
            logits, _, state = self.decode_step(tok, state)
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
        *,
        repetition_penalty: torch.Tensor | None = None,
        presence_penalty: torch.Tensor | None = None,
        frequency_penalty: torch.Tensor | None = None,
        no_repeat_ngram_size: torch.Tensor | None = None,
        banned_ids: tuple[int, ...] = (),
    ) -> SampleOutput:
        """Serving-time decoding with per-row settings, batched across requests.

        ``max_len`` (B,) int, ``temperature`` (B,) float (0 = greedy), ``top_k`` (B,) int (0 = whole
        vocabulary), ``top_p`` (B,) float in (0, 1] (nucleus sampling, Holtzman et al. 2020: only the most
        likely tokens whose probabilities, after temperature and top-k, first reach ``top_p`` in total;
        1 or None = no cut). Sampling is Gumbel-max, argmax(logits / T + G) with G = −log(−log U), U drawn
        from row ``i``'s own ``generators[i]``: a row's tokens depend only on its input and its generator,
        never on which other requests share the batch (reproducible replies per seed). ``logp`` is
        log π_θ(y_t) at temperature 1, whatever the row's sampling settings.

        What a chat API offers against repetition, per row, applied to the logits before temperature, top-k, top-p
        and the greedy argmax (:func:`penalize`), counting the tokens of the reply so far (not the input):
        ``repetition_penalty`` (B,) θ ≥ 1 (Keskar et al. 2019, CTRL: a token already in the reply has its logit
        divided by θ when positive, multiplied when negative; 1 = off), ``presence_penalty`` / ``frequency_penalty``
        (B,) (OpenAI's: logit − presence·[count > 0] − frequency·count; 0 = off), ``no_repeat_ngram_size`` (B,) n
        (no n-gram occurs twice in a reply: a token that would complete an n-gram already in it is banned; 0 =
        off). ``banned_ids``: never emitted here (serving bans ``<unk>``).
        """
        B = src.shape[0]
        dev = src.device
        state = self.encode(src, src_len)
        tok = torch.full((B,), self.bos_id, dtype=torch.long, device=dev)
        alive = torch.ones(B, dtype=torch.bool, device=dev)
        greedy = temperature <= 0
        temp = torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(1)
        T = int(max_len.max()) if B else 0
        lengths = max_len.tolist()
        k = top_k.clamp(min=0, max=self.vocab_size)
        use_top_k = bool((k > 0).any())
        p_cut = None if top_p is None or not bool((top_p < 1).any()) else top_p.unsqueeze(1)  # (B, 1)
        penalties = _Penalties(B, self.vocab_size, dev, repetition_penalty, presence_penalty, frequency_penalty,
                               no_repeat_ngram_size, banned_ids)
        tokens, token_mask, logps = [], [], []
        for t in range(T):
            # row i's t-th V uniforms from its own generator, only while t < max_len_i (so a row's draws do not
            # depend on its neighbours' lengths); drawn step by step, never (B, T, V) at once: a Hugging Face
            # vocabulary of 50k-150k tokens would make that gigabytes
            u = torch.full((B, self.vocab_size), 0.5, device=dev)
            for i, (g, n) in enumerate(zip(generators, lengths)):
                if t < n:
                    u[i] = torch.rand(self.vocab_size, generator=g, device=dev)
            alive = alive & (t < max_len)
            if not alive.any():
                break
            logits, _, state = self.decode_step(tok, state)
            logits = logits.float()
            logp_all = torch.log_softmax(logits, dim=-1)
            logits = penalties(logits, tokens)
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
            gumbel = -torch.log(-torch.log(u.clamp_(min=1e-20, max=1.0 - 1e-7)))
            nxt = torch.where(greedy, logits.argmax(-1), (scaled + gumbel).argmax(-1))
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


def penalize(logits: torch.Tensor, counts: torch.Tensor, repetition: torch.Tensor, presence: torch.Tensor,
             frequency: torch.Tensor) -> torch.Tensor:
    """Repetition penalties on logits (B, V) given counts (B, V) of each token in the reply so far, and per-row
    repetition θ (B,), presence and frequency (B,) (:meth:`StepDecoding.generate`):
    z' = (z / θ if z > 0 else z·θ) where count > 0, then z' − presence·[count > 0] − frequency·count."""
    seen = counts > 0
    theta = repetition.unsqueeze(1)
    z = torch.where(seen, torch.where(logits > 0, logits / theta, logits * theta), logits)
    return z - presence.unsqueeze(1) * seen - frequency.unsqueeze(1) * counts


def repeated_ngram_bans(reply: torch.Tensor, n: int) -> list[list[int]]:
    """Per row of ``reply`` (B, t): the tokens that would complete an ``n``-gram already in it (the next token after
    each earlier occurrence of its last n − 1 tokens); empty when t < n (no complete n-gram yet) or n < 1."""
    B, t = reply.shape
    if n < 1 or t < n:
        return [[] for _ in range(B)]
    if n == 1:
        return [sorted(set(row)) for row in reply.tolist()]
    windows = reply.unfold(1, n, 1)  # (B, t − n + 1, n) every n-gram so far
    match = (windows[:, :, : n - 1] == reply[:, t - n + 1 :].unsqueeze(1)).all(-1)  # its first n − 1 = the last n − 1
    return [windows[b, match[b], n - 1].tolist() for b in range(B)]


class _Penalties:
    """The repetition settings of a :meth:`StepDecoding.generate` batch, applied step by step."""

    def __init__(self, B, V, dev, repetition, presence, frequency, ngram, banned_ids):
        zeros = torch.zeros(B, device=dev)
        self.repetition = torch.ones(B, device=dev) if repetition is None else repetition.to(dev, torch.float32)
        self.presence = zeros if presence is None else presence.to(dev, torch.float32)
        self.frequency = zeros if frequency is None else frequency.to(dev, torch.float32)
        self.ngram = [0] * B if ngram is None else [int(n) for n in ngram.tolist()]
        self.counted = bool((self.repetition != 1).any() or (self.presence != 0).any() or (self.frequency != 0).any())
        self.counts = torch.zeros(B, V, device=dev) if self.counted else None
        self.banned = list(banned_ids)

    def __call__(self, logits: torch.Tensor, tokens: list[torch.Tensor]) -> torch.Tensor:
        """logits (B, V) of the next token, after the reply's ``tokens`` (one (B,) tensor per step so far)."""
        if self.banned:
            logits = logits.index_fill(1, torch.tensor(self.banned, device=logits.device), float("-inf"))
        if self.counted:
            if tokens:  # count the last token (pad after a reply's end is never a candidate, so its count is moot)
                last = tokens[-1][:, None]
                self.counts.scatter_add_(1, last, torch.ones_like(last, dtype=self.counts.dtype))
            logits = penalize(logits, self.counts, self.repetition, self.presence, self.frequency)
        if tokens and any(self.ngram):
            reply = torch.stack(tokens, 1)
            rows, cols = [], []
            for n in set(self.ngram) - {0}:
                idx = [b for b, m in enumerate(self.ngram) if m == n]
                for b, bans in zip(idx, repeated_ngram_bans(reply[idx], n)):
                    rows += [b] * len(bans)
                    cols += bans
            if rows:
                logits = logits.index_put((torch.tensor(rows, device=logits.device),
                                           torch.tensor(cols, device=logits.device)),
                                          torch.tensor(float("-inf"), device=logits.device))
        return logits


__all__ = ["GeneratorOutput", "SampleOutput", "StepDecoding", "penalize", "repeated_ngram_bans", "state_cat",
           "state_index"]
