"""Vocabulary: token <-> id, with the special tokens every task, model, checkpoint and the chat server share.

A foundation module (the bottom layer, docs/concepts/index.md): data preparation builds a :class:`Vocab`, tasks hold
one, checkpoints store its spec and serving rebuilds it; it imports nothing from rayseq.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")


@dataclass(frozen=True)
class Specials:
    pad: int = 0
    bos: int = 1
    eos: int = 2
    unk: int = 3


class Vocab:
    """Token <-> id. Ids 0..3 are <pad>, <bos>, <eos>, <unk>; the task's tokens follow."""

    def __init__(self, tokens: list[str]):
        dup = [t for t in tokens if t in SPECIAL_TOKENS]
        if dup:
            raise ValueError(f"vocabulary tokens clash with special tokens: {dup}")
        self.itos = list(SPECIAL_TOKENS) + list(tokens)
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("vocabulary has duplicate tokens")
        self.specials = Specials()

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, words: list[str]) -> np.ndarray:
        unk = self.specials.unk
        return np.array([self.stoi.get(w, unk) for w in words], dtype=np.int64)

    def decode(self, ids, *, stop_at_eos: bool = True) -> list[str]:
        return decode_tokens(ids, self.specials, lambda i: self.itos[i] if 0 <= i < len(self.itos) else "<unk>",
                             stop_at_eos=stop_at_eos)

    def to_spec(self) -> dict:
        """JSON-safe description stored in checkpoints (serving rebuilds the vocabulary from it)."""
        return {"itos": list(self.itos)}

    @classmethod
    def from_spec(cls, spec: dict) -> Vocab:
        itos = list(spec["itos"])
        if tuple(itos[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError("vocabulary spec does not start with the special tokens")
        return cls(itos[len(SPECIAL_TOKENS) :])


def decode_tokens(ids, specials: Specials, token, *, stop_at_eos: bool = True) -> list[str]:
    """Token strings ``token(id)`` of ``ids``, ``<pad>`` left out, up to the first ``<eos>`` (``stop_at_eos``): every
    vocabulary's ``decode`` (rayseq's own, and a Hugging Face tokenizer's in rayseq.data.hf_text)."""
    out = []
    for i in ids:
        i = int(i)
        if stop_at_eos and i == specials.eos:
            break
        if i != specials.pad:
            out.append(token(i))
    return out
