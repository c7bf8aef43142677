"""Data: tokenisation and dialogue dataset preparation (``python -m rayseq.data prepare``). Math layer: no Ray."""

from rayseq.data.dataset import DialogueData, DialogueSplit, encode_text
from rayseq.data.preparation import DataError, PrepareOptions, prepare
from rayseq.data.text import detokenize, tokenize

__all__ = [
    "DataError",
    "DialogueData",
    "DialogueSplit",
    "PrepareOptions",
    "detokenize",
    "encode_text",
    "prepare",
    "tokenize",
]
