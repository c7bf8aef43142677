"""Tiny local Hugging Face models, to try the ``model.arch=hf`` path without a download: a randomly initialised GPT-2
causal LM (2 layers, hidden 32, 128 positions: about 0.1 M parameters) with a byte-level BPE tokenizer trained on
your text, and a GPT-2 sequence classifier of the same kind (the model of ``reward.fn=hf_classifier``). Each is a
folder as ``save_pretrained`` writes it (config.json, model.safetensors, tokenizer files), so rayseq reads it as it
reads any other model folder. ``python -m rayseq.data tiny-model DATA --out DIR`` makes one from a prepared
dataset; the tests build theirs with the same functions.

The tokenizer (``tokenizers``' BPE over bytes, so no text is out of its vocabulary) has the specials rayseq needs:
``<pad>`` 0 (a pad token other than the end token), ``<bos>`` 1 (the separator between prompt and reply), ``<eos>`` 2,
``<unk>`` 3. The weights are random: such a model replies with noise until it is trained, which is what trying the
path needs (a run's table and figures, checkpoints, serving, export), not what a chatbot needs.

Math layer: torch, transformers, tokenizers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]


def train_tokenizer(texts: Iterable[str], vocab_size: int = 400):
    """A byte-level BPE tokenizer of at most ``vocab_size`` tokens (the 4 specials included) learned on ``texts``,
    as a ``transformers.PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>")


def make_tiny_lm(out: str | Path, texts: Iterable[str], *, vocab_size: int = 400, positions: int = 128,
                 hidden: int = 32, layers: int = 2, heads: int = 2, seed: int = 0) -> Path:
    """Write a tiny GPT-2 causal LM and its tokenizer (trained on ``texts``) into the folder ``out``; returns it.

    Args:
        out: the folder (created).
        texts: what the tokenizer learns its pieces from.
        vocab_size: tokenizer size, specials included.
        positions: the longest sequence (prompt, separator, reply and end token) the model reads.
        hidden: embedding and hidden size (a multiple of ``heads``).
        layers: transformer blocks.
        heads: attention heads (``heads=1``: heads of 32 dimensions, the smallest vLLM's CPU kernels take).
        seed: of the random weights.
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(texts, vocab_size)
    tokenizer.save_pretrained(out)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=positions, n_embd=hidden, n_layer=layers,
                        n_head=heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)
    GPT2LMHeadModel(config).save_pretrained(out)
    return out


def make_tiny_classifier(out: str | Path, tokenizer, *, labels: Sequence[str] = ("NEGATIVE", "POSITIVE"),
                         positions: int = 128, seed: int = 1) -> Path:
    """Write a tiny GPT-2 sequence classifier (1 layer, hidden 16; one class per label, ``id2label`` naming them)
    with ``tokenizer`` into the folder ``out``; returns it. ``reward.fn=hf_classifier`` with ``label: NAME`` rewards
    a reply with its probability of that class.

    Args:
        out: the folder (created).
        tokenizer: a ``transformers`` tokenizer (:func:`train_tokenizer`'s, or one loaded from a folder).
        labels: the class names, at least two.
        positions: the longest input it reads.
        seed: of the random weights.
    """
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification

    if len(labels) < 2 or len(set(labels)) != len(labels):
        raise ValueError(f"labels: at least two different class names, got {list(labels)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=positions, n_embd=16, n_layer=1, n_head=2,
                        num_labels=len(labels), id2label=dict(enumerate(labels)),
                        label2id={name: i for i, name in enumerate(labels)}, pad_token_id=tokenizer.pad_token_id,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    GPT2ForSequenceClassification(config).save_pretrained(out)
    return out
