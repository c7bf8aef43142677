"""Tokenisation shared by training data and serving, configured by the task's tokenizer spec.

Kinds:
- ``words``: lower-cased words and single punctuation marks ("How's it?" -> how ' s it ?), as in the
  PPO-dynamic paper's chat examples;
- ``chars``: every non-space character is a token (the counting task: "9 2 3" or "923" -> 9 2 3).
"""

from __future__ import annotations

import re

_WORDS = re.compile(r"\w+|[^\w\s]")


def tokenize(text: str, kind: str = "words", lowercase: bool = True) -> list[str]:
    if lowercase:
        text = text.lower()
    if kind == "words":
        return _WORDS.findall(text)
    if kind == "chars":
        return [c for c in text if not c.isspace()]
    raise ValueError(f"unknown tokenizer kind {kind!r} (known: words, chars)")


def detokenize(tokens: list[str], kind: str = "words") -> str:
    return " ".join(tokens)
