"""Tokenisation shared by training data and serving, configured by the task's tokenizer spec, and the
inverse that turns a model's tokens back into text.

Kinds:
- ``words``: lower-cased words and single punctuation marks ("How's it?" -> how ' s it ?), as in the
  PPO-dynamic paper's chat examples;
- ``chars``: every non-space character is a token (the counting task: "9 2 3" or "923" -> 9 2 3).

Detokenisation (:func:`detokenize`) undoes the word split for reading: punctuation attaches to the word
before it, contractions close up ("i ' m" -> "i'm", "don ' t" -> "don't"), quotes and brackets hug what
they enclose, numbers keep their point or comma ("3 . 5" -> "3.5"); ``truecase`` capitalises sentence
starts and "i" (for tokenizers that lower-cased the text). Special tokens never appear: ``<pad>``,
``<bos>`` and ``<eos>`` are dropped, ``<unk>`` (a word outside the vocabulary) shows as ``UNK_SHOWN``.
It is incremental (:class:`Joiner`): each token's piece of text depends only on the tokens before it,
so the pieces concatenate to the text, can be streamed as they come, and the piece an alternative token
would have added is known (OpenAI-style logprobs).
"""

from __future__ import annotations

import re
from typing import NamedTuple

_WORDS = re.compile(r"\w+|[^\w\s]")
_IS_WORD = re.compile(r"\w")

UNK = "<unk>"
UNK_SHOWN = "…"  # what a reply shows for <unk>: a word the vocabulary does not have
HIDDEN = frozenset({"<pad>", "<bos>", "<eos>"})  # never part of a reply's text
NO_SPACE_BEFORE = frozenset(".,!?;:%)]}")
NO_SPACE_AFTER = frozenset("([{$#")
CONTRACTIONS = frozenset({"s", "t", "m", "d", "re", "ve", "ll"})  # i'm, don't, it's, you're, i've, we'll, i'd
SENTENCE_END = frozenset(".!?")


def tokenize(text: str, kind: str = "words", lowercase: bool = True) -> list[str]:
    if lowercase:
        text = text.lower()
    if kind == "words":
        return _WORDS.findall(text)
    if kind == "chars":
        return [c for c in text if not c.isspace()]
    raise ValueError(f"unknown tokenizer kind {kind!r} (known: words, chars)")


class _State(NamedTuple):
    prev: str | None = None  # the previous shown token
    prev2: str | None = None  # the one before it
    apostrophe: bool = False  # prev is an apostrophe attached to a word ("i '" -> "i'")
    opened: bool = False  # prev opened a quote: the next token hugs it
    double_open: bool = False  # a " quote is open
    sentence_start: bool = True


class Joiner:
    """Incremental detokeniser: :meth:`push` a token, get the text it adds (its piece); :meth:`peek` the
    piece a token would add here without adding it."""

    def __init__(self, kind: str = "words", truecase: bool = False):
        if kind not in ("words", "chars"):
            raise ValueError(f"unknown tokenizer kind {kind!r} (known: words, chars)")
        self.kind, self.truecase, self.state = kind, truecase, _State()

    def push(self, token: str) -> str:
        piece, self.state = self._step(self.state, token)
        return piece

    def peek(self, token: str) -> str:
        return self._step(self.state, token)[0]

    def _step(self, s: _State, token: str) -> tuple[str, _State]:
        if token in HIDDEN:
            return "", s
        w = UNK_SHOWN if token == UNK else token
        if self.kind == "chars":
            return (w if s.prev is None else " " + w), s._replace(prev=w)
        word = bool(_IS_WORD.match(w)) or w == UNK_SHOWN
        prev_word = s.prev is not None and (bool(_IS_WORD.match(s.prev)) or s.prev == UNK_SHOWN)
        space = s.prev is not None and not s.opened and s.prev not in NO_SPACE_AFTER
        nxt = {"prev": w, "prev2": s.prev, "apostrophe": False, "opened": False}
        if w in NO_SPACE_BEFORE:
            space = False
        elif w == "'":
            if prev_word:  # i'm, cats' toys, or a closing quote: 'like this'
                space, nxt["apostrophe"] = False, True
            else:  # opens a quote
                nxt["opened"] = True
        elif w == '"':
            if s.double_open:
                space, nxt["double_open"] = False, False
            else:
                nxt["opened"], nxt["double_open"] = True, True
        elif s.apostrophe and word:
            space = space and w not in CONTRACTIONS  # "i ' m" -> i'm, but "cats ' toys" -> cats' toys
        elif w.isdigit() and s.prev in (".", ",", ":") and (s.prev2 or "").isdigit():
            space = False  # 3.5, 1,000, 10:30
        shown = w
        if self.truecase and word and (s.sentence_start or w == "i"):
            shown = w[:1].upper() + w[1:]
        if word:
            nxt["sentence_start"] = False
        elif w in SENTENCE_END:
            nxt["sentence_start"] = True
        return (" " if space else "") + shown, s._replace(**nxt)


def detokenize_pieces(tokens: list[str], kind: str = "words", truecase: bool = False) -> list[str]:
    """The text each token adds (``""`` for hidden specials); they concatenate to :func:`detokenize`."""
    joiner = Joiner(kind, truecase)
    return [joiner.push(t) for t in tokens]


def detokenize(tokens: list[str], kind: str = "words", truecase: bool = False) -> str:
    """Tokens back to readable text (module docstring); ``tokenize`` of the result gives the tokens back
    (up to case, and but for ``<unk>``)."""
    return "".join(detokenize_pieces(tokens, kind, truecase))


def decode_ids(vocab, ids, kind: str = "words", truecase: bool = False) -> str:
    """The text of a reply's ids up to its end token: ``vocab.decode_text`` for a vocabulary with its own tokenizer
    (a Hugging Face one, :mod:`rayseq.data.hf_text`), else :func:`detokenize` of ``vocab.decode``."""
    if hasattr(vocab, "decode_text"):
        return vocab.decode_text(ids)
    return detokenize(vocab.decode(ids), kind, truecase)
