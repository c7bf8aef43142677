"""Typed batches that cross processes (docs/concepts/actor-groups.md, "The data flow").

Shapes: B batch, S source length, T target/generated length. Token ids are int64 numpy arrays;
float fields are float32. Containers hold numpy arrays (cheap to pickle into Ray's object store);
the learner turns them into torch tensors with :func:`to_torch`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np


def _pad_to(a: np.ndarray, width: int, value: float | int = 0) -> np.ndarray:
    if a.shape[1] == width:
        return a
    pad = np.full((a.shape[0], width - a.shape[1]) + a.shape[2:], value, dtype=a.dtype)
    return np.concatenate([a, pad], axis=1)


@dataclass
class PromptBatch:
    """Inputs sent to rollout workers (and, with targets, to the learner for MLE)."""

    src: np.ndarray  # (B, S) int64 source tokens, right-padded with pad id
    src_len: np.ndarray  # (B,) int64 source lengths (>= 1)
    tgt: np.ndarray | None = None  # (B, T) int64 reference target (MLE, forced prefixes), right-padded
    tgt_len: np.ndarray | None = None  # (B,) int64 reference lengths
    key: np.ndarray | None = None  # (B,) int64 the task's id of the input (pairs, chitchat: its row)
    # every array is the task's rows of ``key`` (``Task.prompt_rows``): an actor that holds the task rebuilds the
    # batch from its keys, so the driver sends those (:meth:`compact`), not the token arrays
    keyed: bool = False

    def __len__(self) -> int:
        return int(self.src.shape[0])

    def slice(self, start: int, stop: int) -> PromptBatch:
        def cut(a):
            return None if a is None else a[start:stop]

        return PromptBatch(self.src[start:stop], self.src_len[start:stop], cut(self.tgt), cut(self.tgt_len),
                           cut(self.key), self.keyed)

    def compact(self) -> PromptBatch | PromptKeys:
        """What is sent to an actor: the keys of a keyed batch (:class:`PromptKeys`), else the batch."""
        return PromptKeys(self.key, self.tgt is not None) if self.keyed else self

    def split(self, n: int) -> list[PromptBatch]:
        """``n`` near-equal contiguous shards (for ``n`` workers); empty shards are dropped."""
        bounds = np.linspace(0, len(self), n + 1).round().astype(int)
        return [self.slice(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]

    def repeat(self, k: int, tgt: np.ndarray | None = None) -> PromptBatch:
        """Each row repeated ``k`` times in consecutive rows (row b·k + j is a copy of row b): groups of samples
        of one prompt (GRPO, RLOO), RAML's samples. ``tgt``, when given, replaces the repeated targets (it must
        already have B·k rows)."""

        def rep(a):
            return None if a is None else np.repeat(a, k, axis=0)

        return PromptBatch(rep(self.src), rep(self.src_len), rep(self.tgt) if tgt is None else tgt, rep(self.tgt_len),
                           rep(self.key), self.keyed and tgt is None)


@dataclass
class PreferenceBatch:
    """Preference pairs for a reward model's update (``algo.name=reward_model``): a prompt, a preferred reply and a
    dispreferred one, each reply ending at <eos> (its reward is read at that position)."""

    src: np.ndarray  # (B, S) int64 prompts, right-padded
    src_len: np.ndarray  # (B,) int64
    chosen: np.ndarray  # (B, T) int64 y⁺ then <eos>, right-padded
    chosen_len: np.ndarray  # (B,) int64 tokens of y⁺ without <eos> (the index of its <eos>)
    rejected: np.ndarray  # (B, T) int64 y⁻ then <eos>, right-padded
    rejected_len: np.ndarray  # (B,) int64
    margin: np.ndarray  # (B,) float32 m of −log σ(r⁺ − r⁻ − m)

    def __len__(self) -> int:
        return int(self.src.shape[0])

    def compact(self) -> PreferenceBatch:
        """What is sent to an actor: the arrays themselves."""
        return self


@dataclass
class PromptKeys:
    """A keyed :class:`PromptBatch` as the driver sends it to an actor: its rows' keys into the task's data (B,)
    int64, and whether it carries targets; the actor's task rebuilds the arrays (:func:`prompt_arrays`). A batch of
    4,096 prompts of 64 tokens with targets of 64 is 32 KiB of keys instead of 4 MiB of token arrays."""

    key: np.ndarray
    with_targets: bool = False

    def __len__(self) -> int:
        return int(self.key.shape[0])


def prompt_arrays(prompts: PromptBatch | PromptKeys, task) -> PromptBatch:
    """``prompts`` as token arrays: :class:`PromptKeys` rebuilt by ``task.prompt_rows`` (the same rows the driver's
    task gave, bit for bit), a batch as it is."""
    if isinstance(prompts, PromptKeys):
        return task.prompt_rows(prompts.key, with_targets=prompts.with_targets)
    return prompts


@dataclass
class RolloutRequest:
    """How to sample: passed with each PromptBatch."""

    max_len: int  # T, generation length cap
    temperature: float = 1.0
    seed: int | None = None  # per-call sampling seed (reproducible rollouts)
    # how the replies are drawn: an object of the algorithm's (rayseq.algos.sampling.Sampler); None: π_θ through the
    # rollout engine
    sampler: Any = None


@dataclass
class Rollout:
    """Sampled sequences with their behaviour-policy log-probs and rewards (π_old of Eq. 3-4)."""

    src: np.ndarray  # (B, S) int64 source tokens
    src_len: np.ndarray  # (B,) int64
    tokens: np.ndarray  # (B, T) int64 y_1..y_T (forced prefix + sampled), pad after EOS
    token_mask: np.ndarray  # (B, T) float32 1 for every real token (prefix and sampled, EOS included)
    action_mask: np.ndarray  # (B, T) float32 1 where the policy sampled the token (RL loss positions)
    # (B, T) float32 log π_old(y_t | x, y_<t) at temperature 1, 0 where token_mask=0; None until the learners compute
    # it, for a rollout of an engine whose log-probs are not the policy's (engine_logp set: rollout.engine=vllm)
    logp: np.ndarray | None
    rewards: np.ndarray  # (B, T) float32 per-token reward r_t (terminal reward on the last real token)
    score: np.ndarray  # (B,) float32 sequence-level reward (logging)
    tgt: np.ndarray | None = None  # (B, T') int64 reference, when the prompt had one
    version: int = 0  # weights version the rollout was sampled with
    info: dict = field(default_factory=dict)  # worker id, timings
    returns: np.ndarray | None = None  # (B, T) float32 R_t given directly (action values Q); else Σ γ^k r_{t+k}
    key: np.ndarray | None = None  # (B,) int64 PromptBatch.key (the task's id of each input)
    term_scores: np.ndarray | None = None  # (B, K) float32 each term f_k of a configured reward, unweighted
    # (B, T) float32 log π_engine(y_t | …) as the engine computed it, where its kernels are not the policy's
    # (rollout.engine=vllm); ``logp`` is then the policy's own, computed by the learners
    # (rayseq.algos.common.behaviour_logprobs)
    engine_logp: np.ndarray | None = None
    # (B, T) float32 truncated importance weights min(π_policy / π_engine, C) of the sampled tokens, which the ratio
    # algorithms put on their advantages (rollout.logp_correction; computed by the learners with ``logp``); None: 1
    is_weights: np.ndarray | None = None
    # per-row arrays a sampler added (RolloutRequest.sampler) and scored, name -> (B,) or (B, T', ...): cut, split
    # and concatenated with the rollout's other per-row fields
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def split(self, n: int) -> list[Rollout]:
        """``n`` near-equal contiguous shards along B (empty ones dropped)."""
        bounds = np.linspace(0, len(self), n + 1).round().astype(int)
        return [self.rows(slice(a, b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]

    def rows(self, index) -> Rollout:
        """The rows ``index`` (a slice or an int array into B) of every per-row field and extra; the rest as it is."""
        kw = {f.name: getattr(self, f.name) for f in fields(Rollout)}
        for k, v in kw.items():
            if isinstance(v, np.ndarray):
                kw[k] = v[index]
        kw["extras"] = {k: v[index] for k, v in self.extras.items()}
        return Rollout(**kw)

    @staticmethod
    def concat(parts: list[Rollout]) -> Rollout:
        """Concatenate along B, padding T (and S) to the widest part; the extras likewise, name by name (every part
        has the same names: they were sampled with one request)."""
        if len(parts) == 1:
            return parts[0]
        out = {}
        for f in fields(Rollout):
            vals = [getattr(p, f.name) for p in parts]
            if f.name == "version":
                out[f.name] = min(vals)
            elif f.name == "info":
                out[f.name] = {"parts": [p.info for p in parts]}
            elif f.name == "extras":
                names = [sorted(v) for v in vals]
                if any(n != names[0] for n in names):
                    raise ValueError(f"Rollout.concat: the parts carry different extras {names}")
                out[f.name] = {k: _rows_joined([v[k] for v in vals]) for k in vals[0]}
            else:
                out[f.name] = _rows_joined(vals)
        return Rollout(**out)


def _rows_joined(vals: list) -> np.ndarray | None:
    """One per-row field of several parts, concatenated along B: (B_i,) as they are, (B_i, T_i, ...) right-padded with
    0 to the widest T_i; None where the first part has none."""
    if vals[0] is None:
        return None
    if vals[0].ndim == 1:
        return np.concatenate(vals)
    width = max(v.shape[1] for v in vals)
    return np.concatenate([_pad_to(v, width) for v in vals])


def to_torch(a: np.ndarray, device="cpu"):
    import torch

    return torch.from_numpy(np.require(a, requirements=["C", "W"])).to(device)
