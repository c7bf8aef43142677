"""A run's configured reward: a weighted sum of reward functions on detokenised text, batched.

    R(x, y) = Σ_k w_k · f_k(prompts, replies, references)        (``reward.terms``; ``reward.fn`` is one term, w = 1)

Each f_k is a built-in (:mod:`rayseq.rewards.library`: ``task``, ``bleu``, ``chrf``, ``length``, ``novelty``) or a
user's ``package.module:function`` with the contract in that module's docstring. :class:`Reward` has the task's
``rewards(src, src_len, tokens, token_mask, key)`` contract, so :func:`rayseq.tasks.make_task` installs it as the
task's reward: rollout scoring (on the ScorerActors, which may hold a GPU), SCST's greedy baseline, RAML's
weights, ERPO interpolation's validation reward and ``val/reward`` / ``test/reward`` all use it. It turns token ids
into text with the task's vocabulary and tokenizer (:func:`rayseq.data.text.decode_ids`), calls each function on
``reward.batch_size`` rows at a time, checks what comes back (B finite floats) and keeps every term's unweighted
values for logging (``reward/<name>``). ``task`` and ``bleu`` skip the text: they run on the token ids (the task's
own reward; the vectorised BLEU, :func:`rayseq.rewards.bleu.sentence_bleu_padded`).

A function may be written to rayseq's positional protocol or to TRL's keyword one (``f(prompts=, completions=,
completion_ids=, **columns)``, :mod:`rayseq.reward_protocol`), told apart by its signature; a keyword function
gets the dataset's own columns of each row (``task.column_values(key)``) and its prompts as written
(``task.prompt_values(key)``), from tasks that keep them (pairs). ``None`` for a reply means "not judged", as in
TRL: the term's value is NaN in ``term_scores``, left out of the sum (it adds 0) and of ``reward/<name>`` (the mean
over the judged replies; NaN when a batch has none); ``async def`` functions are awaited.

A function that raises, or returns the wrong number of values or a NaN / infinite one, or needs a dataset column the
data does not have, stops the run at the first batch with a :class:`RewardError` naming the function, the batch
size and what came back.

Math layer: numpy only; never Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from rayseq import reward_protocol
from rayseq.data.text import decode_ids
from rayseq.rewards import library
from rayseq.rewards.bleu import sentence_bleu_padded
from rayseq.rewards.terminal import terminal_rewards


class RewardError(ValueError):
    """A reward function raised, or returned something that is not one finite float per reply; names it."""


@dataclass(frozen=True)
class Term:
    """One f_k of the sum."""

    name: str  # logged as reward/<name>
    fn: Callable  # fn(prompts, replies, references, **kwargs) or fn(prompts=, completions=, ...) -> Sequence[float]
    weight: float = 1.0  # w_k
    kwargs: dict = field(default_factory=dict)
    label: str = ""  # how errors name it, e.g. "reward.fn=my_reward:polite"

    @cached_property
    def keyword(self) -> bool:
        """Written to TRL's keyword protocol (rayseq.reward_protocol)."""
        return reward_protocol.is_keyword(self.fn)


class Reward:
    """R = Σ_k w_k f_k for one task (module docstring). ``task.rewards`` is read here, before
    :func:`rayseq.tasks.make_task` replaces it with this object: it is the ``task`` term."""

    def __init__(self, task, terms: Sequence[Term], batch_size: int | None = None, task_rewards=None):
        if not terms:
            raise ValueError("a reward needs at least one term")
        self.task = task
        self.terms = list(terms)
        self.names = [t.name for t in self.terms]
        self.weights = np.array([t.weight for t in self.terms], dtype=np.float64)
        self.batch_size = batch_size
        # the task's own (the `task` term): task.rewards, or given (a second Reward on a task that has one installed)
        self._task_rewards = task.rewards if task_rewards is None else task_rewards
        self._kind = task.spec()["tokenizer"].get("kind", "words")
        self._ref_text: dict[int, list[str]] = {}  # key -> its references as text
        self._prompt_text: dict[int, str] = {}  # key -> its input as text (a key names one input)

    def scores(self, src, src_len, tokens, token_mask, key=None) -> tuple[np.ndarray, np.ndarray]:
        """score (B,) float32 = Σ_k w_k f_k over the terms that judged each reply, and term_scores (B, K) float32:
        each f_k, unweighted, NaN where it returned None (not judged)."""
        batch = _Batch(self, src, src_len, tokens, token_mask, key)
        term_scores = np.stack([self._term(t, batch) for t in self.terms], axis=1)  # (B, K) float64
        score = np.where(np.isnan(term_scores), 0.0, term_scores) @ self.weights  # TRL's nansum
        return score.astype(np.float32), term_scores.astype(np.float32)

    @property
    def task_rewards(self):
        """The task's own reward (``rewards(src, src_len, tokens, token_mask, key)``), which this one replaced."""
        return self._task_rewards

    def texts(self, src, src_len, tokens, token_mask, key=None) -> tuple[list[str], list[str]]:
        """(prompts, replies) of a batch as the text functions see them."""
        batch = _Batch(self, src, src_len, tokens, token_mask, key)
        return batch.prompts, batch.replies

    def __call__(self, src, src_len, tokens, token_mask, key=None) -> tuple[np.ndarray, np.ndarray]:
        """The task's ``rewards`` contract: per-token rewards (B, T), R on each reply's last token, and R (B,)."""
        score, _ = self.scores(src, src_len, tokens, token_mask, key)
        return terminal_rewards(score, token_mask), score

    def metrics(self, term_scores: np.ndarray) -> dict[str, float]:
        """``reward/<name>``: each term's mean over a batch (term_scores (B, K) of :meth:`scores`), over the replies
        it judged (NaN when it judged none: logged, not an error)."""
        out = {}
        for k, n in enumerate(self.names):
            judged = term_scores[:, k][~np.isnan(term_scores[:, k])]
            out[f"reward/{n}"] = float(judged.mean()) if len(judged) else float("nan")
        return out

    # -- one term ---------------------------------------------------------------------------------
    def _term(self, term: Term, b: _Batch) -> np.ndarray:
        """(B,) float64 values of f_k on the batch, checked."""
        B = len(b.lengths)
        if term.fn is library.task:
            return self._checked(term, self._task_rewards(b.src, b.src_len, b.tokens, b.token_mask, key=b.key)[1], B,
                                 b, 0)
        if term.fn is library.bleu:  # the vectorised path, on ids (of words: a subword task's bleu_inputs)
            words = getattr(self.task, "bleu_inputs", None)
            if words is not None and b.key is not None:
                tokens, lengths, refs = words(b.tokens, b.lengths, b.key)
            else:
                tokens, lengths, refs = b.tokens, b.lengths, b.reference_ids
            return self._checked(term, sentence_bleu_padded(tokens, lengths, refs, **term.kwargs), B, b, 0)
        if term.keyword:
            self._check_columns(term, b)
        step = self.batch_size or max(B, 1)
        parts = []
        for a in range(0, B, step):
            rows = slice(a, min(a + step, B))
            n = rows.stop - rows.start
            try:
                if term.keyword:  # TRL's protocol: keywords, the dataset's columns among them
                    given = {"prompts": b.prompt_values[rows], "completions": b.completions[rows],
                             "completion_ids": b.completion_ids[rows],
                             **{c: v[rows] for c, v in b.columns.items()}}
                    out = term.fn(**{k: given[k] for k in reward_protocol.accepted(term.fn, given)
                                     if k not in term.kwargs}, **term.kwargs)
                else:
                    out = term.fn(b.prompts[rows], b.replies[rows], b.references[rows], **term.kwargs)
                out = reward_protocol.resolve(out)  # an async def function's coroutine
            except Exception as exc:  # the user's code: say which term and on what, then its own message
                raise RewardError(f"{term.label} raised {type(exc).__name__} on a batch of {n} replies: "
                                  f"{exc}") from exc
            parts.append(self._checked(term, out, n, b, a))
        return np.concatenate(parts) if parts else np.zeros(0)

    @staticmethod
    def _check_columns(term: Term, b: _Batch) -> None:
        """A keyword function's required parameters must be dataset columns (or its kwargs): else say which."""
        missing = [c for c in reward_protocol.required_columns(term.fn, term.kwargs) if c not in b.columns]
        if missing:
            have = ", ".join(sorted(b.columns)) or "none besides the prompt and reply"
            why = (" (TRL's trainer passes it; rayseq has no TRL trainer state: give it a default)"
                   if missing[0] in reward_protocol.TRL_ONLY else "")
            raise RewardError(f"{term.label} needs the dataset column {missing[0]!r}{why}; the dataset's columns: "
                              f"{have} (python -m rayseq.data prepare keeps every column of the source)")

    @staticmethod
    def _checked(term: Term, out, n: int, b: _Batch, first: int) -> np.ndarray:
        """``out`` as (n,) float64 if it is n finite numbers or None (not judged: NaN), else a RewardError saying
        what came back."""
        judged = None
        if isinstance(out, (list, tuple)) and any(v is None for v in out):
            judged = np.array([v is not None for v in out])
            out = [np.nan if v is None else v for v in out]
        try:
            values = np.asarray(out, dtype=np.float64)
        except (TypeError, ValueError):
            values = None
        if values is None or values.shape != (n,):
            raise RewardError(f"{term.label} returned {_describe(out)} for a batch of {n} replies; a reward function "
                              f"returns one float per reply ({n} here)")
        bad = np.flatnonzero(~np.isfinite(values) & (True if judged is None else judged))
        if len(bad):
            i = int(bad[0])
            raise RewardError(f"{term.label} returned {values[i]} for reply {i} of a batch of {n} "
                              f"({b.replies[first + i]!r}); rewards must be finite ({len(bad)} of {n} are NaN or "
                              "infinite)")
        return values


class _Batch:
    """A batch of replies as ids and, computed when a term asks, as text."""

    def __init__(self, reward: Reward, src, src_len, tokens, token_mask, key):
        self.reward, self.src, self.src_len, self.tokens, self.token_mask, self.key = (
            reward, src, src_len, tokens, token_mask, key)
        eos = reward.task.specials.eos
        length = (np.asarray(token_mask) > 0).sum(1)
        last = np.asarray(tokens)[np.arange(len(length)), np.maximum(length - 1, 0)] if tokens.shape[1] else length
        self.lengths = (length - ((length > 0) & (last == eos))).astype(np.int64)  # (B,) without the EOS

    def _text(self, ids) -> str:
        task = self.reward.task
        return decode_ids(task.vocab, ids, self.reward._kind)

    @cached_property
    def prompts(self) -> list[str]:
        if self.key is None:
            return [self._text(self.src[i, : self.src_len[i]]) for i in range(len(self.lengths))]
        cache = self.reward._prompt_text
        for i, k in enumerate(self.key.tolist()):
            if k not in cache:
                cache[k] = self._text(self.src[i, : self.src_len[i]])
        return [cache[k] for k in self.key.tolist()]

    @cached_property
    def replies(self) -> list[str]:
        return [self._text(self.tokens[i, : self.lengths[i]]) for i in range(len(self.lengths))]

    # -- what TRL's keyword protocol passes ---------------------------------------------------------
    @cached_property
    def prompt_values(self) -> list:
        """The prompts as the dataset wrote them (a string, or a list of {role, content} messages) when the task
        keeps them (``task.prompt_values(key)``), else as the model saw them."""
        values = getattr(self.reward.task, "prompt_values", None)
        if self.key is None or values is None:
            return self.prompts
        return values(self.key)

    @cached_property
    def completions(self) -> list:
        """The replies as TRL gives them: text, or [{"role": "assistant", "content": text}] after a conversation."""
        return [[{"role": "assistant", "content": r}] if isinstance(p, list) else r
                for p, r in zip(self.prompt_values, self.replies)]

    @cached_property
    def completion_ids(self) -> list[list[int]]:
        """Each reply's token ids, without its end token."""
        return [self.tokens[i, : self.lengths[i]].tolist() for i in range(len(self.lengths))]

    @cached_property
    def columns(self) -> dict[str, list]:
        """The dataset's other columns of each reply's prompt row (``task.column_values(key)``; none without)."""
        values = getattr(self.reward.task, "column_values", None)
        if self.key is None or values is None:
            return {}
        return values(self.key)

    @cached_property
    def reference_ids(self) -> list[list[np.ndarray]]:
        task = self.reward.task
        if self.key is None or not getattr(task, "has_references", False):
            return [[] for _ in range(len(self.lengths))]
        return task.references(self.key)

    @cached_property
    def references(self) -> list[list[str]]:
        if self.key is None or not getattr(self.reward.task, "has_references", False):
            return [[] for _ in range(len(self.lengths))]
        cache = self.reward._ref_text
        out = []
        for k, refs in zip(self.key.tolist(), self.reference_ids):
            if k not in cache:
                cache[k] = [self._text(r) for r in refs]
            out.append(cache[k])
        return out


def _describe(out) -> str:
    """What a reward function returned, for an error message."""
    if out is None:
        return "None"
    shape = getattr(out, "shape", None)
    if shape is not None and len(shape) != 1:
        return f"an array of shape {tuple(shape)}"
    try:
        return f"{len(out)} values ({type(out).__name__})"
    except TypeError:
        return f"a {type(out).__name__} ({out!r})"


def make_reward(task, reward_cfg) -> Reward | None:
    """The configured reward of ``task`` (``reward_cfg`` a :class:`rayseq.config.RewardConfig`), or None when it is
    the task's own (``reward.fn=task``, the default): then nothing changes."""
    from rayseq import registry

    if reward_cfg is None or reward_cfg.is_task:
        return None
    terms = []
    for i, t in enumerate(reward_cfg.resolved_terms):
        label = f"reward.terms[{i}] ({t.fn})" if reward_cfg.terms else f"reward.fn={t.fn}"
        terms.append(Term(name=t.metric_name, fn=registry.reward_function(t.fn, t.kwargs), weight=t.weight,
                          kwargs=dict(t.kwargs), label=label))
    return Reward(task, terms, reward_cfg.batch_size)
