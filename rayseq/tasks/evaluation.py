"""An evaluation in two halves: the decodes (the policy's replies to a held-out split's inputs, greedy and
sampled) and the figures computed from them, with what needs the policy's likelihood.

A task that splits its evaluation so provides three methods beside ``evaluate`` (:class:`SplitEvaluation`):

- ``eval_decodes(split) -> [EvalDecode]``: the decodes of the split, each a chunk of its inputs;
- ``eval_inputs(decode) -> (src (n, S), src_len (n,))``: that chunk's inputs (every process that holds the task
  rebuilds them: nothing but the chunk's description travels);
- ``eval_figures(split, decoded, generator, device) -> (metrics, details)``: the ``<split>/*`` metrics from the
  decodes' ``(tokens (n, max_len) int64, token mask (n, max_len) float32)`` in the order of ``eval_decodes``; the
  ``generator`` is read only for what needs the policy's likelihood (counting's first-step distribution, the oracle's
  NLL of held-out data), in the task's evaluation batches, without gradients.

A task whose decodes are not replies to prompts (the environment's episodes, :class:`rayseq.episodes.task.EnvTask`)
gives ``eval_play(decode, sampler) -> result`` in place of ``eval_inputs``: it plays that decode with ``sampler`` (a
rollout worker's own, :class:`rayseq.episodes.runner.EpisodeSampler`: its engine, its environments) and returns a
compact, picklable result, which ``eval_figures`` reads in place of ``(tokens, mask)``.

Under Ray the rollout workers decode (each a share of the decodes, through its rollout engine, with the weights the
learners last published) and the learners compute the figures; in-process :func:`evaluate_here` runs both halves
on one generator, the same arithmetic.

Seeds. A split's inputs are cut into chunks of the task's evaluation batch (counting 1024 inputs, oracle 1000
samples, pairs 512 prompts); chunk ``c`` of the sampled replies draws from a generator seeded with
:func:`chunk_seed` (``seed`` itself for chunk 0), so a chunk's replies do not depend on which worker decodes it,
nor on how many there are. Greedy replies draw nothing. With one chunk a split samples exactly what a single
generator seeded with ``seed`` samples; with more, chunk c > 0 draws from its own seed where one generator would
have continued from chunk c − 1's last draw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch


@dataclass(frozen=True)
class EvalDecode:
    """One decode of an evaluation: replies to inputs ``start:stop`` of ``split``'s ``name`` inputs (e.g.
    ``greedy``, ``sampled``, ``examples``), chunk ``chunk`` of them, up to ``max_len`` tokens; greedy when ``seed``
    is None, else sampled at temperature 1 from a generator seeded with ``seed``."""

    split: str
    name: str
    chunk: int
    start: int
    stop: int
    max_len: int
    seed: int | None = None

    @property
    def rows(self) -> int:
        return self.stop - self.start


def chunk_seed(seed: int, chunk: int) -> int:
    """The seed of a split's sampled chunk ``chunk``: ``seed`` for chunk 0 (a one-chunk split samples what one
    generator seeded with ``seed`` does), ``seed · 1009 + chunk`` after it."""
    return int(seed) if chunk == 0 else int(seed) * 1009 + chunk


def chunked(split: str, name: str, n: int, batch: int, max_len: int, seed: int | None = None) -> list[EvalDecode]:
    """``n`` inputs in chunks of ``batch``: greedy decodes (``seed`` None) or sampled ones, chunk c seeded with
    :func:`chunk_seed` (seed, c)."""
    if batch < 1:
        raise ValueError(f"an evaluation batch holds at least one input, got {batch}")
    return [EvalDecode(split, name, c, a, min(a + batch, n), max_len, None if seed is None else chunk_seed(seed, c))
            for c, a in enumerate(range(0, n, batch))]


def joined(decodes: list[EvalDecode], decoded: list) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The decoded ``(tokens, mask)`` of each ``decodes[k]`` joined by name, in input order: {name: (tokens (n,
    max_len), mask (n, max_len))}. Checks that every decode came back with its rows."""
    if len(decodes) != len(decoded):
        raise ValueError(f"{len(decodes)} decodes, {len(decoded)} results")
    parts: dict[str, list] = {}
    for d, (tokens, mask) in zip(decodes, decoded):
        if len(tokens) != d.rows or tokens.shape != mask.shape:
            raise ValueError(f"decode {d}: {tokens.shape} tokens and {mask.shape} mask for {d.rows} rows")
        parts.setdefault(d.name, []).append((d.start, tokens, mask))
    out = {}
    for name, chunks in parts.items():
        chunks.sort(key=lambda c: c[0])
        out[name] = (np.concatenate([t for _, t, _ in chunks]), np.concatenate([m for _, _, m in chunks]))
    return out


# sample(src, src_len, max_len, greedy, seed) -> SampleOutput: a generator's loop (evaluate_here) or a rollout engine
Sampler = Callable[[torch.Tensor, torch.Tensor, int, bool, "int | None"], object]


@torch.no_grad()
def run_decode(sample: Sampler, src: np.ndarray, src_len: np.ndarray, decode: EvalDecode,
               device) -> tuple[np.ndarray, np.ndarray]:
    """``decode`` of the inputs ``src`` (n, S), ``src_len`` (n,) through ``sample``: tokens (n, max_len) int64 and
    their mask (n, max_len) float32, right-padded with 0 where the replies stopped early."""
    tokens = np.zeros((len(src), decode.max_len), dtype=np.int64)
    mask = np.zeros((len(src), decode.max_len), dtype=np.float32)
    if len(src) == 0:
        return tokens, mask
    s = sample(torch.from_numpy(np.ascontiguousarray(src)).to(device),
               torch.from_numpy(np.ascontiguousarray(src_len)).to(device), decode.max_len, decode.seed is None,
               decode.seed)
    t = min(s.tokens.shape[1], decode.max_len)
    tokens[:, :t] = s.tokens[:, :t].cpu().numpy()
    mask[:, :t] = s.token_mask[:, :t].cpu().numpy()
    return tokens, mask


def generator_sampler(generator, device) -> Sampler:
    """``generator``'s own decoding loop as a :data:`Sampler` (what the built-in rollout engine runs)."""

    def sample(src, src_len, max_len, greedy, seed):
        gen = None if seed is None else torch.Generator(device=device).manual_seed(int(seed))
        return generator.sample(src, src_len, max_len, greedy=greedy, generator=gen)

    return sample


class SplitEvaluation(Protocol):
    def eval_decodes(self, split: str) -> list[EvalDecode]: ...

    def eval_inputs(self, decode: EvalDecode) -> tuple[np.ndarray, np.ndarray]: ...

    def eval_figures(self, split: str, decoded: list, generator, device) -> tuple[dict, dict]: ...


def plays_its_decodes(task) -> bool:
    """Whether ``task`` plays each decode itself (``eval_play(decode, sampler)``, module docstring) rather than
    giving the inputs a rollout engine replies to (``eval_inputs``)."""
    return callable(getattr(task, "eval_play", None))


def decodes_split(task) -> bool:
    """Whether ``task`` splits its evaluation into decodes and figures (:class:`SplitEvaluation`, or with
    ``eval_play`` in place of ``eval_inputs``): its decodes can run on the rollout workers."""
    return (all(callable(getattr(task, m, None)) for m in ("eval_decodes", "eval_figures"))
            and (plays_its_decodes(task) or callable(getattr(task, "eval_inputs", None))))


@torch.no_grad()
def figures(task: SplitEvaluation, split: str, decoded: list, generator, device="cpu") -> tuple[dict, dict]:
    """``task.eval_figures`` with ``generator`` in evaluation mode (its mode restored)."""
    was_training = generator.training
    generator.eval()
    try:
        return task.eval_figures(split, decoded, generator, device)
    finally:
        generator.train(was_training)


@torch.no_grad()
def evaluate_here(task: SplitEvaluation, generator, device="cpu", *, split: str = "val") -> tuple[dict, dict]:
    """Both halves in this process on ``generator``: every decode of ``split`` with its own loop, then the figures."""
    was_training = generator.training
    generator.eval()
    try:
        sample = generator_sampler(generator, device)
        decoded = [run_decode(sample, *task.eval_inputs(d), d, device) for d in task.eval_decodes(split)]
    finally:
        generator.train(was_training)
    return figures(task, split, decoded, generator, device)


def check_split(split: str) -> str:
    if split not in ("val", "test"):
        raise ValueError(f"split must be 'val' or 'test', got {split!r}")
    return split
