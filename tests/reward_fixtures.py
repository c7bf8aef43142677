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
