"""Rewards (math layer)."""

from rayseq.rewards.terminal import terminal_rewards

__all__ = ["terminal_rewards"]
