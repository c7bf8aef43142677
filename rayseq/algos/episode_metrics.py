"""Per-episode figures of a rollout of episodes (its rows' ``extras``, written by :mod:`rayseq.episodes.runner`), as
the learner logs them (:func:`rayseq.algos.common.rollout_metrics`): ``episode/turns``,
``episode/success``, ``episode/return``, ``episode/reward_per_turn``, ``episode/failures`` (an environment raised or
timed out), ``episode/timeouts``, ``episode/tokens`` (after the prompt), ``episode/truncated`` (a turn or token
limit ended it), ``episode/splits`` (new samples started where a chat template could not be shown to extend the
prefix), ``episode/retokenization_drift`` (ids per episode that encoding the final conversation's text again would
have changed: what training on re-tokenised text would have got wrong), ``episode/turn_reward/k`` (the mean reward
of turn k over the episodes that reached it: the environment's per-turn rewards, k = 1, 2, ...). numpy only: the
algorithms' metrics read it.
"""

from __future__ import annotations

import numpy as np

FIGURES = ("episode_return", "episode_turns", "episode_success", "episode_failed", "episode_timeout",
           "episode_tokens", "episode_truncated", "episode_splits", "episode_continues", "episode_drift",
           "episode_turn_rewards")  # the last: (N, K) every turn's reward, on an episode's first row


def episode_metrics(extras: dict, prefix: str = "episode/") -> dict:
    """Per-episode figures of a rollout's rows (one per episode: its first sample's): turns, success, return, reward
    per turn, failures (raised or timed out), tokens, truncations, splits, and each turn's mean reward over the
    episodes that reached it."""
    if "episode_continues" not in extras:
        return {}
    first = np.asarray(extras["episode_continues"]) == 0
    if not first.any():
        return {}

    def mean(k):
        return float(np.asarray(extras[k])[first].mean())

    turns = np.asarray(extras["episode_turns"])[first]
    ret = np.asarray(extras["episode_return"])[first]
    per_turn = {}
    if "episode_turn_rewards" in extras:
        table = np.asarray(extras["episode_turn_rewards"])[first]
        for k in range(table.shape[1]):
            reached = turns > k
            if reached.any():
                per_turn[f"{prefix}turn_reward/{k + 1}"] = float(table[reached, k].mean())
    return {**per_turn, f"{prefix}turns": float(turns.mean()), f"{prefix}success": mean("episode_success"),
            f"{prefix}return": float(ret.mean()),
            f"{prefix}reward_per_turn": float(ret.sum() / max(turns.sum(), 1.0)),
            f"{prefix}failures": float(np.asarray(extras["episode_failed"])[first].sum()),
            f"{prefix}timeouts": float(np.asarray(extras["episode_timeout"])[first].sum()),
            f"{prefix}tokens": mean("episode_tokens"), f"{prefix}truncated": mean("episode_truncated"),
            f"{prefix}splits": float(np.asarray(extras["episode_splits"])[first].sum()),
            f"{prefix}retokenization_drift": mean("episode_drift"),
            f"{prefix}count": float(first.sum())}


