"""How a rollout worker draws an algorithm's replies: the :class:`Sampler` protocol, what one sampling call gives a
sampler (:class:`SamplingCall`) and what it returns (:class:`Sampled`).

Most algorithms sample π_θ through the rollout engine (``rollout.engine``); that is :class:`PolicySampler`, what a
request without a sampler of its own gets (``RolloutRequest.sampler`` None). An algorithm that samples otherwise
owns a sampler in its own file and puts it on its requests (``Algorithm.rollout_request``); the worker and the
scorers run it without knowing which algorithm it belongs to:

- ERPO's q (:class:`rayseq.algos.erpo.QSampler`, for ``spg`` and ``erpo_interpolation``),
- MIXER's forced reference prefix (:class:`rayseq.algos.mixer.ReferencePrefix`),
- SCST's greedy decode beside the sample (:class:`rayseq.algos.scst.GreedyBaseline`), which adds per-row arrays to
  the rollout (``Rollout.extras``) and scores them where the rollout is scored.

A sampler travels inside the request (pickled to each worker and scorer): a small object of plain values, defined at
module level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch

from rayseq.models.protocol import SampleOutput
from rayseq.types import PromptBatch, Rollout


class Sampled(NamedTuple):
    """What a sampler drew for a shard of B prompts."""

    sample: SampleOutput  # (B, T) tokens, token_mask, action_mask, logp: log π_θ(y_t | x, y_<t) at temperature 1
    extras: dict[str, np.ndarray] = {}  # per-row arrays for Rollout.extras (B, ...), numpy on the CPU
    info: dict = {}  # diagnostics for Rollout.info (floats the algorithm's metrics read)
    # (B, T) the engine's own log-probs of ``sample`` where its kernels are not the policy's (rollout.engine=vllm:
    # the policy's are then the learners' to compute, and ``sample.logp`` is not kept); None otherwise
    engine_logp: torch.Tensor | None = None
    # the prompts the rows continue, where they are not the call's (an episode's first observation as rendered, one
    # row per sample: rayseq.episodes); None: the call's prompts, row for row
    prompts: PromptBatch | None = None


@dataclass
class SamplingCall:
    """One sampling call on a rollout worker, as a sampler sees it: the shard's prompts (as numpy arrays and as
    tensors on the worker's device), the request's length cap and temperature, the worker's copy of the policy and
    its task, and the call's random stream."""

    policy: Any  # the worker's π_θ with the request's weights (rayseq.models.protocol: encode, decode_step, sample)
    task: Any  # the run's task (references, special tokens, rewards)
    prompts: PromptBatch  # the shard's inputs: src, src_len, and tgt / tgt_len / key where the batch has them
    src: torch.Tensor  # (B, S) int64 prompts.src on the worker's device
    src_len: torch.Tensor  # (B,) int64
    max_len: int  # T: at most this many tokens per reply
    temperature: float  # the request's sampling temperature
    rng: torch.Generator | None  # seeded with the request's seed on the worker's device (None: the global stream)
    engine: Callable[[], Sampled]  # π_θ through the worker's rollout engine with these inputs, length and seed


@runtime_checkable
class Sampler(Protocol):
    """How an algorithm's replies are drawn on a rollout worker, and what of them is scored beside the replies.

    A sampler is chosen once, by the algorithm's request; ``RolloutRequest.sampler`` None is :class:`PolicySampler`.
    The replies' own reward is the task's (or the configured one), computed by the worker or a scorer; a sampler
    scores only what it added to ``Rollout.extras``.
    """

    def sample(self, call: SamplingCall) -> Sampled:
        """Draw one reply per prompt of the shard.

        Args:
            call: the shard's prompts, the request's length cap, temperature and random stream, the worker's policy,
                task and rollout engine.

        Returns:
            The replies (B, T) with their log-probs under π_θ, the per-row ``extras`` the rollout should carry, the
            ``info`` for its diagnostics, and the engine's own log-probs where the replies came from an engine whose
            kernels are not the policy's.
        """
        ...

    def score(self, task: Any, rollout: Rollout) -> None:
        """Score the sampler's ``rollout.extras`` in place, after the replies' reward is computed, where that is
        (the worker with cheap rewards, else a scorer actor).

        Args:
            task: the run's task (with the configured reward, where there is one).
            rollout: the sampled shard, ``score`` and ``rewards`` already filled.

        Returns:
            None; results go into ``rollout.extras``.
        """
        ...


class PolicySampler:
    """Sample π_θ through the rollout engine: what every algorithm does unless its request carries a sampler."""

    def sample(self, call: SamplingCall) -> Sampled:
        return call.engine()

    def score(self, task: Any, rollout: Rollout) -> None:
        """Nothing beside the replies to score."""


POLICY = PolicySampler()


def check_builtin_engine(cfg, what: str) -> None:
    """ValueError unless the run samples with the policy's own decoding loop (``rollout.engine=builtin``): for an
    algorithm whose sampler ``what`` on the worker's copy of the policy, which an engine with a model of its own
    (vLLM) neither runs nor keeps (:func:`rayseq.engines.holds_policy_weights`). ``cfg``: the run config."""
    if cfg.rollout.engine != "builtin":
        raise ValueError(f"algo.name={cfg.algo.name} {what} in the policy's own decoding loop, which "
                         f"rollout.engine={cfg.rollout.engine} does not run; use rollout.engine=builtin")
