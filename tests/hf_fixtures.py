"""A tiny local Hugging Face model directory for the ``model.arch=hf`` tests: a randomly initialised 2-layer GPT-2
(hidden 32) and a byte-level BPE tokenizer trained with ``tokenizers`` on a few hundred lines of the chit-chat
corpus (the ``chitchat-dataset`` package), saved as ``save_pretrained`` writes them (config.json,
model.safetensors, tokenizer files). Nothing is downloaded.

Specials: ``<pad>`` 0, ``<bos>`` 1 (the separator between prompt and reply), ``<eos>`` 2, ``<unk>`` 3.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


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
                 n_head: int = 2) -> Path:
    """Write the tiny model and tokenizer into ``out`` (created); returns it. ``n_head=1`` gives attention heads of
    32 dimensions, the smallest vLLM's CPU attention kernels take."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(chitchat_lines() + list(extra_lines), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>")
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(fast), n_positions=128, n_embd=32, n_layer=2, n_head=n_head,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                        pad_token_id=fast.pad_token_id)
    GPT2LMHeadModel(config).save_pretrained(out)
    return out


def logged_text(prompts, replies, references, *, log: str):
    """A user reward on detokenised text (``reward.fn=tests.hf_fixtures:logged_text``): the reply's length in
    characters over 20, capped at 1; appends every (prompt, reply, references) it sees to ``log`` as JSON lines."""
    with open(log, "a") as f:
        for p, r, refs in zip(prompts, replies, references):
            f.write(json.dumps({"prompt": p, "reply": r, "references": refs}) + "\n")
    return [min(len(r) / 20.0, 1.0) for r in replies]


def make_tiny_classifier(out: Path, tokenizer_dir: Path, *, seed: int = 1) -> Path:
    """A randomly initialised 2-class GPT-2 sequence classifier (labels ``dull``, ``lively``) with the tiny
    tokenizer, saved into ``out``: the model of ``reward.fn=hf_classifier`` in the tests."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2ForSequenceClassification

    out = Path(out)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    tok.save_pretrained(out)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=16, n_layer=1, n_head=2, num_labels=2,
                        id2label={0: "dull", 1: "lively"}, label2id={"dull": 0, "lively": 1},
                        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    GPT2ForSequenceClassification(config).save_pretrained(out)
    return out
