"""The policy's next action in each of a batch of episodes: a continuation of the episode's tokens so far.

Each turn every active episode has its prompt ``src`` and its tokens so far (the earlier actions as sampled and the
observations as rendered); the policy samples up to ``max_new`` tokens after them, to its end token. Two ways, one
chosen per policy (:func:`make_continuation`):

- :class:`StreamContinuation` — a policy that reads its prompt and reply as one stream (a Hugging Face causal LM whose
  prompts end with the chat template's generation prompt): the prompt of turn k is the prompt and the tokens so far,
  joined, and the engine samples after it (``rollout.engine``: the built-in loop, or vLLM with its prefix cache).
- :class:`StepContinuation` — any policy of the step protocol (:mod:`rayseq.models.protocol`: the GRU and Transformer
  encoder-decoders): the prompt encoded, the tokens so far fed as a forced prefix (per row, its own length), then
  sampled; one uniform per row and step, so a call is reproducible with its seed.

Either way the sampled ids and their log-probs (at temperature 1, the behaviour policy's) are returned as the engine
produced them: the episode keeps them, never re-encoded.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from rayseq.models.sampling import sample_with_logp


class Continued(NamedTuple):
    """One turn's sampled actions, per row."""

    ids: list[list[int]]  # the sampled ids, the end token included when it was sampled
    logp: list[np.ndarray]  # (n_b,) float32 their log-probs as the engine computed them (temperature 1)
    ended: list[bool]  # the end token was sampled (else the action was cut at max_new)


def _padded(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max((len(r) for r in rows), default=1))
    out = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    return out.to(device), torch.as_tensor([len(r) for r in rows], dtype=torch.long, device=device)


class StepContinuation:
    """Continue each row's forced prefix with the step protocol's ``encode`` and ``decode_step`` (module docstring)."""

    def __init__(self, policy, device):
        self.policy, self.device = policy, device

    @torch.no_grad()
    def __call__(self, srcs, prefixes, max_new: int, *, temperature: float = 1.0, seed: int | None = None) -> Continued:
        p, dev = self.policy, self.device
        B = len(srcs)
        src, src_len = _padded(srcs, p.pad_id, dev)
        prefix, prefix_len = _padded(prefixes, p.pad_id, dev)
        gen = None if seed is None else torch.Generator(device=dev).manual_seed(int(seed))
        state = p.encode(src, src_len)
        tok = torch.full((B,), p.bos_id, dtype=torch.long, device=dev)
        alive = torch.ones(B, dtype=torch.bool, device=dev)
        count = torch.zeros(B, dtype=torch.long, device=dev)
        out = torch.full((B, max_new), p.pad_id, dtype=torch.long, device=dev)
        out_lp = torch.zeros(B, max_new, device=dev)
        rows = torch.arange(B, device=dev)
        for t in range(int(prefix_len.max()) + max_new):
            logits, _, state = p.decode_step(tok, state)
            u = torch.rand(B, generator=gen, device=dev)
            nxt, lp = sample_with_logp(logits, u, temperature)
            forced = t < prefix_len
            if bool(forced.any()):
                nxt = torch.where(forced, prefix[:, min(t, prefix.shape[1] - 1)], nxt)
            sampling = alive & ~forced
            if bool(sampling.any()):
                r, c = rows[sampling], count[sampling]
                out[r, c], out_lp[r, c] = nxt[sampling], lp[sampling].float()
                count = count + sampling.long()
                alive = alive & ~(sampling & ((nxt == p.eos_id) | (count >= max_new)))
            tok = nxt
            if not bool(alive.any()):
                break
        ids, logps, ended = [], [], []
        for b in range(B):
            n = int(count[b])
            ids.append(out[b, :n].tolist())
            logps.append(out_lp[b, :n].cpu().numpy().astype(np.float32))
            ended.append(n > 0 and ids[-1][-1] == p.eos_id)
        return Continued(ids, logps, ended)


class StreamContinuation:
    """Sample after each row's prompt and tokens so far, joined into one prompt, with the rollout engine."""

    def __init__(self, engine, pad_id: int, eos_id: int, device):
        self.engine, self.pad_id, self.eos_id, self.device = engine, pad_id, eos_id, device

    @torch.no_grad()
    def __call__(self, srcs, prefixes, max_new: int, *, temperature: float = 1.0, seed: int | None = None) -> Continued:
        joined = [list(s) + list(x) for s, x in zip(srcs, prefixes)]
        src, src_len = _padded(joined, self.pad_id, self.device)
        out = self.engine.generate(src, src_len, max_new, temperature=temperature, seed=seed)
        mask = out.token_mask.cpu().numpy() > 0
        toks, lps = out.tokens.cpu().numpy(), out.logp.float().cpu().numpy()
        ids = [toks[b, mask[b]].tolist() for b in range(len(joined))]
        return Continued(ids, [lps[b, mask[b]].astype(np.float32) for b in range(len(joined))],
                         [bool(r) and r[-1] == self.eos_id for r in ids])


def reads_one_stream(policy) -> bool:
    """The policy reads prompt and reply as one stream (its prompts mark their own end: ``separator`` False)."""
    return getattr(policy, "separator", True) is False


def context_length(policy, engine=None) -> int | None:
    """The positions a policy that reads one stream attends to at most, prompt and reply together: its Hugging Face
    config's ``max_position_embeddings``, or the engine's ``max_model_len`` where smaller (vLLM's, which
    ``rollout.engine_kwargs`` may set lower); None for a step policy (its episodes keep no such limit)."""
    if not reads_one_stream(policy):
        return None
    config = getattr(getattr(policy, "model", None), "config", None)
    limits = [n for n in (getattr(config, "max_position_embeddings", None), getattr(engine, "max_model_len", None))
              if n]
    return int(min(limits)) if limits else None


def make_continuation(policy, engine, device):
    """:class:`StreamContinuation` with ``engine`` for a policy that reads one stream, else :class:`StepContinuation`
    with the policy's own decoding (the built-in engine's)."""
    if reads_one_stream(policy):
        return StreamContinuation(engine, policy.pad_id, policy.eos_id, device)
    if engine is not None and getattr(engine, "name", "builtin") != "builtin":
        raise ValueError(f"rollout.engine={engine.name} continues episodes of a policy that reads prompt and reply as "
                         "one stream (model.arch=hf with a chat template); this policy needs rollout.engine=builtin")
    return StepContinuation(policy, device)
