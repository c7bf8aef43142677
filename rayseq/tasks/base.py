"""Vocabulary shared by tasks, models, checkpoints and serving."""

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
        out = []
        for i in ids:
            i = int(i)
            if stop_at_eos and i == self.specials.eos:
                break
            if i == self.specials.pad:
                continue
            out.append(self.itos[i] if 0 <= i < len(self.itos) else "<unk>")
        return out

    def to_spec(self) -> dict:
        """JSON-safe description stored in checkpoints (serving rebuilds the vocabulary from it)."""
        return {"itos": list(self.itos)}

    @classmethod
    def from_spec(cls, spec: dict) -> Vocab:
        itos = list(spec["itos"])
        if tuple(itos[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError("vocabulary spec does not start with the special tokens")
        return cls(itos[len(SPECIAL_TOKENS) :])


def task_spec(task, tokenizer: dict) -> dict:
    """What serving needs to rebuild a task's inputs and outputs (stored in checkpoints): name, vocabulary,
    length caps and tokenizer settings."""
    return {
        "name": task.name,
        "vocab": task.vocab.to_spec(),
        "max_src_len": task.max_src_len,
        "max_tgt_len": task.max_tgt_len,
        "tokenizer": dict(tokenizer),
    }


class Task:
    """What a task provides (rayseq.registry reads the class attributes without instantiating it). Subclass it for
    your own task and name it ``task.name=package.module:Class``.

    Required: ``name``; ``params`` (the ``task.*`` keys it reads besides name); in ``__init__(task_cfg)``:
    ``vocab`` (a :class:`Vocab`), ``specials`` (its ids), ``max_src_len``, ``max_tgt_len``; and the methods
    ``sample_prompts(rng, n, with_targets=False) -> PromptBatch`` (training inputs; with reference targets for
    MLE), ``rewards(src, src_len, tokens, token_mask, key=None) -> (per-token rewards (B, T), score (B,))``,
    ``evaluate(generator, device, split="val"|"test") -> (metrics "<split>/...", details)`` and the classmethod
    ``metric_names(task_cfg, split)`` (what ``evaluate`` reports: Tune checks a search metric against it).

    Optional, with defaults: ``conditional`` (the generator reads an input), ``banned_ids`` (tokens never emitted
    besides <pad>/<bos>), traits ``has_reward``, ``has_references``, ``scored_remotely`` (see rayseq.registry),
    ``defaults`` (its values of ``task.*`` keys, resolved into the config), ``prepare_data(task_cfg)`` (called once
    by the driver before any actor builds the task), ``spec()`` (what serving needs, stored in checkpoints).
    """

    name = ""
    params: tuple[str, ...] = ()
    conditional = True
    banned_ids: tuple[int, ...] = ()
    has_reward, has_references, scored_remotely = True, False, False
    tokenizer = {"kind": "words", "lowercase": True}  # how serving turns text into this task's tokens
    defaults: dict = {}

    @classmethod
    def prepare_data(cls, cfg) -> bool:
        """Prepare the task's data once, before any actor builds the task; True if it did something."""
        return False

    def spec(self) -> dict:
        """What serving needs to rebuild inputs and outputs (stored in checkpoints)."""
        return task_spec(self, self.tokenizer)
