"""What rayseq reads of a local Hugging Face model folder before it builds anything from it: its tokenizer
(:func:`load_tokenizer`, never a download) and its positions (:func:`context_length`, from config.json alone).

Data layer: transformers (imported when a tokenizer is loaded).
"""

from __future__ import annotations

import json
from pathlib import Path

from rayseq.config.environment import transformers_problem
from rayseq.data.errors import DataError


def load_tokenizer(path: str):
    """``AutoTokenizer.from_pretrained(path, local_files_only=True)``; one line saying what is wrong when it cannot
    be loaded (DataError; FileNotFoundError for a folder that is not there)."""
    try:
        from transformers import AutoTokenizer
    except (ImportError, RuntimeError) as exc:  # a library it imports failing (a torchvision for another torch)
        if problem := transformers_problem():
            raise DataError(problem) from None
        if isinstance(exc, ImportError):
            raise ImportError("a Hugging Face tokenizer needs the hf extra: pip install 'rayseq[hf]'") from None
        raise DataError(f"transformers does not import here: {exc}") from None
    if not Path(path).expanduser().is_dir():
        raise FileNotFoundError(f"{path}: no such directory (a Hugging Face model or tokenizer directory)")
    try:
        return AutoTokenizer.from_pretrained(str(Path(path).expanduser()), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: no Hugging Face tokenizer could be loaded there ({exc})") from None


def context_length(path) -> int | None:
    """The positions of the Hugging Face model in ``path`` (its config.json's ``max_position_embeddings``,
    ``n_positions`` or ``n_ctx``); None for a tokenizer without a model config, or a model without such a limit."""
    config = Path(path).expanduser() / "config.json"
    try:
        spec = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        if isinstance(spec.get(key), int) and spec[key] > 0:
            return int(spec[key])
    return None
