"""Built-in reward functions, ``fn(prompts, replies, references, **kwargs) -> (B,) float64`` on text.

The contract of every reward function, built-in or ``package.module:function`` (``reward.fn``, ``reward.terms``):

    prompts     B strings: the inputs as the model saw them, detokenised (word-level data is lower-cased)
    replies     B strings: the generated replies, detokenised (no end token; ``…`` for a word outside the vocabulary)
    references  B lists of strings: every reference reply of each input (the pairs task: every reply the data
                gives to that prompt; an empty list for a task without references, e.g. counting)
    kwargs      the term's ``kwargs`` from the config
    returns     B finite floats (a list, a tuple, a numpy array), one per reply; larger is better

Built-ins (also importable to build your own: ``from rayseq.rewards.library import chrf``):

- ``task``: the task's own reward (counting: 1 if correct; pairs / chitchat: BLEU-2 against the references),
  computed by the run on token ids; it has no text form;
- ``bleu``: sentence BLEU of order ``max_order`` (default 2, Papineni et al. 2002) against all references, in
  [0, 1], as sacrebleu's ``sentence_score`` with effective order (Post 2018); here on the tokens of rayseq's word
  tokenizer, in a run on the task's token ids (:func:`rayseq.rewards.bleu.sentence_bleu_padded`, the vectorised
  path; the same numbers, since tokenising detokenised text gives its tokens back);
- ``chrf``: sentence chrF (Popović 2015) against the references, as sacrebleu's ``CHRF.sentence_score`` / 100 (the
  best-matching reference), in [0, 1]; kwargs ``char_order`` (6), ``word_order`` (0; 2 = chrF++), ``beta`` (2);
- ``novelty``: 1 − sentence BLEU-``max_order`` (default 2) of a reply against the OTHER replies of its batch, in
  [0, 1], 0 for an empty reply: a reply the policy gives to many inputs (a template) scores near 0, one unlike the
  rest near 1. A distinct-n term for RL on a chatbot: with ``task`` it rewards being right and being
  different; it needs the batch (``reward.batch_size`` unset: the whole scored batch);
- ``length``: −|n − target| / target, n the reply's tokens (words and punctuation marks, the word tokenizer's
  tokens, what a pairs model emits): 0 at ``target`` tokens, −1 for an empty reply or one twice as long.

Math layer: numpy, sacrebleu; never Ray.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rayseq.data.text import tokenize
from rayseq.rewards.bleu import sentence_bleu


def task(prompts: list[str], replies: list[str], references: list[list[str]]) -> np.ndarray:
    """The task's own reward: computed on token ids inside a run (:class:`rayseq.rewards.reward.Reward`)."""
    raise TypeError("the reward 'task' is the task's own, computed on token ids inside a run; it has no text form")


def bleu(prompts: list[str], replies: list[str], references: list[list[str]], *, max_order: int = 2) -> np.ndarray:
    """Sentence BLEU-``max_order`` of each reply against all its references, in [0, 1] (module docstring)."""
    _check_references("bleu", references, len(replies))
    ids: dict[str, int] = {}

    def encode(text: str) -> list[int]:
        return [ids.setdefault(t, len(ids)) for t in tokenize(text, "words")]

    return sentence_bleu([encode(r) for r in replies], [[encode(r) for r in refs] for refs in references],
                         max_order=max_order)


def _check_bleu(max_order: int = 2) -> None:
    if not isinstance(max_order, int) or max_order < 1:
        raise ValueError(f"max_order must be an integer >= 1, got {max_order!r}")


bleu.check_kwargs = _check_bleu


def chrf(prompts: list[str], replies: list[str], references: list[list[str]], *, char_order: int = 6,
         word_order: int = 0, beta: int = 2) -> np.ndarray:
    """Sentence chrF of each reply against its references (sacrebleu), in [0, 1] (module docstring)."""
    from sacrebleu.metrics import CHRF

    _check_references("chrf", references, len(replies))
    metric = CHRF(char_order=char_order, word_order=word_order, beta=beta)
    return np.array([metric.sentence_score(r, list(refs)).score / 100 for r, refs in zip(replies, references)])


def _check_chrf(char_order: int = 6, word_order: int = 0, beta: int = 2) -> None:
    for k, v, least in (("char_order", char_order, 1), ("word_order", word_order, 0), ("beta", beta, 1)):
        if not isinstance(v, int) or v < least:
            raise ValueError(f"{k} must be an integer >= {least}, got {v!r}")


chrf.check_kwargs = _check_chrf


def novelty(prompts: list[str], replies: list[str], references: list[list[str]], *, max_order: int = 2
            ) -> np.ndarray:
    """1 − sentence BLEU-``max_order`` of each reply against the other replies of the batch (module docstring)."""
    ids: dict[str, int] = {}
    enc = [[ids.setdefault(t, len(ids)) for t in tokenize(r, "words")] for r in replies]
    if len(enc) < 2:
        return np.array([float(bool(e)) for e in enc])
    others = [[e for j, e in enumerate(enc) if j != i] for i in range(len(enc))]
    # an empty "other" reply is no reference (sacrebleu needs tokens); an empty reply is no novelty
    others = [[e for e in refs if e] or [[-1]] for refs in others]
    score = 1.0 - sentence_bleu(enc, others, max_order=max_order)
    return np.where([len(e) > 0 for e in enc], score, 0.0)


novelty.check_kwargs = _check_bleu


def length(prompts: list[str], replies: list[str], references: list[list[str]], *, target: int) -> np.ndarray:
    """−|n − target| / target, n = tokens of each reply (module docstring)."""
    n = np.array([len(tokenize(r, "words")) for r in replies], dtype=np.float64)
    return -np.abs(n - target) / target


def _check_length(target: int) -> None:
    if not isinstance(target, int) or target < 1:
        raise ValueError(f"target must be an integer >= 1 (a length in tokens), got {target!r}")


length.check_kwargs = _check_length


def _check_references(name: str, references: Sequence[Sequence[str]], n: int) -> None:
    if len(references) != n:
        raise ValueError(f"{name}: {len(references)} reference lists for {n} replies")
    empty = [i for i, refs in enumerate(references) if len(refs) == 0]
    if empty:
        raise ValueError(f"{name}: reply {empty[0]} has no reference ({len(empty)} of {n} have none)")
