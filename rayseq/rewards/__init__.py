"""Rewards (math layer): the reward library (``library``: built-in reward functions on text; ``reward``: a run's
configured reward, a weighted sum of them, see README "Train on your own data and reward"), vectorised sentence BLEU
(``bleu``) and its per-token increments (``bleu_delta``), SeqGAN's Monte-Carlo search (``mc_search``), terminal
rewards."""

from rayseq.rewards.bleu import corpus_bleu, corpus_bleu_parts, sentence_bleu, sentence_bleu_padded
from rayseq.rewards.terminal import terminal_rewards

__all__ = ["corpus_bleu", "corpus_bleu_parts", "sentence_bleu", "sentence_bleu_padded", "terminal_rewards"]
