"""A subword vocabulary for ``pairs`` / ``chitchat``: byte-pair encoding (Sennrich et al. 2016, "Neural Machine
Translation of Rare Words with Subword Units") learned on the training split at ``prepare`` time
(``python -m rayseq.data prepare SOURCE --tokenizer bpe --vocab-size N``), with the ``tokenizers`` library.

Why: a word-level vocabulary of 4,000 words maps every other word to ``<unk>``, and a chatbot trained on it learns to
say ``<unk>`` (shown as ``…``). BPE splits a rare word into pieces it has, so no training text needs ``<unk>``
(the merges start from every character of the training split), and the model is banned from emitting it
(:attr:`rayseq.tasks.pairs.PairsTask.banned_ids`): a reply never contains the unknown token.

The text is first split into rayseq's words (:func:`rayseq.data.text.tokenize`, ``kind=words``, lower-cased), then
each word into pieces; a word's last piece carries the suffix ``</w>`` (``"hello"`` -> ``hel lo</w>``), so the pieces
say where words end and :meth:`BPEVocab.words` gives the words back exactly. Everything that reads words — BLEU-2
(reward and evaluation), distinct-n, Self-BLEU, reply lengths, the reward functions' text — reads those words, so
figures stay comparable with a word-level run. ``<unk>`` remains only for characters the training split never had,
and only in inputs.

Ids 0..3 are rayseq's specials (``<pad> <bos> <eos> <unk>``), the pieces follow, so a :class:`BPEVocab` is a
:class:`rayseq.vocab.Vocab` (``itos``, ``encode``, ``decode`` of pieces) with the text protocol of
:func:`rayseq.data.dataset.encode_text` and :func:`rayseq.data.text.decode_ids` (``encode_text``, ``decode_text``).
Its spec (checkpoints, ``vocab.json``) carries the tokenizer's JSON, so serving and a resumed run rebuild it
exactly.

Math/data layer: numpy and tokenizers; never Ray.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from rayseq.data.text import UNK, Joiner, detokenize, tokenize
from rayseq.vocab import SPECIAL_TOKENS, Vocab

END = "</w>"  # suffix of a word's last piece
KIND = "bpe"


def _tokenizers():
    try:
        import tokenizers
    except ImportError:  # a core dependency; a broken environment gets the command that fixes it
        raise ImportError("the bpe tokenizer needs the tokenizers package: pip install 'tokenizers>=0.20'") from None
    return tokenizers


def train_bpe(texts: Iterable[list[str]], vocab_size: int) -> BPEVocab:
    """BPE of at most ``vocab_size`` ids (the 4 specials included) learned on ``texts`` (each a list of words, as
    :func:`rayseq.data.text.tokenize` gives them): every character of the texts is in its alphabet."""
    tk = _tokenizers()
    tokenizer = tk.Tokenizer(tk.models.BPE(unk_token=UNK, end_of_word_suffix=END))
    tokenizer.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                     end_of_word_suffix=END, show_progress=False)
    tokenizer.train_from_iterator((" ".join(words) for words in texts), trainer)
    vocab = BPEVocab(tokenizer.to_str())
    if len(vocab) > vocab_size:  # the trainer keeps the whole alphabet whatever the size asked for
        raise ValueError(f"vocab_size {vocab_size} is below the {len(vocab)} pieces the training split's characters "
                         f"need (their first and last forms and the 4 specials): raise it")
    return vocab


class BPEVocab(Vocab):
    """Pieces <-> ids (a :class:`rayseq.vocab.Vocab`), words <-> pieces (module docstring)."""

    kind = KIND

    def __init__(self, tokenizer_json: str):
        self.tokenizer = _tokenizers().Tokenizer.from_str(tokenizer_json)
        self._json = tokenizer_json
        self._memo: dict[tuple[str, ...], np.ndarray] = {}  # words -> ids, filled by encode_many only
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        itos = sorted(vocab, key=vocab.get)
        if tuple(itos[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS or [vocab[t] for t in itos] != list(range(len(itos))):
            raise ValueError(f"a BPE tokenizer must have ids 0..{len(itos) - 1} with {SPECIAL_TOKENS} first")
        super().__init__(itos[len(SPECIAL_TOKENS):])

    @classmethod
    def from_spec(cls, spec: dict) -> BPEVocab:
        vocab = cls(spec[KIND])
        if vocab.itos != list(spec["itos"]):
            raise ValueError("vocabulary spec: its itos differs from its BPE tokenizer's")
        return vocab

    def to_spec(self) -> dict:
        return {"itos": list(self.itos), KIND: self._json}

    # -- words -> ids -------------------------------------------------------------------------------
    def encode_words(self, words: list[str]) -> np.ndarray:
        """(k,) int64 piece ids of ``words`` (rayseq's word tokens)."""
        if not words:
            return np.zeros(0, dtype=np.int64)
        hit = self._memo.get(tuple(words))
        if hit is not None:
            return hit
        return np.asarray(self.tokenizer.encode(words, is_pretokenized=True).ids, dtype=np.int64)

    def encode_many(self, word_lists: list[list[str]]) -> list[np.ndarray]:
        """:meth:`encode_words` of each list, batched (the tokenizer's threads); remembered, so that preparing a
        corpus encodes each distinct text once."""
        todo = list({tuple(w) for w in word_lists if w and tuple(w) not in self._memo})
        for words, enc in zip(todo, self.tokenizer.encode_batch([list(w) for w in todo], is_pretokenized=True)):
            self._memo[words] = np.asarray(enc.ids, dtype=np.int64)
        return [self.encode_words(w) for w in word_lists]

    def encode_text(self, text: str, max_len: int) -> np.ndarray:
        """(k,) int64 ids of ``text``, its LAST ``max_len`` (as inputs are truncated)."""
        ids = self.encode_words(tokenize(text, "words", lowercase=True))
        return ids[-max_len:] if max_len > 0 else ids[:0]

    # -- ids -> words -> text -----------------------------------------------------------------------
    def words(self, ids) -> list[str]:
        """The words of ``ids`` up to the first ``<eos>`` (``<pad>``/``<bos>`` left out; ``<unk>`` a word of its
        own); a last word without its ``</w>`` piece (a reply cut by the length cap) is a word too."""
        out, cur = [], ""
        for p in self.decode(ids):
            if p in SPECIAL_TOKENS and p != UNK:
                continue
            if p == UNK:
                out += [cur, UNK] if cur else [UNK]
                cur = ""
            elif p.endswith(END):
                out.append(cur + p[: -len(END)])
                cur = ""
            else:
                cur += p
        if cur:
            out.append(cur)
        return out

    def decode_text(self, ids, truecase: bool = False) -> str:
        """The text of ``ids`` up to the first end token: :func:`rayseq.data.text.detokenize` of :meth:`words`."""
        return detokenize(self.words(ids), "words", truecase)


def vocab_from_spec(spec: dict) -> Vocab:
    """The vocabulary a spec (``vocab.json``, a checkpoint's task spec) describes: BPE or word-level."""
    return BPEVocab.from_spec(spec) if KIND in spec else Vocab.from_spec(spec)


class WordIds:
    """Words -> ids of a growing word index, for the word-level metrics of a subword model: BLEU and distinct-n
    count equal ids, so any injective map from words does (the index is a task's own, never stored)."""

    def __init__(self, vocab: BPEVocab):
        self.vocab, self.index = vocab, {}

    def __call__(self, ids) -> np.ndarray:
        """(k,) int64 word ids of a reply's piece ids (up to its end token)."""
        index = self.index
        return np.fromiter((index.setdefault(w, len(index)) for w in self.vocab.words(ids)), dtype=np.int64)

    def padded(self, tokens: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Replies (B, T) piece ids with (B,) lengths -> ((B, W) word ids right-padded with 0, (B,) word counts)."""
        rows = [self(tokens[i, : lengths[i]]) for i in range(len(tokens))]
        lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        out = np.zeros((len(rows), max(int(lens.max(initial=0)), 1)), dtype=np.int64)
        for i, r in enumerate(rows):
            out[i, : len(r)] = r
        return out, lens


class BPEJoiner:
    """Incremental text of a reply by piece id, as :class:`rayseq.data.text.Joiner` for words: a word's first piece
    is placed by the word joiner (space, capital), the pieces after it are appended as they are; so the pieces
    concatenate to :meth:`BPEVocab.decode_text` (with ``truecase``) and stream as they come."""

    def __init__(self, vocab: BPEVocab, truecase: bool = False):
        self.itos, self.joiner, self.in_word = vocab.itos, Joiner("words", truecase), False

    def _step(self, tid: int, commit: bool) -> str:
        p = self.itos[tid]
        if p in SPECIAL_TOKENS and p != UNK:
            return ""
        whole = p.endswith(END) or p == UNK  # <unk> is a word of its own
        text = p if p == UNK else p[: -len(END)] if whole else p
        if self.in_word and p != UNK:
            piece = text
        elif whole:
            piece = (self.joiner.push if commit else self.joiner.peek)(text)
        else:
            # the first piece of a longer word: the joiner places a stand-in that starts like the word and is, like
            # it, a number or not, and not "i" alone (no capital I for "igloo"); its last character is dropped
            stand_in = text + ("0" if text.isdigit() else "x")
            piece = (self.joiner.push if commit else self.joiner.peek)(stand_in)[:-1]
        if commit:
            self.in_word = not whole
        return piece

    def push(self, tid: int) -> str:
        return self._step(int(tid), True)

    def peek(self, tid: int) -> str:
        return self._step(int(tid), False)
