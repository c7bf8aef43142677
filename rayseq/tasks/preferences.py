"""``task.name=preferences``: preference pairs (prompt, chosen, rejected, margin) for reward-model training
(``algo.name=reward_model``), read from TRL-shaped data (:mod:`rayseq.data.preferences`: JSONL, Parquet, CSV or a
``datasets`` folder; standard text or conversational messages).

The rows are split train / valid / test by ``task.split_seed`` (``task.valid_fraction``, ``task.test_fraction``).
Token ids: with ``model.arch=hf`` the model's tokenizer (``task.hf_tokenizer``, set from ``model.path``) encodes the
prompt (a conversation rendered with its chat template, the assistant's turn opened) and then each reply, and the
model reads ``prompt reply`` with no separator between them — the text a TRL user's reward model is given
(``prompt + completion``). The built-in models read words (lower-cased; the ``task.vocab_size`` most frequent words
of the train split, the rest <unk>). A prompt keeps its last ``task.max_src_len`` tokens, a reply its first
``task.max_tgt_len``; each reply then ends with <eos>, whose position is where the reward model reads it.

The task has no reward of its own and samples no prompts: the reward model's iteration draws pairs
(:meth:`PreferencesTask.sample_preferences`) and its evaluation reads the held-out splits
(:meth:`PreferencesTask.split_batch`).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from pydantic import Field

from rayseq.config.paths import LOCAL_PATH
from rayseq.data.errors import DataError
from rayseq.data.hf_text import HFVocab
from rayseq.data.preferences import read_preferences, split_rows
from rayseq.data.text import tokenize
from rayseq.tasks.base import HELD_OUT, Task
from rayseq.types import PreferenceBatch
from rayseq.vocab import Vocab

METRICS = ("accuracy", "margin", "accuracy_longer", "loss")  # <split>/* of a reward model's evaluation


class PreferencesTask(Task):
    name = "preferences"
    fields = {
        "data": (str | None, Field(
            None, description="Preferences: a .jsonl, .parquet or .csv file or a datasets.save_to_disk folder of rows "
            "{chosen, rejected, prompt?, margin?} (text or {role, content} messages).", json_schema_extra=LOCAL_PATH)),
        "valid_fraction": (float, Field(0.1, ge=0.0, lt=1.0, description="Preferences: rows held out for val/*.")),
        "test_fraction": (float, Field(0.1, ge=0.0, lt=1.0, description="Preferences: rows held out for test/*.")),
        "split_seed": (int, Field(0, description="Preferences: seed of the train / valid / test split.")),
        "max_src_len": (int, Field(128, ge=1, description="Preferences: prompt tokens kept (the last ones).")),
        "max_tgt_len": (int, Field(128, ge=1, description="Preferences: reply tokens kept (the first ones).")),
        "vocab_size": (int, Field(
            4000, ge=5, description="Preferences, built-in models: the most frequent train words kept (the 4 "
            "specials included).")),
        "hf_tokenizer": (str | None, Field(
            None, description="Preferences: a local Hugging Face tokenizer directory; set from model.path when "
            "model.arch=hf.", json_schema_extra=LOCAL_PATH)),
    }
    has_reward = False
    about = "A reward model trained on preference pairs."

    def __init__(self, cfg):
        self.cfg = cfg
        if not cfg.data:
            raise ValueError("task.data: set it to a preference file or datasets folder (rows with chosen and "
                             "rejected)")
        rows = read_preferences(cfg.data)
        idx = split_rows(len(rows), cfg.valid_fraction, cfg.test_fraction, cfg.split_seed)
        self.conversational = isinstance(rows[0].prompt, list)
        if cfg.hf_tokenizer:
            self.vocab = HFVocab(cfg.hf_tokenizer, separator=False)  # the model reads `prompt reply`
            self.tokenizer = {"kind": "hf"}
        else:
            self.vocab = _word_vocab([rows[i] for i in idx["train"]], cfg.vocab_size)
        self.specials = self.vocab.specials
        self.max_src_len, self.max_tgt_len = cfg.max_src_len, cfg.max_tgt_len
        self.splits = {name: self._encode([rows[i] for i in ids]) for name, ids in idx.items()}

    # -- encoding -----------------------------------------------------------------------------------
    def _ids(self, text: str) -> np.ndarray:
        if isinstance(self.vocab, HFVocab):
            return np.asarray(self.vocab.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        return self.vocab.encode(tokenize(text, "words"))

    def _prompt_ids(self, prompt) -> np.ndarray:
        if isinstance(prompt, list):
            text = self.vocab.render(prompt) if isinstance(self.vocab, HFVocab) else " ".join(
                m["content"] for m in prompt)
        else:
            text = prompt
        return self._ids(text)[-self.max_src_len :]

    def _encode(self, rows: list) -> PreferenceBatch | None:
        if not rows:
            return None
        src = [self._prompt_ids(r.prompt) for r in rows]
        empty = [i for i, s in enumerate(src) if len(s) == 0]
        if empty:
            raise DataError(f"task.data={self.cfg.data}: {len(empty)} prompts have no tokens (e.g. "
                            f"{rows[empty[0]].prompt!r}); a reward model reads a prompt before each reply")
        chosen = [self._ids(r.chosen)[: self.max_tgt_len] for r in rows]
        rejected = [self._ids(r.rejected)[: self.max_tgt_len] for r in rows]
        eos = self.specials.eos
        s, s_len = _pad(src, self.specials.pad)
        c, c_len = _pad([np.append(x, eos) for x in chosen], self.specials.pad)
        j, j_len = _pad([np.append(x, eos) for x in rejected], self.specials.pad)
        width = max(c.shape[1], j.shape[1])  # one T for both replies: they run through one pass
        c, j = _widen(c, width, self.specials.pad), _widen(j, width, self.specials.pad)
        return PreferenceBatch(s, s_len, c, c_len - 1, j, j_len - 1,
                               np.array([r.margin for r in rows], dtype=np.float32))

    # -- what the reward model's iteration and evaluation read ----------------------------------------
    def sample_preferences(self, rng: np.random.Generator, n: int) -> PreferenceBatch:
        """``n`` training pairs drawn from the driver's data RNG (without replacement when the split has ``n``)."""
        train = self.splits["train"]
        rows = rng.choice(len(train), size=n, replace=n > len(train))
        return _rows(train, rows)

    def split_batch(self, split: str) -> PreferenceBatch:
        """Every pair of the held-out ``split`` (``val`` or ``test``); a ValueError when it holds none."""
        batch = self.splits[HELD_OUT[split]]
        if batch is None:
            key = "valid_fraction" if split == "val" else "test_fraction"
            raise ValueError(f"task.{key}={getattr(self.cfg, key)}: the {HELD_OUT[split]} split is empty; a reward "
                             "model's evaluation needs held-out pairs")
        return batch

    # -- the task protocol --------------------------------------------------------------------------
    def sample_prompts(self, rng, n: int, *, with_targets: bool = False):
        raise ValueError("task.name=preferences holds preference pairs for algo.name=reward_model; it has no prompts "
                         "to sample")

    def rewards(self, src, src_len, tokens, token_mask, key=None):
        raise ValueError("task.name=preferences has no reward of its own")

    def evaluate(self, generator, device="cpu", *, split: str = "val") -> tuple[dict, dict]:
        raise ValueError("task.name=preferences is evaluated by the reward model (algo.name=reward_model)")

    @classmethod
    def metric_names(cls, cfg, split: str) -> list[str]:
        return [f"{split}/{k}" for k in METRICS]

    @classmethod
    def check_config(cls, run_cfg) -> None:
        if run_cfg.algo.name != "reward_model":
            raise ValueError(f"task.name=preferences trains a reward model: set algo.name=reward_model (not "
                             f"{run_cfg.algo.name})")


def _word_vocab(rows: list, size: int) -> Vocab:
    """The ``size`` − 4 most frequent words of the rows (ties alphabetical)."""
    counts: Counter = Counter()
    for r in rows:
        prompt = " ".join(m["content"] for m in r.prompt) if isinstance(r.prompt, list) else r.prompt
        for text in (prompt, r.chosen, r.rejected):
            counts.update(tokenize(text, "words"))
    words = sorted(counts, key=lambda w: (-counts[w], w))[: max(size - 4, 1)]
    return Vocab(words)


def _pad(seqs: list[np.ndarray], pad: int) -> tuple[np.ndarray, np.ndarray]:
    lens = np.array([len(x) for x in seqs], dtype=np.int64)
    out = np.full((len(seqs), max(int(lens.max(initial=0)), 1)), pad, dtype=np.int64)
    for i, x in enumerate(seqs):
        out[i, : len(x)] = x
    return out, lens


def _widen(a: np.ndarray, width: int, pad: int) -> np.ndarray:
    return a if a.shape[1] == width else np.concatenate([a, np.full((len(a), width - a.shape[1]), pad, a.dtype)], 1)


def _rows(batch: PreferenceBatch, rows: np.ndarray) -> PreferenceBatch:
    """The rows ``rows`` of ``batch``, cut to their longest prompt and reply."""
    s, c, j = batch.src_len[rows], batch.chosen_len[rows], batch.rejected_len[rows]
    S, T = int(s.max()), int(max(c.max(), j.max())) + 1
    return PreferenceBatch(batch.src[rows, :S], s, batch.chosen[rows, :T], c, batch.rejected[rows, :T], j,
                           batch.margin[rows])
