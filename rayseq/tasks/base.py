"""The task protocol (:class:`Task`) and :func:`task_spec`, what serving needs of a task (stored in checkpoints).

The vocabulary a task holds is :class:`rayseq.vocab.Vocab`.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from pydantic import Field

# task.* keys of the held-out sets every built-in task reads (Task.fields: a subclass spreads them into its own)
HELD_OUT = {"val": "valid", "test": "test"}  # evaluation split -> the held-out split of prepared data
SPLIT_FIELDS = {
    "test_size": (int, Field(
        2000, ge=100, description="Held-out test inputs (counting), oracle samples (NLL-test), prompts (pairs: of the "
        "prepared test split).")),
    "test_seed": (int, Field(
        2018, description="Seed of the held-out test set (counting, oracle) and of the sampled replies of "
        "test/reward, independent of `seed`.")),
    "val_size": (int, Field(
        2000, ge=1, description="Validation inputs (counting), oracle samples (NLL of held-out data) or prompts "
        "(pairs: of the prepared valid split) evaluated as val/* every train.eval_every iterations; everything "
        "that selects (Tune, best/, ERPO interpolation's annealing) reads val/*, never test/*.")),
    "val_seed": (int, Field(
        2019, description="Seed of the validation set (counting, oracle) and of the sampled replies of val/reward, "
        "independent of `seed` and test_seed.")),
}


def task_spec(task, tokenizer: dict) -> dict:
    """What serving needs to rebuild a task's inputs and outputs (stored in checkpoints): name, vocabulary,
    length caps, tokenizer settings, whether the model reads an input, the ids it never emits, a fixed reply length
    (replies without an end token, complete at that length), what a good reply is (the chat page's help) and the
    decoding defaults a chat server applies (``decoding``)."""
    return {
        "name": task.name,
        "vocab": task.vocab.to_spec(),
        "max_src_len": task.max_src_len,
        "max_tgt_len": task.max_tgt_len,
        "tokenizer": dict(tokenizer),
        "conditional": bool(getattr(task, "conditional", True)),
        "banned_ids": [int(i) for i in getattr(task, "banned_ids", ())],
        "fixed_reply_length": getattr(task, "fixed_reply_length", None),
        "about": getattr(task, "about", ""),
        "closed_input": bool(getattr(task, "closed_input", False)),
        "decoding": dict(getattr(task, "decoding", {})),
    }


def sampled_reward(task, src, src_len, tokens, token_mask, key=None) -> tuple[object, dict]:
    """The reward of sampled replies for ``<split>/reward``: score (B,) and, when the configured reward
    (``task.reward``, set by make_task) is not the task's own alone, each term's values {``reward/<name>``: (B,)}, so
    that an evaluation reports ``<split>/reward/<name>`` beside the sum (``val/reward/polite`` before and after)."""
    reward = task.reward
    if reward is None:
        return task.rewards(src, src_len, tokens, token_mask, key=key)[1], {}
    score, term_scores = reward.scores(src, src_len, tokens, token_mask, key=key)
    return score, {f"reward/{n}": term_scores[:, k] for k, n in enumerate(reward.names)}


class TaskProtocol(Protocol):
    """The methods a task class provides (:class:`Task` lists its attributes and the optional hooks)."""

    def sample_prompts(self, rng: np.random.Generator, n: int, *, with_targets: bool = False) -> Any:
        """Training inputs.

        Args:
            rng: the driver's data RNG (``numpy.random.Generator``): every draw comes from it, so a resumed run draws
                the same batches.
            n: how many prompts.
            with_targets: give each its reference target (MLE, the supervised algorithms).

        Returns:
            The batch, a :class:`rayseq.types.PromptBatch`: ``src`` (n, S), ``src_len`` (n,), and ``tgt``,
            ``tgt_len`` with targets.
        """

    def rewards(self, src: np.ndarray, src_len: np.ndarray, tokens: np.ndarray, token_mask: np.ndarray,
                key: np.ndarray | None = None) -> tuple:
        """The task's own reward of sampled replies.

        Args:
            src: the inputs (B, S).
            src_len: their lengths (B,).
            tokens: the replies (B, T).
            token_mask: which of their positions are tokens (B, T).
            key: the rows' keys into the task's data (references, extra columns), when it has them.

        Returns:
            (per-token rewards (B, T), score (B,)), float32.
        """

    def evaluate(self, generator: Any, device: str = "cpu", *, split: str = "val") -> tuple[dict, dict]:
        """The generator's figures on a held-out split.

        Args:
            generator: the policy (:mod:`rayseq.models.protocol`).
            device: where it runs.
            split: ``val`` (what selects: Tune, the best evaluation) or ``test`` (reported once, never chosen on).

        Returns:
            (``{"<split>/<name>": float}`` — the names :meth:`metric_names` lists — and details: samples, examples).
        """

    @classmethod
    def metric_names(cls, task_cfg, split: str) -> list[str]:
        """The ``<split>/*`` names :meth:`evaluate` reports for the task config ``task_cfg`` (Tune checks a search's
        metric against them before any trial starts; the progress line shows the first)."""


class Task:
    """What a task provides (rayseq.registry reads the class attributes without instantiating it). Subclass it for
    your own task and name it ``task.name=package.module:Class``.

    Required: ``name``; ``fields`` (the ``task.*`` keys it reads besides name: key -> (type, pydantic Field),
    validated, documented and printed with the rest, no edit of rayseq.config; the default is the held-out sets'
    :data:`SPLIT_FIELDS`, and a subclass that adds keys spreads its parent's: ``fields = {**Parent.fields, ...}``);
    in ``__init__(task_cfg)``:
    ``vocab`` (a :class:`Vocab`), ``specials`` (its ids), ``max_src_len``, ``max_tgt_len``; and the methods
    ``sample_prompts(rng, n, with_targets=False) -> PromptBatch`` (training inputs; with reference targets for
    MLE), ``rewards(src, src_len, tokens, token_mask, key=None) -> (per-token rewards (B, T), score (B,))``,
    ``evaluate(generator, device, split="val"|"test") -> (metrics "<split>/...", details)`` and the classmethod
    ``metric_names(task_cfg, split)`` (what ``evaluate`` reports: Tune checks a search metric against it); their
    arguments and results: :class:`TaskProtocol`.

    Optional, with defaults: ``conditional`` (the generator reads an input), ``banned_ids`` (tokens never emitted
    besides <pad>/<bos>), traits ``has_reward``, ``has_references``, ``scored_remotely`` (see rayseq.registry),
    ``defaults`` (its values of ``task.*`` keys, resolved into the config), ``check_config(run_cfg)`` (checks of
    the whole run's config, e.g. against the task's data), ``prepare_data(task_cfg)`` (called once by the driver
    before any actor builds the task), ``spec()`` (what serving needs, stored in checkpoints), ``prompt_rows(key,
    with_targets=False) -> PromptBatch`` (the rows ``key`` of the task's data, marked ``keyed=True``: the driver
    then sends actors the keys, not the arrays, and their task rebuilds them; :class:`rayseq.types.PromptKeys`),
    ``eval_decodes(split)``, ``eval_inputs(decode)`` (or ``eval_play(decode, sampler)``: a decode the task plays
    itself with a rollout worker's sampler, as the environment's episodes) and ``eval_figures(split, decoded,
    generator, device)`` (the evaluation in two halves, :mod:`rayseq.tasks.evaluation`: under Ray the rollout
    workers decode, sharded, and the learners compute the figures; without them the learners evaluate whole).
    """

    name = ""
    fields: dict = SPLIT_FIELDS  # task.* keys it reads besides name: key -> (type, pydantic Field)
    conditional = True
    banned_ids: tuple[int, ...] = ()
    has_reward, has_references, scored_remotely = True, False, False
    tokenizer = {"kind": "words", "lowercase": True}  # how serving turns text into this task's tokens
    fixed_reply_length: int | None = None  # replies of exactly this many tokens, no end token (counting: 3)
    # inputs are a closed language: every input token in the vocabulary, at most max_src_len of them; serving refuses
    # any other input (a 422 naming the words) instead of answering it (counting: 1 to max_len digits)
    closed_input = False
    about = ""  # for the chat page: what the model was trained to do and what a good reply is
    decoding: dict = {}  # serving's defaults against repetition (rayseq.serving.model.GenRequest's fields); {} = off
    reward = None  # a configured reward.* other than the task's own (rayseq.rewards.reward.Reward), by make_task
    defaults: dict = {}

    @classmethod
    def check_config(cls, run_cfg) -> None:
        """Checks of a whole run's config against this task (its data, say); ValueError naming the key."""

    @classmethod
    def prepare_data(cls, cfg) -> bool:
        """Prepare the task's data once, before any actor builds the task; True if it did something."""
        return False

    def spec(self) -> dict:
        """What serving needs to rebuild inputs and outputs (stored in checkpoints)."""
        return task_spec(self, self.tokenizer)
