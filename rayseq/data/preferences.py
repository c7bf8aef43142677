"""Preference data as TRL, OpenRLHF and NeMo-RL write it, read for reward-model training (``task.name=preferences``).

A row holds a preferred reply ``chosen`` and a dispreferred one ``rejected``, optionally the ``prompt`` they answer
and a ``margin`` (how much better ``chosen`` is; Llama 2's). Two formats, as TRL's data guide names them:

- standard: ``{"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}``; without ``prompt`` (TRL's
  implicit prompt) the longest common word prefix of ``chosen`` and ``rejected`` is the prompt;
- conversational: ``{"prompt": [{"role": "user", "content": ...}], "chosen": [{"role": "assistant", "content":
  ...}], "rejected": [...]}``; without ``prompt`` the longest common prefix of the two message lists is the prompt
  (TRL's ``extract_prompt``), the rest of each list its reply.

Sources: ``.jsonl`` files, ``.parquet``, ``.csv`` (a header row) and ``datasets.save_to_disk`` folders (every
split, in order; needs ``datasets``). The rows are split into train / valid / test by a seeded permutation
(:func:`split_rows`). A bad row is a :class:`DataError` naming the file, the row and the field.

Math/data layer: pyarrow, numpy; never Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rayseq.data.errors import DataError
from rayseq.data.preparation import PrepareOptions, _jsonl_records, _read_table, _text_of_messages


@dataclass(frozen=True)
class PreferenceRow:
    """One pair. ``prompt`` is text, or a list of ``{role, content}`` messages (conversational); ``chosen`` and
    ``rejected`` are the replies' text (a conversational reply's assistant contents joined by a space)."""

    prompt: str | list
    chosen: str
    rejected: str
    margin: float = 0.0


def _records(path: Path) -> list[tuple[str, dict]]:
    """(where, row) of every row of the source ``path`` (module docstring), by its suffix or, a folder, datasets'."""
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_dir():
        table = _read_table("hf", path)
    elif path.suffix == ".jsonl":
        return list(_jsonl_records(path, PrepareOptions(quiet=True)))  # (where, row): the lines' own errors
    elif path.suffix in (".parquet", ".csv"):
        table = _read_table(path.suffix[1:], path)
    else:
        raise DataError(f"{path}: not a .jsonl, .parquet or .csv file or a datasets folder")
    return [(f"{path}: row {i + 1}", obj) for i, obj in enumerate(table.to_pylist())]


def _common_prefix(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _row(where: str, obj: dict) -> PreferenceRow:
    for k in ("chosen", "rejected"):
        if obj.get(k) is None:
            raise DataError(f"{where}: missing field {k!r} (a preference row has chosen and rejected; optionally "
                            "prompt and margin)")
    chosen, rejected, prompt = obj["chosen"], obj["rejected"], obj.get("prompt")
    conversational = isinstance(chosen, list)
    if conversational != isinstance(rejected, list) or (prompt is not None and
                                                        conversational != isinstance(prompt, list)):
        raise DataError(f"{where}: mixes text and conversations; give prompt, chosen and rejected all as text or "
                        "all as {role, content} message lists")
    margin = obj.get("margin")
    if margin is None:
        margin = 0.0
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
        raise DataError(f"{where}: field 'margin' must be a finite number, got {margin!r}")
    if conversational:
        chosen = _text_of_messages(chosen, where, "chosen")
        rejected = _text_of_messages(rejected, where, "rejected")
        if prompt is None:  # TRL's implicit prompt: the messages the two share
            n = _common_prefix(chosen, rejected)
            prompt, chosen, rejected = chosen[:n], chosen[n:], rejected[n:]
            if not prompt:
                raise DataError(f"{where}: no prompt field and chosen and rejected share no first message")
        else:
            prompt = _text_of_messages(prompt, where, "prompt")
        for k, msgs in (("chosen", chosen), ("rejected", rejected)):
            if not msgs or any(m["role"] != "assistant" for m in msgs):
                raise DataError(f"{where}: field {k!r} must end in the assistant's messages after the prompt")
        return PreferenceRow(prompt, " ".join(m["content"] for m in chosen),
                             " ".join(m["content"] for m in rejected), float(margin))
    for k, v in (("chosen", chosen), ("rejected", rejected), ("prompt", prompt)):
        if v is not None and not isinstance(v, str):
            raise DataError(f"{where}: field {k!r} must be a string or a list of {{role, content}} messages, got "
                            f"{type(v).__name__}")
    if prompt is None:  # TRL's implicit prompt: the words the two share
        c, r = chosen.split(" "), rejected.split(" ")
        n = _common_prefix(c, r)
        if n == 0:
            raise DataError(f"{where}: no prompt field and chosen and rejected share no first word")
        # the replies keep the space that joined them to the prompt: prompt + reply is the row's text
        prompt, chosen, rejected = " ".join(c[:n]), " " + " ".join(c[n:]), " " + " ".join(r[n:])
    return PreferenceRow(prompt, chosen, rejected, float(margin))


def read_preferences(path: str | Path) -> list[PreferenceRow]:
    """Every row of the source ``path`` (module docstring), checked; every prompt in one format."""
    path = Path(path).expanduser()
    rows = [_row(where, obj) for where, obj in _records(path)]
    if not rows:
        raise DataError(f"{path}: no rows")
    kinds = {isinstance(r.prompt, list) for r in rows}
    if len(kinds) > 1:
        raise DataError(f"{path}: some prompts are text, others conversations; give every row the same way")
    return rows


def split_rows(n: int, valid_fraction: float, test_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """Row indices of train / valid / test: a permutation of 0..n−1 seeded ``seed``, its first ⌈n·test_fraction⌉
    the test rows, the next ⌈n·valid_fraction⌉ the valid rows (each at least 1 when its fraction is > 0), the rest
    train (sorted within each split)."""
    perm = np.random.default_rng(seed).permutation(n)
    n_test = math.ceil(n * test_fraction) if test_fraction > 0 else 0
    n_valid = math.ceil(n * valid_fraction) if valid_fraction > 0 else 0
    if n - n_test - n_valid < 1:
        raise DataError(f"{n} rows leave none to train on after {n_valid} valid and {n_test} test rows")
    return {"test": np.sort(perm[:n_test]), "valid": np.sort(perm[n_test : n_test + n_valid]),
            "train": np.sort(perm[n_test + n_valid :])}
