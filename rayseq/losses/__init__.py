"""Objectives as small pure functions of tensors returning ``(loss, stats)``: the contract every
algorithm's update relies on.

All inputs are float tensors (B, T); the mean is over unmasked tokens, or, for the loss menu's variants
(:mod:`rayseq.losses.menu`), as the variant averages them (:mod:`rayseq.losses.aggregate`).
"""

from rayseq.losses.aggregate import (
    constant_length_mean,
    sequence_log_ratio,
    sequence_mean,
    sequence_sum_mean,
    token_log_ratio,
    token_mean,
)
from rayseq.losses.discriminator import DiscStats, discriminator_loss
from rayseq.losses.menu import (
    LOSS_TYPES,
    cispo_loss,
    dapo_loss,
    dr_grpo_loss,
    gmpo_loss,
    grpo_loss,
    high_entropy_mask,
    luspo_loss,
    sapo_loss,
    token_entropy,
)
from rayseq.losses.policy import (
    PGStats,
    PolicyStats,
    clip_range,
    clipped_objective,
    clipped_surrogate,
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
    "LOSS_TYPES",
    "DiscStats",
    "NLLStats",
    "PGStats",
    "PolicyStats",
    "ValueStats",
    "cispo_loss",
    "clip_range",
    "clipped_objective",
    "clipped_surrogate",
    "constant_length_mean",
    "dapo_loss",
    "discounted_returns",
    "discriminator_loss",
    "dr_grpo_loss",
    "gae",
    "gmpo_loss",
    "grpo_loss",
    "high_entropy_mask",
    "luspo_loss",
    "masked_mean",
    "mixer_combine",
    "mixer_loss",
    "ppo_clip_loss",
    "ppo_dynamic_bounds",
    "ppo_dynamic_loss",
    "reinforce_loss",
    "sapo_loss",
    "sequence_log_ratio",
    "sequence_mean",
    "sequence_sum_mean",
    "token_entropy",
    "token_log_ratio",
    "token_mean",
    "token_nll_loss",
    "value_loss",
]
