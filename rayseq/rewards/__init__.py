"""Rewards (math layer)."""

from rayseq.rewards.bleu import corpus_bleu, sentence_bleu, sentence_bleu_padded
from rayseq.rewards.terminal import terminal_rewards

__all__ = ["corpus_bleu", "sentence_bleu", "sentence_bleu_padded", "terminal_rewards"]
