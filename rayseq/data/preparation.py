"""Dialogue corpora -> Parquet shards + vocabulary + split manifest, for the chit-chat chatbot.

The chit-chat experiment of Tuan et al. (2018, "Proximal Policy Optimization and its Dynamic Version
for Sequence Generation") rewards a reply with BLEU-2 against *all* replies to the same input
(one-to-many). So the pipeline

1. turns every conversation into (context -> reply) pairs (context = the previous ``context_turns``
   utterances, joined by a space), or reads the pairs themselves (jsonl, tsv);
2. tokenises with ``rayseq.data.text.tokenize`` (settings stored in ``vocab.json`` so that serving
   re-tokenises identically), keeps the LAST ``max_src_len`` input tokens (the end of the context
   matters), drops (or truncates) replies over ``max_tgt_len`` tokens, drops empty ones;
3. splits by CONVERSATION (no dialogue in two splits) with a seeded permutation of the sorted ids, so
   the split depends only on the seed and the set of conversations, not on the length options;
4. builds the vocabulary from the train split only: ``--tokenizer words`` (the default) its ``vocab_size`` most
   frequent words (ties alphabetical), the rest <unk>; ``--tokenizer bpe`` a byte-pair encoding of at most
   ``vocab_size`` pieces learned on those words (:mod:`rayseq.data.subword`), with which no training word is
   <unk>. The length caps count words in both cases (the same pairs are kept); a bpe dataset's ``vocab.json``
   stores the longest encoded input and reply in pieces;
5. drops from valid and test every pair whose ENCODED input (ids after tokenisation, truncation to
   ``max_src_len`` and vocabulary lookup, so unknown words are <unk>) is also a training input: the
   conversation split alone leaves "hi" or "how are you ?" of other conversations in all three splits
   (format v1 on chitchat: 221 of 3,394 test inputs were training inputs), so a held-out score
   partly measured recall of training replies. Comparing ids drops every verbatim repeat and also inputs the
   model cannot tell apart from a training one. ``manifest.json`` counts the drop per held-out split,
   ``counts[split]["dropped_seen_in_train"] = {"pairs", "inputs"}`` (inputs: distinct encoded ones), and
   re-checks the result by text, ``counts[split]["inputs_seen_in_train"]`` (0);
6. groups the pairs of a split whose encoded input is identical: a group's replies are the
   references of its input (within one split, so nothing leaks between splits);
7. writes ``vocab.json``, ``manifest.json`` and ``{train,valid,test}/part-%05d.parquet`` into a temp dir
   next to the output, then renames it into place (nothing half-written survives a failure).

Sources (``SOURCE`` of ``python -m rayseq.data prepare``):

- ``chitchat``: the Chit-Chat Challenge corpus (BYU PCC, pip package ``chitchat-dataset``; 7,168
  conversations whose turns already group consecutive messages of one sender);
- ``chatterbot``: the YAML conversations of ``chatterbot-corpus`` (one language);
- ``opensubtitles:PATH``: OPUS monolingual plain text (https://opus.nlpl.eu/OpenSubtitles), one
  utterance a line, blank lines end a conversation; ``.gz`` works too;
- ``cornell:DIR``: Cornell Movie-Dialogs (Danescu-Niculescu-Mizil & Lee, 2011), ``movie_lines.txt``
  and ``movie_conversations.txt``;
- ``jsonl:PATH`` (``{"prompt", "reply", "conv_id"?, ...}`` a line), ``parquet:PATH``, ``csv:PATH`` (a header
  row; types inferred by pyarrow) and ``hf:DIR`` (a ``datasets.Dataset.save_to_disk`` folder, every split of a
  ``DatasetDict`` in order; needs ``datasets``, the ``peers`` extra): rows with a prompt column (``prompt``, or
  ``input``; ``--prompt-column``) and a reply column (``reply``, or ``completion`` as TRL names it;
  ``--reply-column``), and ``tsv:PATH`` (prompt, reply, conv id?). Several rows with the same prompt are its
  references. A row without a conversation id belongs to the conversation of its prompt
  (:func:`prompt_conversation`), so the split keeps every reply to a prompt together.

  Data as TRL users have it: a row without a reply (the column absent, or null) is a prompt-only row, which RL
  trains on and MLE cannot (it samples only rows with a reply); a prompt may be a conversation, a list of
  ``{"role", "content"}`` messages (the word tokenizer reads their contents joined by a space; ``model.arch=hf``
  renders them with the tokenizer's chat template, :mod:`rayseq.data.hf_text`), and a reply given as such a list
  is the text of its messages. **Every other column is kept**: written beside the prompts as
  ``extra.<name>`` Parquet columns (Arrow types inferred over the whole file; a column whose values have no common
  type is kept as JSON text), listed in ``manifest.json`` (``columns``), and given to reward functions per row
  (TRL's keyword protocol, :mod:`rayseq.rewards.reward`). Each row also keeps its prompt and reply as written
  (``prompt``: the text, or the messages as JSON; ``reply``: null for a prompt-only row).

Math/data layer: numpy, pyarrow, tqdm (and PyYAML for chatterbot); never Ray.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import shlex
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from rayseq.data.errors import DataError
from rayseq.data.hf_files import context_length, load_tokenizer
from rayseq.data.subword import BPEVocab, train_bpe
from rayseq.data.text import tokenize
from rayseq.vocab import SPECIAL_TOKENS, Vocab

# v2: valid/test hold no training input (v1 held-out splits did; DialogueData.load refuses v1)
# v3: prompts and replies as written, prompt-only rows (an empty tgt), the source's other columns (extra.<name>)
FORMAT_VERSION = "rayseq-dialogue-v3"
EXTRA_PREFIX = "extra."  # the Parquet name of a kept column of the source
SPLITS = ("train", "valid", "test")
HELD_OUT = ("valid", "test")
TOKENIZER = {"kind": "words", "lowercase": True}
TOKENIZERS = ("words", "bpe")  # --tokenizer: word-level vocabulary, or subword pieces of the words
SOURCES = ("chitchat", "chatterbot", "opensubtitles:PATH", "cornell:DIR", "jsonl:PATH", "parquet:PATH", "csv:PATH",
           "hf:DIR", "tsv:PATH")
PROMPT_COLUMNS = ("prompt", "input")  # the prompt column's names (one of them), unless --prompt-column
REPLY_COLUMNS = ("reply", "completion")  # the reply column's names (TRL's "completion"), unless --reply-column
SCHEMA = pa.schema(
    [
        ("conv_id", pa.string()),
        ("group", pa.int64()),
        ("src", pa.list_(pa.int32())),  # input token ids, no bos/eos
        ("tgt", pa.list_(pa.int32())),  # reply token ids, no bos/eos
        ("src_text", pa.string()),  # the (truncated) tokenised input joined by spaces
        ("tgt_text", pa.string()),
        ("prompt", pa.string()),  # the prompt as written: its text, or its messages as JSON (prompt_format)
        ("reply", pa.string()),  # the reply as written; null for a prompt-only row
    ]
)
_CORNELL_SEP = " +++$+++ "


@dataclass(frozen=True)
class PrepareOptions:
    """Options of ``prepare`` (the CLI flags, ``--max-src-len`` for ``max_src_len``)."""

    context_turns: int = 1
    """previous utterances joined (by a space) into the input of a turn-based source"""
    language: str = "english"
    """chatterbot: the corpus language (a folder under ``chatterbot_corpus/data``)"""
    max_conv_turns: int = 0
    """cut turn-based conversations into blocks of at most this many turns (0: never); needed to split
    an OpenSubtitles file that has no blank lines (it would otherwise be one conversation)"""
    max_src_len: int = 20
    """input length in tokens: longer inputs keep their LAST tokens"""
    max_tgt_len: int = 20
    """reply length in tokens: longer replies are dropped (or truncated, ``truncate_replies``)"""
    truncate_replies: bool = False
    """keep the first ``max_tgt_len`` tokens of a long reply instead of dropping the pair"""
    tokenizer: str = "words"
    """vocabulary: ``words`` (the most frequent words, others <unk>) or ``bpe`` (subword pieces learned on the
    training split: no training word is <unk>, :mod:`rayseq.data.subword`)"""
    vocab_size: int = 4000
    """vocabulary cap (words, or bpe pieces), including the 4 special tokens <pad> <bos> <eos> <unk>"""
    min_count: int = 1
    """train-split occurrences a token needs to enter the vocabulary"""
    seed: int = 0
    """seed of the conversation-level split"""
    valid_frac: float = 0.05
    """fraction of conversations in valid (at least 1 when there are >= 3 conversations)"""
    test_frac: float = 0.05
    """fraction of conversations in test (at least 1 when there are >= 3 conversations)"""
    shard_size: int = 100_000
    """rows per Parquet file"""
    prompt_column: str | None = None
    """the prompt column of jsonl/parquet/csv/hf rows (default: ``prompt``, or ``input``)"""
    reply_column: str | None = None
    """the reply column of jsonl/parquet/csv/hf rows (default: ``reply``, or ``completion``)"""
    fit_model: str | None = None
    """a local Hugging Face model folder the data is for (``model.arch=hf model.path=DIR``): replies are measured in
    its tokenizer too, and one that leaves less than half of the model's positions for its prompt is dropped
    (:func:`fit_to_model`), so that a run with that model never refuses the data"""
    overwrite: bool = False
    """replace a non-empty output directory (atomically)"""
    quiet: bool = False
    """no progress bars"""

    def __post_init__(self):
        for name in ("context_turns", "max_src_len", "max_tgt_len", "min_count", "shard_size"):
            if getattr(self, name) < 1:
                raise DataError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.max_conv_turns != 0 and self.max_conv_turns < 2:
            raise DataError(f"max_conv_turns must be 0 (never cut) or >= 2 (got {self.max_conv_turns})")
        if self.tokenizer not in TOKENIZERS:
            raise DataError(f"tokenizer must be one of {', '.join(TOKENIZERS)} (got {self.tokenizer!r})")
        if self.vocab_size <= len(SPECIAL_TOKENS):
            raise DataError(f"vocab_size must be > {len(SPECIAL_TOKENS)} (the special tokens; got {self.vocab_size})")
        for name in ("valid_frac", "test_frac"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise DataError(f"{name} must be in [0, 1) (got {getattr(self, name)})")
        if self.valid_frac + self.test_frac >= 1.0:
            raise DataError("valid_frac + test_frac must be < 1 (train needs conversations)")


class RawPair(NamedTuple):
    conv_id: str
    input: str  # the prompt's text (a conversation's: its messages' contents joined by a space)
    reply: str | None  # None: a prompt-only row
    messages: list[dict] | None = None  # a conversational prompt as written ({role, content} dicts)
    columns: dict | None = None  # the source's other columns of this row


class Pair(NamedTuple):
    conv_id: str
    src: list[str]  # tokens, truncated to max_src_len (last ones kept)
    tgt: list[str]  # tokens, at most max_tgt_len; empty for a prompt-only row
    raw: RawPair | None = None  # the row as read (its prompt and reply as written, its other columns)


# ----------------------------------------------------------------------------------------- reading


def _progress(it, quiet: bool, desc: str, **kw):
    # disable=None: no bar where stderr is not a terminal (a log, CI, `2> file`), where its carriage-return updates
    # would pile up and the last fragment would sit in front of an error line
    return tqdm(it, desc=desc, disable=True if quiet else None, leave=False, dynamic_ncols=True, **kw)


def _require(path: Path, kind: str = "file") -> Path:
    ok = path.is_dir() if kind == "directory" else path.is_file()
    if not ok:
        raise DataError(f"{path}: no such {kind}")
    return path


def read_lines(path: Path, encoding: str = "utf-8") -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline); ``.gz`` files are decompressed. A line that
    does not decode, or a damaged gzip stream, is a DataError naming the file and the line."""
    _require(path)
    opener = gzip.open if path.suffix == ".gz" else open
    lineno = 0
    try:
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    line = raw.decode(encoding)
                except UnicodeDecodeError as e:
                    raise DataError(
                        f"{path}:{lineno}: cannot decode as {encoding} ({e.reason} at byte {e.start})"
                    ) from None
                if lineno == 1:
                    line = line.removeprefix("\ufeff")
                yield lineno, line.rstrip("\r\n")
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError; a truncated .gz an EOFError
        raise DataError(f"{path}:{lineno + 1}: cannot read ({e})") from None


def merge_speakers(turns: Iterable[tuple[str, str]]) -> list[str]:
    """Utterances of (speaker, text) in order -> one text per turn, consecutive texts of the same
    speaker joined by a space."""
    out: list[str] = []
    prev = None
    for speaker, text in turns:
        if out and speaker == prev:
            out[-1] = f"{out[-1]} {text}"
        else:
            out.append(text)
        prev = speaker
    return out


def turns_to_pairs(conv_id: str, turns: list[str], context_turns: int = 1, max_conv_turns: int = 0) -> list[RawPair]:
    """Consecutive turns -> (the previous ``context_turns`` turns joined by a space -> turn). With
    ``max_conv_turns`` a long conversation is cut into blocks ``conv_id#k`` first."""
    if max_conv_turns and len(turns) > max_conv_turns:
        starts = range(0, len(turns), max_conv_turns)
        blocks = [(f"{conv_id}#{k}", turns[i : i + max_conv_turns]) for k, i in enumerate(starts)]
    else:
        blocks = [(conv_id, turns)]
    return [
        RawPair(cid, " ".join(block[max(0, i - context_turns) : i]), block[i])
        for cid, block in blocks
        for i in range(1, len(block))
    ]


def load_chitchat(opts: PrepareOptions) -> tuple[list[RawPair], list[Path]]:
    try:
        import chitchat_dataset
    except ImportError:
        raise DataError("source 'chitchat' needs the chitchat-dataset package: pip install chitchat-dataset") from None
    path = Path(chitchat_dataset.__file__).with_name("dataset.json")
    try:
        data = json.loads(_require(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: not a JSON file ({e})") from None
    pairs: list[RawPair] = []
    for conv_id, conv in _progress(data.items(), opts.quiet, "chitchat", unit="conv"):
        try:
            # messages: one list per turn, each a list of {"text", "sender", "timestamp"} of one sender
            turns = merge_speakers((m[0]["sender"], " ".join(u["text"] for u in m)) for m in conv["messages"] if m)
        except (KeyError, TypeError, IndexError) as e:
            raise DataError(f"{path}: conversation {conv_id}: unexpected structure ({e!r})") from None
        pairs += turns_to_pairs(conv_id, turns, opts.context_turns, opts.max_conv_turns)
    return pairs, [path]


def load_chatterbot(opts: PrepareOptions) -> tuple[list[RawPair], list[Path], int]:
    """Pairs, files, and the number of malformed entries skipped (the corpus has one: a string
    where trivia.yml expects a list)."""
    try:
        import chatterbot_corpus
    except ImportError:
        raise DataError(
            "source 'chatterbot' needs the chatterbot-corpus package: "
            'pip install chatterbot-corpus (or pip install -e ".[chatterbot]")'
        ) from None
    import yaml

    root = Path(chatterbot_corpus.__file__).parent / "data"
    lang_dir = root / opts.language
    if not lang_dir.is_dir():
        known = ", ".join(sorted(p.name for p in root.iterdir() if p.is_dir()))
        raise DataError(f"chatterbot corpus has no language {opts.language!r} (known: {known})")
    files = sorted(lang_dir.glob("*.yml"))
    pairs: list[RawPair] = []
    skipped = 0
    for path in _progress(files, opts.quiet, "chatterbot", unit="file"):
        try:
            # BaseLoader: every scalar stays a string ("Yes" is not turned into True)
            doc = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: cannot decode as utf-8 ({e.reason} at byte {e.start})") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            raise DataError(f"{where}: bad YAML ({getattr(e, 'problem', e)})") from None
        convs = doc.get("conversations") if isinstance(doc, dict) else None
        if not isinstance(convs, list):
            raise DataError(f"{path}: no 'conversations' list")
        for k, conv in enumerate(convs):
            if not isinstance(conv, list) or not all(isinstance(t, str) for t in conv):
                skipped += 1
                continue
            pairs += turns_to_pairs(f"{path.stem}:{k}", conv, opts.context_turns, opts.max_conv_turns)
    return pairs, files, skipped


def load_opensubtitles(path: Path, opts: PrepareOptions) -> list[RawPair]:
    pairs: list[RawPair] = []
    turns: list[str] = []
    start = 1

    def flush():
        pairs.extend(turns_to_pairs(f"{path.name}:{start}", turns, opts.context_turns, opts.max_conv_turns))
        turns.clear()

    for lineno, line in _progress(read_lines(path), opts.quiet, path.name, unit="line"):
        if not line.strip():  # a blank line ends the conversation
            flush()
            start = lineno + 1
        else:
            turns.append(line)
    flush()
    return pairs


def load_cornell(root: Path, opts: PrepareOptions) -> tuple[list[RawPair], list[Path]]:
    _require(root, "directory")
    lines_path, convs_path = root / "movie_lines.txt", root / "movie_conversations.txt"
    lines: dict[str, tuple[str, str]] = {}  # line id -> (character id, text)
    for lineno, line in _progress(read_lines(lines_path, "iso-8859-1"), opts.quiet, lines_path.name, unit="line"):
        if not line.strip():
            continue
        # the space added keeps the 5th field when an empty text lost its trailing space
        fields = (line + " ").split(_CORNELL_SEP)
        if len(fields) != 5:
            raise DataError(
                f"{lines_path}:{lineno}: expected 5 fields separated by '{_CORNELL_SEP.strip()}', got {len(fields)}"
            )
        lines[fields[0].strip()] = (fields[1].strip(), fields[4].strip())
    pairs: list[RawPair] = []
    for lineno, line in _progress(read_lines(convs_path, "iso-8859-1"), opts.quiet, convs_path.name, unit="conv"):
        if not line.strip():
            continue
        fields = line.split(_CORNELL_SEP)
        if len(fields) != 4:
            raise DataError(
                f"{convs_path}:{lineno}: expected 4 fields separated by '{_CORNELL_SEP.strip()}', got {len(fields)}"
            )
        try:
            ids = ast.literal_eval(fields[3].strip())
        except (ValueError, SyntaxError):
            ids = None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise DataError(f"{convs_path}:{lineno}: expected a list of line ids like ['L194', 'L195']")
        unknown = [i for i in ids if i not in lines]
        if unknown:
            raise DataError(f"{convs_path}:{lineno}: unknown line id {unknown[0]!r} (not in {lines_path.name})")
        turns = merge_speakers(lines[i] for i in ids)
        pairs += turns_to_pairs(f"{fields[2].strip()}:{lineno}", turns, opts.context_turns, opts.max_conv_turns)
    return pairs, [lines_path, convs_path]


def _jsonl_records(path: Path, opts: PrepareOptions) -> Iterator[tuple[str, dict]]:
    for lineno, line in _progress(read_lines(path), opts.quiet, path.name, unit="line"):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: bad JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        yield where, obj


def _table_records(table: pa.Table, name: str, opts: PrepareOptions) -> Iterator[tuple[str, dict]]:
    for i, obj in enumerate(_progress(table.to_pylist(), opts.quiet, name, unit="row")):
        yield f"{name}: row {i + 1}", obj


def _read_table(kind: str, path: Path) -> pa.Table:
    """The rows of a ``parquet:``, ``csv:`` or ``hf:`` source as one Arrow table."""
    try:
        if kind == "parquet":
            return pq.read_table(_require(path))
        if kind == "csv":
            import pyarrow.csv as pa_csv

            return pa_csv.read_csv(_require(path))
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: cannot read as {kind} ({e})") from None
    try:
        import datasets
    except ImportError:
        raise DataError("source hf:DIR needs the datasets package: pip install datasets (or pip install -e "
                        '".[peers]")') from None
    _require(path, "directory")
    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, OSError, ValueError) as e:
        raise DataError(f"{path}: not a datasets.save_to_disk folder ({e})") from None
    parts = list(ds.values()) if isinstance(ds, datasets.DatasetDict) else [ds]  # every split, in order
    return pa.concat_tables([p.with_format("arrow")[:] for p in parts], promote_options="default")


def _text_of_messages(value, where: str, field: str) -> list[dict]:
    """``value`` checked to be a list of {"role", "content"} messages with string contents."""
    if not value or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"),
                                                                                                  str) for m in value):
        raise DataError(f"{where}: field {field!r} must be a string or a list of {{role, content}} messages with "
                        "string contents")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _column(obj: dict, where: str, given: str | None, names: tuple[str, ...], required: bool) -> str | None:
    """The name of the row's prompt (or reply) column: ``given``, or the one of ``names`` it has."""
    if given is not None:
        if required and given not in obj:
            raise DataError(f"{where}: missing field {given!r} (--prompt-column)")
        return given
    present = [n for n in names if n in obj]
    if len(present) > 1:
        raise DataError(f"{where}: both {present[0]!r} and {present[1]!r} (they name the same field; keep one)")
    if not present and required:
        raise DataError(f"{where}: missing field {names[0]!r}" + "".join(f" (or {n!r})" for n in names[1:]))
    return present[0] if present else None


def records_to_pairs(records: Iterable[tuple[str, dict]], opts: PrepareOptions) -> list[RawPair]:
    """Rows ``(where, {column: value})`` -> pairs (module docstring: the prompt and reply columns, prompt-only rows,
    conversations, every other column kept); DataError naming the row for a bad one."""
    pairs: list[RawPair] = []
    conversational = None  # whether the prompts are conversations: the first row says, the others must agree
    for where, obj in records:
        name = _column(obj, where, opts.prompt_column, PROMPT_COLUMNS, required=True)
        reply_name = _column(obj, where, opts.reply_column, REPLY_COLUMNS, required=False)
        prompt, messages = obj[name], None
        if isinstance(prompt, list):
            messages = _text_of_messages(prompt, where, name)
            prompt = " ".join(m["content"] for m in messages)
        elif not isinstance(prompt, str):
            raise DataError(f"{where}: field {name!r} must be a string or a list of {{role, content}} messages, got "
                            f"{type(prompt).__name__}")
        if conversational is None:
            conversational = messages is not None
        elif conversational != (messages is not None):
            raise DataError(f"{where}: field {name!r} is {'a conversation' if messages else 'text'}, earlier rows' "
                            f"{'are text' if messages else 'are conversations'}; give every prompt the same way")
        reply = obj.get(reply_name) if reply_name else None
        if isinstance(reply, list):  # TRL's conversational completion: [{"role": "assistant", "content": ...}]
            reply = " ".join(m["content"] for m in _text_of_messages(reply, where, reply_name))
        elif reply is not None and not isinstance(reply, str):
            raise DataError(f"{where}: field {reply_name!r} must be a string, got {type(reply).__name__}")
        conv_id = obj.get("conv_id")
        if conv_id is None:
            conv_id = prompt_conversation(prompt, opts)
        elif isinstance(conv_id, (str, int)) and not isinstance(conv_id, bool):
            conv_id = str(conv_id)
        else:
            raise DataError(f"{where}: field 'conv_id' must be a string or an integer, got {type(conv_id).__name__}")
        columns = {k: v for k, v in obj.items() if k not in (name, reply_name, "conv_id")}
        pairs.append(RawPair(conv_id, prompt, reply, messages, columns or None))
    return pairs


def load_jsonl(path: Path, opts: PrepareOptions) -> list[RawPair]:
    return records_to_pairs(_jsonl_records(path, opts), opts)


def prompt_conversation(prompt: str, opts: PrepareOptions) -> str:
    """The conversation id of a pair given without one: its prompt as the model will see it (tokenised, the last
    ``max_src_len`` tokens). So every reply to one prompt lands in the same split: train keeps all the references
    of its prompts, and valid/test get whole prompts (a prompt whose rows were scattered over the splits would be
    dropped from valid/test as a training input, which empties them on a file where every prompt has several
    replies)."""
    return "prompt:" + " ".join(tokenize(prompt, **TOKENIZER)[-opts.max_src_len :])


def load_tsv(path: Path, opts: PrepareOptions) -> list[RawPair]:
    pairs: list[RawPair] = []
    for lineno, line in _progress(read_lines(path), opts.quiet, path.name, unit="line"):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) == 1:
            raise DataError(f"{path}:{lineno}: no tab (expected input<TAB>reply[<TAB>conv_id])")
        if len(fields) > 3:
            raise DataError(f"{path}:{lineno}: {len(fields)} tab-separated fields (expected 2 or 3)")
        conv_id = fields[2].strip() if len(fields) == 3 and fields[2].strip() else prompt_conversation(fields[0], opts)
        pairs.append(RawPair(conv_id, fields[0], fields[1]))
    return pairs


def load_source(source: str, opts: PrepareOptions) -> tuple[list[RawPair], list[Path], int]:
    """(pairs in conversation order, the input files, malformed entries skipped) of a SOURCE spec."""
    kind, sep, arg = source.partition(":")
    if kind in ("chitchat", "chatterbot") and not sep:
        if kind == "chitchat":
            return (*load_chitchat(opts), 0)
        return load_chatterbot(opts)
    loaders = {"opensubtitles": load_opensubtitles, "jsonl": load_jsonl, "tsv": load_tsv}
    if sep and arg and kind in loaders:
        path = Path(arg).expanduser()
        return loaders[kind](path, opts), [path], 0
    if sep and arg and kind in ("parquet", "csv", "hf"):
        path = Path(arg).expanduser()
        table = _read_table(kind, path)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        return records_to_pairs(_table_records(table, path.name, opts), opts), files, 0
    if sep and arg and kind == "cornell":
        return (*load_cornell(Path(arg).expanduser(), opts), 0)
    raise DataError(f"unknown source {source!r} (known: {', '.join(SOURCES)})")


# ------------------------------------------------------------------------------------- processing


def tokenize_pairs(raw: list[RawPair], opts: PrepareOptions) -> tuple[list[Pair], dict, dict]:
    """Tokenised pairs within the length caps, ``dropped`` and ``truncated`` counts."""
    cache: dict[str, list[str]] = {}  # with context_turns = 1 every reply is the next input

    def tok(text: str) -> list[str]:
        out = cache.get(text)
        if out is None:
            out = cache[text] = tokenize(text, **TOKENIZER)
        return out

    dropped = {"empty_input": 0, "empty_reply": 0, "reply_too_long": 0}
    truncated = {"inputs": 0, "replies": 0}
    pairs: list[Pair] = []
    for p in _progress(raw, opts.quiet, "tokenise", unit="pair"):
        if p.reply is None:  # a prompt-only row: RL trains on it, MLE does not
            src = tok(p.input)
            if not src:
                dropped["empty_input"] += 1
                continue
            if len(src) > opts.max_src_len:
                truncated["inputs"] += 1
            pairs.append(Pair(p.conv_id, src[-opts.max_src_len :], [], p))
            continue
        src, tgt = tok(p.input), tok(p.reply)
        if not src:
            dropped["empty_input"] += 1
            continue
        if not tgt:
            dropped["empty_reply"] += 1
            continue
        if len(tgt) > opts.max_tgt_len:
            if not opts.truncate_replies:
                dropped["reply_too_long"] += 1
                continue
            truncated["replies"] += 1
            tgt = tgt[: opts.max_tgt_len]
        if len(src) > opts.max_src_len:
            truncated["inputs"] += 1
            src = src[-opts.max_src_len :]  # the end of the context matters most
        pairs.append(Pair(p.conv_id, src, tgt, p))
    return pairs, dropped, truncated


def model_reply_cap(path: str) -> tuple[object, int, int]:
    """(tokenizer, positions, the longest reply in its tokens) of the model folder ``path`` for ``--fit-model``: a
    reply, its end token and the separator take at most half of the positions, the prompt the rest (the run keeps
    a longer prompt's last tokens). DataError when the folder names no positions (a tokenizer alone)."""
    tokenizer = load_tokenizer(path)
    positions = context_length(path)
    if positions is None:
        raise DataError(f"--fit-model {path}: its config.json names no positions (max_position_embeddings, "
                        "n_positions or n_ctx); give the model's folder, or prepare without --fit-model")
    cap = positions // 2 - 2
    if cap < 1:
        raise DataError(f"--fit-model {path}: {positions} positions leave no room for a reply")
    return tokenizer, positions, cap


def fit_to_model(pairs: list[Pair], opts: PrepareOptions, tokenizer, positions: int, cap: int
                 ) -> tuple[list[Pair], int, dict]:
    """``pairs`` without those whose reply (as written: what a run with the model encodes) is longer than ``cap`` of
    ``tokenizer``'s tokens; the count dropped; and what the manifest records (``fit_model``). A prompt-only dataset's
    replies are sampled up to ``max_tgt_len`` of the model's tokens, which must leave room for a prompt."""
    replies = [i for i, p in enumerate(pairs) if p.tgt]
    record = {"path": str(Path(opts.fit_model).expanduser().resolve()), "positions": positions,
              "max_reply_tokens": cap}
    if not replies:
        if opts.max_tgt_len + 2 >= positions:
            raise DataError(f"--max-tgt-len {opts.max_tgt_len}: completions of that many tokens leave no room for a "
                            f"prompt in the {positions} positions of {opts.fit_model}; give at most {cap}")
        return pairs, 0, {**record, "max_reply_tokens": opts.max_tgt_len}
    texts = [pairs[i].raw.reply if pairs[i].raw is not None else " ".join(pairs[i].tgt) for i in replies]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    too_long = {i for i, n in zip(replies, lengths) if n > cap}
    return [p for i, p in enumerate(pairs) if i not in too_long], len(too_long), record


def split_sizes(n: int, valid_frac: float, test_frac: float) -> tuple[int, int]:
    """(valid, test) conversation counts: round(n * frac), at least 1 when frac > 0 and n >= 3,
    leaving train at least one conversation."""
    sizes = []
    for frac in (valid_frac, test_frac):
        k = round(n * frac)
        sizes.append(max(k, 1) if frac > 0 and n >= 3 else k)
    n_valid, n_test = sizes
    n_test = min(n_test, max(n - 1, 0))
    n_valid = min(n_valid, max(n - 1 - n_test, 0))
    return n_valid, n_test


def split_conversations(conv_ids: Iterable[str], seed: int, valid_frac: float, test_frac: float) -> dict[str, str]:
    """conv id -> split name. A seeded permutation of the SORTED unique ids: the same seed and the
    same set of conversations give the same split, whatever the loading order."""
    ids = sorted(set(conv_ids))
    n_valid, n_test = split_sizes(len(ids), valid_frac, test_frac)
    perm = np.random.default_rng(seed).permutation(len(ids))
    names = np.full(len(ids), "train", dtype=object)
    names[perm[:n_test]] = "test"
    names[perm[n_test : n_test + n_valid]] = "valid"
    return dict(zip(ids, names.tolist()))


def build_vocab(token_lists: Iterable[list[str]], vocab_size: int, min_count: int = 1) -> tuple[Vocab, Counter]:
    """Most frequent first, ties alphabetical; at most ``vocab_size`` ids with the specials."""
    counts: Counter = Counter()
    for toks in token_lists:
        counts.update(toks)
    ranked = sorted(
        (t for t, c in counts.items() if c >= min_count and t not in SPECIAL_TOKENS), key=lambda t: (-counts[t], t)
    )
    return Vocab(ranked[: vocab_size - len(SPECIAL_TOKENS)]), counts


def piece_caps(opts: PrepareOptions) -> tuple[int, int]:
    """(input, reply) caps in bpe pieces: 1.5 × the word caps (a word is 1.1 pieces on average; a word of 100 letters
    typed as a joke would otherwise set every reply's length cap)."""
    return opts.max_src_len * 3 // 2, opts.max_tgt_len * 3 // 2


def cap_pieces(by_split: dict[str, list[Pair]], vocab: BPEVocab, opts: PrepareOptions
               ) -> tuple[dict[str, list[Pair]], int, int]:
    """bpe: the pairs whose reply has at most the reply cap of pieces (:func:`piece_caps`), with inputs cut to their
    last words that fit the input cap; how many pairs were dropped and inputs cut. Encodes every text once
    (remembered by the vocabulary for what follows)."""
    src_cap, tgt_cap = piece_caps(opts)
    out, n_dropped, n_cut = {}, 0, 0
    for s, pairs in by_split.items():
        vocab.encode_many([p.src for p in pairs] + [p.tgt for p in pairs])
        kept = []
        for p in pairs:
            src = p.src
            while len(src) > 1 and len(vocab.encode_words(src)) > src_cap:
                src = src[1:]  # the end of the context matters most
            if len(vocab.encode_words(p.tgt)) > tgt_cap or len(vocab.encode_words(src)) > src_cap:
                n_dropped += 1  # a reply too long, or an input whose last word alone is
                continue
            n_cut += src is not p.src
            kept.append(p._replace(src=src))
        out[s] = kept
    return out, n_dropped, n_cut


def encode_input(src: list[str], vocab: Vocab) -> tuple[int, ...]:
    """An input's ids as the model sees them (unknown words -> <unk>): the key of grouping and of the drop."""
    if isinstance(vocab, BPEVocab):
        return tuple(vocab.encode_words(src).tolist())
    stoi, unk = vocab.stoi, vocab.specials.unk
    return tuple(stoi.get(t, unk) for t in src)


def drop_seen_inputs(pairs: list[Pair], vocab: Vocab, seen: set[tuple[int, ...]]) -> tuple[list[Pair], dict]:
    """The pairs whose encoded input is not in ``seen`` (the training inputs), in order, and what was
    dropped: ``{"pairs": rows, "inputs": distinct encoded inputs}``. By ids, not text: an input the
    model cannot tell apart from a training input (same words up to <unk>) is not held out either."""
    kept: list[Pair] = []
    dropped: Counter = Counter()
    for p in pairs:
        key = encode_input(p.src, vocab)
        if key in seen:
            dropped[key] += 1
        else:
            kept.append(p)
    return kept, {"pairs": sum(dropped.values()), "inputs": len(dropped)}


def prepare_command(source: str, out: str | os.PathLike, options: dict) -> str:
    """The ``python -m rayseq.data prepare`` command line that re-creates a dataset from the
    ``source`` and ``options`` of its manifest (non-default options only), replacing ``out``."""
    defaults = asdict(PrepareOptions())
    args = ["python", "-m", "rayseq.data", "prepare", source, "--out", str(out)]
    for name, value in options.items():
        # an option this rayseq no longer has cannot be passed; defaults need not be
        if name not in defaults or name in ("overwrite", "quiet") or value == defaults[name]:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(defaults[name], bool):
            args += [flag] if value else []
        else:
            args += [flag, str(value)]
    return shlex.join([*args, "--overwrite"])


def _list_array(seqs: Sequence[Sequence[int]]) -> pa.ListArray:
    lens = np.fromiter((len(s) for s in seqs), dtype=np.int32, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    values = np.fromiter((i for s in seqs for i in s), dtype=np.int32, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def column_types(pairs: list[Pair]) -> dict[str, pa.DataType | None]:
    """The kept columns of the source (in order of first appearance) -> their Arrow type over every row, or None when
    the values have no common type (they are written as JSON text)."""
    names: dict[str, None] = {}
    for p in pairs:
        for k in (p.raw.columns or {}) if p.raw else {}:
            names.setdefault(k)
    types = {}
    for k in names:
        try:
            types[k] = pa.array([(p.raw.columns or {}).get(k) for p in pairs]).type
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            types[k] = None
    return types


def _raw_prompt(p: Pair) -> str:
    if p.raw is None:
        return " ".join(p.src)
    return json.dumps(p.raw.messages, ensure_ascii=False) if p.raw.messages is not None else p.raw.input


def encode_split(pairs: list[Pair], vocab: Vocab, columns: dict[str, pa.DataType | None] | None = None) -> pa.Table:
    """Rows of one split with ``group`` ids: pairs whose encoded input is identical share a group
    (0..G-1 in order of first appearance); the group's replies are that input's references. ``columns``
    (:func:`column_types`) are the source's other columns, written as ``extra.<name>``."""
    if isinstance(vocab, BPEVocab):
        src = [tuple(x.tolist()) for x in vocab.encode_many([p.src for p in pairs])]
        tgt = [x.tolist() for x in vocab.encode_many([p.tgt for p in pairs])]
    else:
        stoi, unk = vocab.stoi, vocab.specials.unk
        src = [encode_input(p.src, vocab) for p in pairs]
        tgt = [[stoi.get(t, unk) for t in p.tgt] for p in pairs]
    # by ids, not text: inputs the model cannot tell apart (<unk>) must share their references
    groups: dict[tuple[int, ...], int] = {}
    group = np.fromiter((groups.setdefault(s, len(groups)) for s in src), dtype=np.int64, count=len(src))
    table = pa.Table.from_arrays(
        [
            pa.array([p.conv_id for p in pairs], pa.string()),
            pa.array(group, pa.int64()),
            _list_array(src),
            _list_array(tgt),
            pa.array([" ".join(p.src) for p in pairs], pa.string()),
            pa.array([" ".join(p.tgt) for p in pairs], pa.string()),
            pa.array([_raw_prompt(p) for p in pairs], pa.string()),
            pa.array([p.raw.reply if p.raw else " ".join(p.tgt) for p in pairs], pa.string()),
        ],
        schema=SCHEMA,
    )
    for name, type_ in (columns or {}).items():
        values = [(p.raw.columns or {}).get(name) if p.raw else None for p in pairs]
        if type_ is None:  # no common Arrow type: JSON text
            values, type_ = [None if v is None else json.dumps(v, ensure_ascii=False) for v in values], pa.string()
        table = table.append_column(EXTRA_PREFIX + name, pa.array(values, type_))
    return table


def _split_stats(table: pa.Table, unk: int) -> dict:
    n_tokens = n_unk = 0
    for col in ("src", "tgt"):
        values = table.column(col).combine_chunks().flatten().to_numpy()
        n_tokens += len(values)
        n_unk += int(np.count_nonzero(values == unk))
    return {
        "conversations": len(set(table.column("conv_id").to_pylist())),
        "pairs": table.num_rows,
        "prompt_only": int(table.column("reply").null_count),
        "groups": int(np.max(table.column("group").to_numpy())) + 1 if table.num_rows else 0,
        "unk_rate": round(n_unk / n_tokens, 6) if n_tokens else 0.0,
    }


# ---------------------------------------------------------------------------------------- writing


def _check_out(out: Path, overwrite: bool) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise DataError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise DataError(f"{out}: exists and is not empty (use --overwrite to replace it)")


def write_atomically(out: Path, overwrite: bool, write) -> None:
    """``write(tmp_dir)`` into a temp dir next to ``out``, then rename it to ``out``. With
    ``overwrite`` an existing ``out`` is renamed aside, the new one renamed in, the old one deleted.
    On any failure the temp dir is removed and ``out`` is left as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0o700
        write(tmp)
        _check_out(out, overwrite)  # again: it may have appeared while we were writing
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        if not out.exists():
            os.rename(tmp, out)
            return
        old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_split(dir_: Path, table: pa.Table, shard_size: int) -> list[str]:
    dir_.mkdir()
    names = []
    for k, start in enumerate(range(0, max(table.num_rows, 1), shard_size)):  # an empty split: one empty file
        names.append(f"part-{k:05d}.parquet")
        pq.write_table(table.slice(start, shard_size), dir_ / names[-1])
    return names


def prepare(source: str, out: str | os.PathLike, opts: PrepareOptions | None = None) -> dict:
    """Prepare ``source`` into the directory ``out`` (layout in the module docstring); returns the
    manifest. Raises DataError on bad input or when ``out`` is non-empty without ``overwrite``."""
    opts = opts or PrepareOptions()
    out = Path(out).expanduser()
    _check_out(out, opts.overwrite)  # fail before the slow part
    fit = model_reply_cap(opts.fit_model) if opts.fit_model else None  # a bad folder fails before the slow part
    raw, files, malformed = load_source(source, opts)
    pairs, dropped, truncated = tokenize_pairs(raw, opts)
    if fit is not None:
        pairs, dropped["reply_too_long_for_model"], fit = fit_to_model(pairs, opts, *fit)
    if malformed:
        dropped["malformed_entries"] = malformed
    if not pairs:
        raise DataError(f"{source}: no usable pairs ({len(raw)} read, dropped: {dropped})")

    split_of = split_conversations((p.conv_id for p in raw), opts.seed, opts.valid_frac, opts.test_frac)
    by_split: dict[str, list[Pair]] = {s: [] for s in SPLITS}
    for p in pairs:
        by_split[split_of[p.conv_id]].append(p)
    train_tokens = (toks for p in by_split["train"] for toks in (p.src, p.tgt))
    if opts.tokenizer == "bpe":
        try:
            vocab = train_bpe(train_tokens, opts.vocab_size)
        except ValueError as exc:
            raise DataError(f"{source}: {exc}") from None
        by_split, dropped["too_many_pieces"], truncated["inputs_pieces"] = cap_pieces(by_split, vocab, opts)
    else:
        vocab, _ = build_vocab(train_tokens, opts.vocab_size, opts.min_count)
    # identical inputs ("hi") sit in other conversations of train: held out, they would score recall
    train_inputs = {encode_input(p.src, vocab) for p in by_split["train"]}
    dropped_seen = {}
    for s in HELD_OUT:
        by_split[s], dropped_seen[s] = drop_seen_inputs(by_split[s], vocab, train_inputs)
    columns = column_types(pairs)
    tables = {s: encode_split(by_split[s], vocab, columns) for s in SPLITS}  # groups of what is left
    counts = {s: _split_stats(tables[s], vocab.specials.unk) for s in SPLITS}
    if opts.tokenizer == "bpe" and counts["train"]["unk_rate"] > 0:  # the merges start from every training character
        raise AssertionError(f"bpe: {counts['train']['unk_rate']} of the training tokens are <unk>")
    tokenizer = {**TOKENIZER, "kind": "bpe"} if opts.tokenizer == "bpe" else dict(TOKENIZER)
    max_len = {"src": opts.max_src_len, "tgt": opts.max_tgt_len}
    if opts.tokenizer == "bpe":  # the caps count words; the model reads pieces: the longest encoded ones
        max_len = {c: max(int(pc.max(pc.list_value_length(tables[s].column(c))).as_py() or 1) for s in SPLITS)
                   for c in max_len}
    train_texts = set(tables["train"].column("src_text").to_pylist())
    for s in HELD_OUT:
        counts[s]["dropped_seen_in_train"] = dropped_seen[s]
        # re-checked on the written text (a verbatim repeat has equal ids, so this is 0 by construction)
        counts[s]["inputs_seen_in_train"] = len(set(tables[s].column("src_text").to_pylist()) & train_texts)

    manifest = {
        "format_version": FORMAT_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": source,
        "input_files": [{"path": str(f.resolve()), "bytes": f.stat().st_size} for f in files],
        "options": {k: v for k, v in asdict(opts).items() if k not in ("overwrite", "quiet")},
        "seed": opts.seed,
        "tokenizer": tokenizer,
        "prompt_format": "conversational" if any(p.raw and p.raw.messages is not None for p in pairs) else "text",
        # the source's other columns, written as extra.<name>: "arrow" (typed) or "json" (JSON text)
        "columns": {k: "json" if t is None else "arrow" for k, t in columns.items()},
        "raw_conversations": len(split_of),  # with at least one pair, before the length caps
        "raw_pairs": len(raw),
        "counts": counts,
        "dropped": dropped,
        "truncated": truncated,
        "vocab": {"size": len(vocab), "unk_rate_train": counts["train"]["unk_rate"]},
        **({"fit_model": fit} if fit is not None else {}),
        "shards": {},
    }

    def write(tmp: Path) -> None:
        for s in _progress(SPLITS, opts.quiet, "write", unit="split"):
            manifest["shards"][s] = _write_split(tmp / s, tables[s], opts.shard_size)
        _write_json(
            tmp / "vocab.json",
            {
                **vocab.to_spec(),
                "tokenizer": tokenizer,
                "max_src_len": max_len["src"],
                "max_tgt_len": max_len["tgt"],
            },
        )
        _write_json(tmp / "manifest.json", manifest)  # last: its presence means the rest is there

    write_atomically(out, opts.overwrite, write)
    return manifest
