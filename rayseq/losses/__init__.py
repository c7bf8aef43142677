"""Objectives as small pure functions of tensors returning ``(loss, stats)``: the contract every
algorithm's update relies on.

All inputs are float tensors (B, T); the mean is over unmasked tokens.
"""

from rayseq.losses.discriminator import DiscStats, discriminator_loss
from rayseq.losses.policy import (
    PGStats,
    PolicyStats,
    masked_mean,
    mixer_combine,
    mixer_loss,
    ppo_clip_loss,
    ppo_dynamic_bounds,
    ppo_dynamic_loss,
    reinforce_loss,
)
from rayseq.losses.returns import discounted_returns, gae
from rayseq.losses.supervised import NLLStats, ValueStats, token_nll_loss, value_loss

__all__ = [
    "DiscStats",
    "NLLStats",
    "PGStats",
    "PolicyStats",
    "ValueStats",
    "discounted_returns",
    "discriminator_loss",
    "gae",
    "masked_mean",
    "mixer_combine",
    "mixer_loss",
    "ppo_clip_loss",
    "ppo_dynamic_bounds",
    "ppo_dynamic_loss",
    "reinforce_loss",
    "token_nll_loss",
    "value_loss",
]
