"""Data: tokenisation (and, with the chit-chat issue, dataset preparation). Math layer: no Ray."""

from rayseq.data.text import detokenize, tokenize

__all__ = ["detokenize", "tokenize"]
