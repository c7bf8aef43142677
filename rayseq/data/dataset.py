"""Reader of a dataset prepared by ``python -m rayseq.data prepare`` (layout in ``rayseq.data.preparation``).

``DialogueData.load(dir)`` gives padded numpy arrays per split, the vocabulary and the tokenizer
settings; ``DialogueSplit.references()`` gives every group's replies (the one-to-many BLEU-2
references) and ``group_inputs()`` one input row per group, for evaluation. ``encode_text`` encodes a
prompt as training encoded the inputs (same tokenizer, same keep-the-last-tokens truncation). A dataset
of format v1, whose valid/test splits may hold training inputs, is refused with the command that
re-prepares it.

Math/data layer: numpy + pyarrow; never Ray.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rayseq.data.preparation import EXTRA_PREFIX, FORMAT_VERSION, SPLITS, DataError, prepare_command
from rayseq.data.subword import vocab_from_spec
from rayseq.data.text import tokenize
from rayseq.vocab import Vocab

# formats whose held-out splits were not cleaned of training inputs: refused with the command that re-prepares
LEAKY_VERSIONS = ("rayseq-dialogue-v1",)
READABLE_VERSIONS = ("rayseq-dialogue-v2", FORMAT_VERSION)  # v2: no prompt-only rows, no kept columns


def encode_text(text: str, vocab: Vocab, tokenizer: dict, max_len: int) -> np.ndarray:
    """(k,) int64 ids of ``text``, k <= max_len: the LAST ``max_len`` tokens, as inputs were truncated;
    unknown words are <unk>. k is 0 for a text without tokens. A vocabulary with its own tokenizer (``encode_text``:
    a Hugging Face one, :mod:`rayseq.data.hf_text`) encodes the text itself."""
    if hasattr(vocab, "encode_text"):
        return vocab.encode_text(text, max_len)
    tokens = tokenize(text, **tokenizer)
    return vocab.encode(tokens[-max_len:] if max_len > 0 else [])


def places_in_rows(lens: np.ndarray) -> np.ndarray:
    """(Σ lens,) int64: for rows of ``lens`` laid end to end, each id's place in its row (0, 1, .., 0, 1, ..)."""
    lens = np.asarray(lens, dtype=np.int64)
    return np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)


def pad_rows(ids: np.ndarray, lens: np.ndarray, width: int, pad: int, starts: np.ndarray | None = None) -> np.ndarray:
    """(n, width) int64: row i is ``ids[starts[i] : starts[i] + lens[i]]`` right-padded with ``pad`` (``starts``:
    the rows laid end to end when not given)."""
    lens = np.asarray(lens, dtype=np.int64)
    out = np.full((len(lens), width), pad, dtype=np.int64)
    cols = places_in_rows(lens)
    at = np.arange(len(cols)) if starts is None else np.repeat(starts, lens) + cols
    out[np.repeat(np.arange(len(lens)), lens), cols] = ids[at]
    return out


class RaggedRows:
    """Token rows of different lengths held unpadded (the ids end to end, int64) and read as the padded (n, width)
    array they stand for: indexing with rows (an int, a slice, an array of row numbers) gives those rows padded with
    ``pad``; ``[i, :k]`` with k within row i's length is a view of its ids. What a re-tokenised dataset holds
    (:mod:`rayseq.data.hf_text`): its inputs' lengths vary by thousands of tokens, and padding every row to the
    longest is what a batch needs, not the whole dataset."""

    ndim = 2
    dtype = np.dtype(np.int64)

    def __init__(self, ids: np.ndarray, lens: np.ndarray, width: int, pad: int):
        self.ids = np.ascontiguousarray(ids, dtype=np.int64)
        self.lens = np.asarray(lens, dtype=np.int64)
        self.starts = np.cumsum(self.lens) - self.lens
        self.width, self.pad = int(width), int(pad)
        if len(self.ids) != int(self.lens.sum()) or (len(self.lens) and self.lens.max() > self.width):
            raise ValueError(f"RaggedRows: {len(self.ids)} ids for rows of {int(self.lens.sum())} in all, the longest "
                             f"{int(self.lens.max(initial=0))} (width {self.width})")

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.lens), self.width

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes + self.lens.nbytes + self.starts.nbytes

    def __len__(self) -> int:
        return len(self.lens)

    def __getitem__(self, index):
        if isinstance(index, tuple):
            row, cols = index
            if isinstance(cols, slice) and np.ndim(row) == 0 and cols.step is None and (cols.start or 0) >= 0 \
                    and cols.stop is not None and 0 <= cols.stop <= self.lens[row]:
                start = self.starts[row]
                return self.ids[start + (cols.start or 0) : start + cols.stop]
            return self[row][(slice(None), cols) if np.ndim(row) else cols]
        if np.ndim(index) == 0 and not isinstance(index, slice):
            return self[np.array([index])][0]
        rows = np.arange(len(self.lens))[index]  # a slice, row numbers or a mask, checked as numpy checks them
        return pad_rows(self.ids, self.lens[rows], self.width, self.pad, self.starts[rows])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)


@dataclass
class DialogueSplit:
    src: np.ndarray | RaggedRows  # (n, S) int64 input ids, right-padded with 0 (<pad>), S = max_src_len
    src_len: np.ndarray  # (n,) int64, >= 1
    tgt: np.ndarray | RaggedRows  # (n, T) int64 reply ids, right-padded with 0, no bos/eos, T = max_tgt_len
    tgt_len: np.ndarray  # (n,) int64, >= 1; 0 for a prompt-only row
    group: np.ndarray  # (n,) int64 group of the input, 0..G-1: rows of one group have the same src
    src_text: list[str]  # tokenised (truncated) input joined by spaces
    tgt_text: list[str]
    conv_id: list[str]
    prompts: list | None = None  # per row, the prompt as written: text, or a list of {role, content} messages (v3)
    replies: list | None = None  # per row, the reply as written; None for a prompt-only row (v3)
    columns: dict[str, list] | None = None  # the source's other columns: name -> per-row values (v3)

    def __len__(self) -> int:
        return len(self.src_len)

    @property
    def num_groups(self) -> int:
        return int(self.group.max()) + 1 if len(self.group) else 0

    def references(self) -> list[list[np.ndarray]]:
        """Per group g (index g), the unpadded reply id arrays of its rows, in row order."""
        refs: list[list[np.ndarray]] = [[] for _ in range(self.num_groups)]
        for i, g in enumerate(self.group.tolist()):
            if self.tgt_len[i]:  # a prompt-only row has no reply to add
                refs[g].append(self.tgt[i, : self.tgt_len[i]])
        return refs

    def group_rows(self) -> np.ndarray:
        """(G,) the first row of each group (the row :meth:`group_inputs` takes the input of)."""
        _, first = np.unique(self.group, return_index=True)
        return first

    def group_inputs(self) -> tuple[np.ndarray, np.ndarray]:
        """((G, S) src, (G,) src_len): the input of each group, row g for group g."""
        _, first = np.unique(self.group, return_index=True)  # groups are 0..G-1, so row g is group g
        return self.src[first], self.src_len[first]


def _padded(col: pa.ChunkedArray, width: int, name: str, least: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """list<int32> column -> ((n, width) int64 right-padded with 0, (n,) int64 lengths in [least, width])."""
    col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    lens = pc.list_value_length(col).to_numpy(zero_copy_only=False).astype(np.int64)
    values = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.int64)
    n = len(lens)
    if n and (lens.min() < least or lens.max() > width):
        raise DataError(f"{name}: lengths must be in [{least}, {width}] (got {lens.min()}..{lens.max()})")
    return pad_rows(values, lens, width, 0), lens


def _read_split(dir_: Path, max_src_len: int, max_tgt_len: int, vocab_size: int, manifest: dict) -> DialogueSplit:
    shards = sorted(dir_.glob("part-*.parquet"))
    if not shards:
        raise DataError(f"{dir_}: no part-*.parquet shard (not a prepared dataset?)")
    try:
        table = pa.concat_tables([pq.read_table(p) for p in shards])
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{dir_}: cannot read the shards ({e})") from None
    missing = {"conv_id", "group", "src", "tgt", "src_text", "tgt_text"} - set(table.column_names)
    if missing:
        raise DataError(f"{dir_}: shards lack the columns {sorted(missing)}")
    src, src_len = _padded(table.column("src"), max_src_len, f"{dir_}/src")
    v3 = "prompt" in table.column_names
    tgt, tgt_len = _padded(table.column("tgt"), max_tgt_len, f"{dir_}/tgt", least=0 if v3 else 1)
    for name, ids in (("src", src), ("tgt", tgt)):
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise DataError(f"{dir_}/{name}: token ids outside the vocabulary of {vocab_size}")
    prompts = replies = columns = None
    if v3:
        conversational = manifest.get("prompt_format") == "conversational"
        prompts = [json.loads(p) if conversational else p for p in table.column("prompt").to_pylist()]
        replies = table.column("reply").to_pylist()
        kinds = manifest.get("columns") or {}
        columns = {}
        for name in table.column_names:
            if name.startswith(EXTRA_PREFIX):
                key = name[len(EXTRA_PREFIX):]
                values = table.column(name).to_pylist()
                columns[key] = ([None if v is None else json.loads(v) for v in values] if kinds.get(key) == "json"
                                else values)
    return DialogueSplit(
        src=src,
        src_len=src_len,
        tgt=tgt,
        tgt_len=tgt_len,
        group=table.column("group").to_numpy().astype(np.int64),
        src_text=table.column("src_text").to_pylist(),
        tgt_text=table.column("tgt_text").to_pylist(),
        conv_id=table.column("conv_id").to_pylist(),
        prompts=prompts,
        replies=replies,
        columns=columns,
    )


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise DataError(f"{path.parent}: not a prepared dialogue dataset (missing {path.name})")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a JSON object")
    return obj


@dataclass
class DialogueData:
    vocab: Vocab
    tokenizer: dict  # tokenize() keyword arguments: {"kind": "words", "lowercase": True}
    max_src_len: int
    max_tgt_len: int
    manifest: dict
    splits: dict[str, DialogueSplit]

    @classmethod
    def load(cls, path: str | os.PathLike) -> DialogueData:
        path = Path(path).expanduser()
        if not path.is_dir():
            raise DataError(f"{path}: no such directory")
        spec = _read_json(path / "vocab.json")
        manifest = _read_json(path / "manifest.json")
        version = manifest.get("format_version")
        if version in LEAKY_VERSIONS:
            command = prepare_command(manifest.get("source", "SOURCE"), path, manifest.get("options") or {})
            raise DataError(
                f"{path / 'manifest.json'}: format_version {version!r} was prepared by an older rayseq whose "
                f"valid and test splits may contain training inputs (held-out scores would partly measure "
                f"recall of training replies); re-prepare it ({FORMAT_VERSION!r}) with: {command}"
            )
        if version not in READABLE_VERSIONS:
            raise DataError(f"{path / 'manifest.json'}: format_version {version!r}, expected {FORMAT_VERSION!r}")
        try:
            vocab = vocab_from_spec(spec)
            tokenizer = dict(spec["tokenizer"])
            max_src_len, max_tgt_len = int(spec["max_src_len"]), int(spec["max_tgt_len"])
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"{path / 'vocab.json'}: bad vocabulary file ({e})") from None
        splits = {}
        for s in SPLITS:
            if not (path / s).is_dir():
                raise DataError(f"{path}: not a prepared dialogue dataset (missing {s}/)")
            splits[s] = _read_split(path / s, max_src_len, max_tgt_len, len(vocab), manifest)
        return cls(vocab, tokenizer, max_src_len, max_tgt_len, manifest, splits)

    @property
    def prompt_only_rows(self) -> int:
        """Rows without a reply, over the splits."""
        return sum(int((s.tgt_len == 0).sum()) for s in self.splits.values())

    @property
    def column_names(self) -> list[str]:
        """The source's other columns kept beside the prompts (manifest ``columns``)."""
        return list(self.manifest.get("columns") or {})

    @property
    def conversational(self) -> bool:
        """Whether the prompts are lists of {role, content} messages."""
        return self.manifest.get("prompt_format") == "conversational"

    def encode(self, text: str) -> np.ndarray:
        """A prompt's input ids, as ``encode_text`` with this dataset's settings."""
        return encode_text(text, self.vocab, self.tokenizer, self.max_src_len)
