"""Reward functions for tests/rewards/test_rewards.py, importable as ``tests.reward_fixtures:NAME`` by the driver and by
every Ray actor (they run in the repository, the tests' working directory)."""

from __future__ import annotations

import os


def logged(prompts, replies, references, *, log: str):
    """Replies that mention a greeting word score 1; appends "pid batch" to ``log`` per call (where it ran)."""
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {len(replies)}\n")
    return [float(any(w in r for w in ("fine", "good", "great"))) for r in replies]


def fine(prompts, replies, references):
    """1 for a reply that says "fine", else 0."""
    return [float("fine" in r) for r in replies]


def short(prompts, replies, references):
    """Wrong: one value fewer than replies."""
    return [0.0] * (len(replies) - 1)


def nan_for_empty(prompts, replies, references):
    """Wrong: NaN for the second reply."""
    return [float("nan") if i == 1 else 1.0 for i in range(len(replies))]


def raises(prompts, replies, references):
    raise KeyError("no such model")


def two_args(prompts, replies):
    return [0.0] * len(replies)


NOT_A_FUNCTION = 3


# -- TRL's keyword protocol, in the shapes of TRL's documentation (GRPOTrainer reward_funcs) ------------------------


def _text(completion):
    """A completion's text: TRL gives [{"role": "assistant", "content": ...}] after a conversational prompt."""
    return completion[0]["content"] if isinstance(completion, list) else completion


def trl_length(completions, **kwargs):
    """TRL's length reward: −|20 − characters|."""
    return [-abs(20 - len(_text(c))) for c in completions]


def trl_accuracy(completions, solution, **kwargs):
    """TRL's accuracy reward reading the dataset's ``solution`` column: 1 when the completion contains it."""
    return [1.0 if str(s) in _text(c) else 0.0 for c, s in zip(completions, solution)]


async def trl_async(prompts, completions, completion_ids, **kwargs):
    """An ``async def`` reward (TRL awaits them): the number of tokens over 10."""
    import asyncio

    await asyncio.sleep(0)
    return [len(ids) / 10 for ids in completion_ids]


def trl_none_for_easy(completions, difficulty, **kwargs):
    """None (not judged) for difficulty-0 rows, else 1 for a non-empty completion."""
    return [None if d == 0 else float(len(_text(c)) > 0) for c, d in zip(completions, difficulty)]


def trl_logged(prompts, completions, completion_ids, solution, *, log, **kwargs):
    """Appends what it receives to ``log`` (JSON lines, with the pid), returns the accuracy reward."""
    import json

    with open(log, "a") as f:
        for p, c, ids, s in zip(prompts, completions, completion_ids, solution):
            f.write(json.dumps({"pid": os.getpid(), "prompt": p, "completion": c, "ids": ids, "solution": s,
                                "columns": sorted(kwargs)}) + "\n")
    return trl_accuracy(completions, solution)


def trl_short(completions, **kwargs):
    """Wrong: one value fewer than completions."""
    return [0.0] * (len(completions) - 1)


def trl_nan(completions, **kwargs):
    return [float("nan")] * len(completions)


def trl_needs_missing(completions, answer_key, **kwargs):
    return [0.0] * len(completions)


def trl_positional_only(completions, /, **kwargs):
    return [0.0] * len(completions)


def odd_first_digit_informative(prompts, replies, references):
    """Counting prompts ("3 1 4 ..."): a reply to a prompt whose first digit is odd gets its row's parity (groups are
    consecutive rows of even size: rewards 0, 1, 0, 1 — distinct), any other reply 1.0 (a group of equal rewards).
    Dynamic sampling's tests predict from the prompts alone which groups it keeps."""
    return [float(i % 2) if int(p.split()[0]) % 2 else 1.0 for i, p in enumerate(prompts)]
