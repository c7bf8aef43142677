"""``reward.fn=hf_classifier``: a local Hugging Face sequence-classification model as the reward (a sentiment or
toxicity classifier, a reward model), run where configured rewards run — on the scorer actors (``scorer.*``; their
GPU with ``scorer.num_gpus_per_scorer``), the rollout workers when there are no scorers.

    reward.fn=hf_classifier reward.kwargs={path: DIR, label: 1}

kwargs:
    path        a local model directory (``save_pretrained``: config.json, weights, tokenizer), loaded with
                ``local_files_only=True`` (never a download), once per process
    label       the class whose probability is the reward (an index, or a name of the config's ``id2label``);
                default 1 (the positive class of a binary classifier). A model with one output (a regression head,
                a reward model) gives that output itself and ignores ``label``
    with_prompt classify the pair (prompt, reply) instead of the reply alone (a reward model of a reply to a prompt)
    batch_size  replies per forward pass (64)
    max_length  tokens per input, truncated beyond; default (None) the classifier's positions (its config.json's
                ``max_position_embeddings``, ``n_positions`` or ``n_ctx``), else 512. A value above the model's
                positions is refused when the run is configured: the model has no position for the extra tokens

Returns softmax(logits)[label] in [0, 1] per reply (or the single output); an empty reply is classified as one pad
token. Math layer: torch, transformers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from rayseq.data.hf_files import context_length
from rayseq.rewards.trained import is_reward_checkpoint, is_run, scorer_device, scorer_of

_LOADED: dict[tuple[str, str], tuple] = {}  # (path, device) -> (tokenizer, model), one per process


def _load(path: str, device: str):
    key = (str(Path(path).expanduser()), device)
    if key not in _LOADED:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        tok = AutoTokenizer.from_pretrained(key[0], local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(key[0], local_files_only=True).to(device).eval()
        if model.config.pad_token_id is None and tok.pad_token_id is not None:
            model.config.pad_token_id = tok.pad_token_id  # batched inputs are padded: the model must find their ends
        _LOADED[key] = tok, model
    return _LOADED[key]


def _label_index(model, label) -> int:
    if isinstance(label, str):
        names = {v: int(k) for k, v in model.config.id2label.items()}
        if label not in names:
            raise ValueError(f"hf_classifier: label {label!r} is not one of the model's labels {sorted(names)}")
        return names[label]
    if not 0 <= label < model.config.num_labels:
        raise ValueError(f"hf_classifier: label {label} is outside the model's {model.config.num_labels} classes")
    return int(label)


@torch.no_grad()
def hf_classifier(prompts: list[str], replies: list[str], references: list[list[str]], *, path: str,
                  label: int | str = 1, with_prompt: bool = False, batch_size: int = 64,
                  max_length: int | None = None) -> np.ndarray:
    """The classifier's probability of ``label`` for each reply (module docstring)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok, model = _load(path, device)
    max_length = max_length or context_length(path) or DEFAULT_MAX_LENGTH
    single = model.config.num_labels == 1
    index = 0 if single else _label_index(model, label)
    out = []
    for a in range(0, len(replies), batch_size):
        texts = replies[a : a + batch_size]
        pair = (list(prompts[a : a + batch_size]), list(texts)) if with_prompt else (list(texts),)
        enc = tok(*pair, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        empty = enc["attention_mask"].sum(1) == 0
        if bool(empty.any()):  # an empty reply: one pad token, attended (a model needs a token to classify)
            if enc["input_ids"].shape[1] == 0:
                enc = {k: torch.zeros(len(texts), 1, dtype=torch.long) for k in ("input_ids", "attention_mask")}
                enc["input_ids"].fill_(tok.pad_token_id if tok.pad_token_id is not None else 0)
            enc["attention_mask"][empty, 0] = 1
        enc = {k: v.to(device) for k, v in enc.items()}
        try:
            logits = model(**enc).logits.float()
        except (IndexError, RuntimeError) as exc:  # e.g. more tokens than the model has positions
            raise ValueError(f"the classifier in {path} failed on {len(texts)} inputs of up to "
                             f"{enc['input_ids'].shape[1]} tokens (max_length={max_length}): {exc}; a smaller "
                             "max_length in the reward's kwargs may fit it") from None
        out.append((logits[:, 0] if single else torch.softmax(logits, -1)[:, index]).cpu().numpy())
    return np.concatenate(out).astype(np.float64) if out else np.zeros(0)


DEFAULT_MAX_LENGTH = 512  # tokens per input of a classifier whose config names no position limit


def _check(path: str, label: int | str = 1, with_prompt: bool = False, batch_size: int = 64,
           max_length: int | None = None) -> None:
    where = Path(str(path)).expanduser()
    if not where.is_dir():
        raise ValueError(f"path={path}: no such directory (a local Hugging Face sequence-classification model)")
    if not (where / "config.json").is_file():
        raise ValueError(f"path={path}: no config.json there (not a Hugging Face model directory)")
    if not isinstance(label, (int, str)) or isinstance(label, bool):
        raise ValueError(f"label must be a class index or name, got {label!r}")
    for k, v in (("batch_size", batch_size), ("max_length", 1 if max_length is None else max_length)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{k} must be an integer >= 1, got {v!r}")
    positions = context_length(where)
    if max_length is not None and positions is not None and max_length > positions:
        raise ValueError(f"max_length={max_length}: the classifier in {path} reads {positions} positions; give "
                         f"max_length <= {positions} in the reward's kwargs, or leave it out (its positions)")


hf_classifier.check_kwargs = _check


@torch.no_grad()
def reward_model(prompts: list[str], replies: list[str], references: list[list[str]], *, path: str,
                 batch_size: int = 64, max_length: int | None = None) -> np.ndarray:
    """``reward.fn=reward_model``: the logit of a reward model's folder (``num_labels=1``; what ``python -m
    rayseq.export`` writes of an ``algo.name=reward_model`` run on an HF policy, or any sequence-classification
    reward model) on the ids of each prompt followed by those of its reply, as it was trained (the tokenizer's
    ids of the two texts, concatenated: not a sentence pair with separators). The last ``max_length`` ids are read
    (default: the model's positions). Runs where configured rewards run: the scorer actors, ``batch_size`` replies a
    pass. ``path`` may also be an ``algo.name=reward_model`` run (its newest checkpoint; any ``model.arch``, the
    built-in ones included): :class:`rayseq.rewards.trained.RewardModelScorer` scores it."""
    device = scorer_device()
    if is_run(path):
        return np.asarray(scorer_of(path, device).score([p + r for p, r in zip(prompts, replies)], list(prompts)),
                          dtype=np.float64)
    tok, model = _load(path, device)
    if model.config.num_labels != 1:
        raise ValueError(f"reward_model: the model in {path} has {model.config.num_labels} outputs; a reward model "
                         "has one (a classifier's class probability: reward.fn=hf_classifier)")
    max_length = max_length or context_length(path) or DEFAULT_MAX_LENGTH
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    out = []
    for a in range(0, len(replies), batch_size):
        rows = [(tok(p, add_special_tokens=False)["input_ids"] + tok(r, add_special_tokens=False)["input_ids"])
                [-max_length:] or [pad] for p, r in zip(prompts[a : a + batch_size], replies[a : a + batch_size])]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
        out.append(model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits[:, 0].float().cpu().numpy())
    return np.concatenate(out).astype(np.float64) if out else np.zeros(0)


def _check_reward_model(path: str, batch_size: int = 64, max_length: int | None = None) -> None:
    if is_run(path):
        if not is_reward_checkpoint(path):
            raise ValueError(f"path={path}: a run that is not a reward model's (algo.name=reward_model)")
        return
    _check(path, batch_size=batch_size, max_length=max_length)


reward_model.check_kwargs = _check_reward_model
