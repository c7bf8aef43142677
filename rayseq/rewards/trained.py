"""A reward model's run as a reward (``reward.fn=reward_model`` with ``path=RUN``: any ``model.arch``, the built-in ones
included), loaded once per process where configured rewards run (the scorer actors):
:class:`rayseq.models.reward_head.RewardModelScorer` with this layer's vocabulary and tokenisation.

Math layer: torch; never Ray.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from rayseq.config.paths import is_run
from rayseq.data.hf_text import encode_all, spec_vocab
from rayseq.models.reward_head import RewardModelScorer, is_reward_checkpoint

__all__ = ["REFRESHED", "RewardModelScorer", "is_reward_checkpoint", "is_run", "load_refreshed", "load_scorer",
           "scorer_device", "scorer_of"]

REFRESHED = "refreshed_reward_model"  # the scorers' name of a refreshed reward model's weights (reward.refresh)


def load_scorer(checkpoint: str | os.PathLike, device: str = "cpu") -> RewardModelScorer:
    """The reward model of a run (its newest checkpoint that loads) on ``device``."""
    return RewardModelScorer(checkpoint, spec_vocab, encode_all, device)


_LOADED: dict[tuple[str, str], RewardModelScorer] = {}  # (run, device) -> its scorer, one per process


def scorer_of(run: str | os.PathLike, device: str) -> RewardModelScorer:
    """The reward model of ``run`` on ``device``, loaded once per process."""
    key = (str(Path(run).expanduser().absolute()), device)
    if key not in _LOADED:
        _LOADED[key] = load_scorer(key[0], device)
    return _LOADED[key]




def scorer_device() -> str:
    """Where ``reward.fn=reward_model`` scores in this process: its GPU when it sees one."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_refreshed(run: str | os.PathLike, weights: dict) -> None:
    """Load a refreshed copy's weights (``RewardModelScorer.weights``) into the reward model of ``run`` that this
    process scores with."""
    scorer_of(run, scorer_device()).load_weights(weights)
