"""The tiny local Hugging Face model directories of the ``model.arch=hf`` tests: rayseq's own tiny GPT-2 and
classifier (:mod:`rayseq.models.tiny_hf`, what ``python -m rayseq.data tiny-model`` writes), their tokenizer
trained on a few hundred lines of the chit-chat corpus (the ``chitchat-dataset`` package). Nothing is downloaded.

Specials: ``<pad>`` 0, ``<bos>`` 1 (the separator between prompt and reply), ``<eos>`` 2, ``<unk>`` 3.
"""

from __future__ import annotations

import json
from pathlib import Path


def chitchat_lines(n: int = 400) -> list[str]:
    """The first ``n`` messages of the chit-chat corpus (the installed package's dataset.json)."""
    import chitchat_dataset

    data = json.loads(Path(chitchat_dataset.__file__).with_name("dataset.json").read_text(encoding="utf-8"))
    lines = []
    for conv in data.values():
        for turn in conv["messages"]:
            lines += [m["text"] for m in turn if m.get("text")]
            if len(lines) >= n:
                return lines[:n]
    return lines


def make_tiny_hf(out: Path, *, vocab_size: int = 400, extra_lines: tuple[str, ...] = (), seed: int = 0,
                 n_head: int = 2, positions: int = 128) -> Path:
    """Write the tiny model and tokenizer (:func:`rayseq.models.tiny_hf.make_tiny_lm`, trained on the corpus's first
    lines and ``extra_lines``) into ``out`` (created); returns it. ``n_head=1`` gives attention heads of 32
    dimensions, the smallest vLLM's CPU attention kernels take; ``positions``: the longest row it reads."""
    from rayseq.models.tiny_hf import make_tiny_lm

    return make_tiny_lm(out, chitchat_lines() + list(extra_lines), vocab_size=vocab_size, heads=n_head, seed=seed,
                        positions=positions)


def logged_text(prompts, replies, references, *, log: str):
    """A user reward on detokenised text (``reward.fn=tests.hf_fixtures:logged_text``): the reply's length in
    characters over 20, capped at 1; appends every (prompt, reply, references) it sees to ``log`` as JSON lines."""
    with open(log, "a") as f:
        for p, r, refs in zip(prompts, replies, references):
            f.write(json.dumps({"prompt": p, "reply": r, "references": refs}) + "\n")
    return [min(len(r) / 20.0, 1.0) for r in replies]


def make_tiny_classifier(out: Path, tokenizer_dir: Path, *, seed: int = 1) -> Path:
    """A randomly initialised 2-class GPT-2 sequence classifier (labels ``dull``, ``lively``) with the tiny
    tokenizer, saved into ``out`` (:func:`rayseq.models.tiny_hf.make_tiny_classifier`): the model of
    ``reward.fn=hf_classifier`` in the tests."""
    from transformers import AutoTokenizer

    from rayseq.models.tiny_hf import make_tiny_classifier as make

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    return make(out, tok, labels=("dull", "lively"), seed=seed)


def with_chat_template(model_dir: Path, out: Path, template: str) -> Path:
    """A copy of the HF folder ``model_dir`` at ``out`` whose tokenizer has the chat template ``template``."""
    import shutil

    from transformers import AutoTokenizer

    shutil.copytree(model_dir, out)
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    tok.chat_template = template
    tok.save_pretrained(out)
    return out
