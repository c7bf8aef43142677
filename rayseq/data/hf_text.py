"""A Hugging Face tokenizer as a task's vocabulary (``model.arch=hf``, ``task.hf_tokenizer``): its tokens replace
the prepared vocabulary end to end — the dataset's inputs and replies are re-tokenised with it
(:func:`retokenize`), rewards read replies decoded by it, serving encodes prompts and decodes replies with it.

:class:`HFVocab` has what the rest of rayseq reads of a :class:`rayseq.vocab.Vocab` (``len``, ``specials``,
``to_spec``) and the text protocol :func:`rayseq.data.dataset.encode_text` and :func:`rayseq.data.text.decode_ids`
dispatch to: ``encode_text(text, max_len)`` and ``decode_text(ids)``. Loaded with ``local_files_only=True``: never
a download at run time.

Specials: ``<pad>`` must exist and differ from the end token (rayseq pads replies after their end and gives pad
positions log-prob 0, so a pad that were also the end token would erase every reply's end); the separator between
prompt and reply (rayseq's ``bos``) is the tokenizer's BOS, or its EOS when it has none (GPT-2's
``<|endoftext|>``); ``unk`` falls back to pad (byte-level tokenizers have no unknown token).

Where the prompt ends and the reply starts is the policy's prompt format, kept in the vocabulary's spec (so a
checkpoint's server and export read it): prompts rendered by the chat template end with its generation prompt, which
is the boundary (``separator`` False: the reply follows the prompt directly, as ``apply_chat_template(...,
add_generation_prompt=True)`` then ``generate`` reads it everywhere else); plain-text prompts are followed by the
separator token (``separator`` True), which an export writes into the tokenizer as a chat template
(:func:`separator_chat_template`) so that the standard call gives the same sequence.

Prompts and replies are encoded as the dataset wrote them (format v3 keeps them; an older dataset's tokenised text
is detokenised). A conversational prompt (a list of ``{role, content}`` messages) is rendered with the tokenizer's
chat template, ``apply_chat_template(messages, add_generation_prompt=True)`` (:meth:`HFVocab.render`), and serving
renders ``/v1/chat/completions`` messages with the same template; a tokenizer without a template is an error
naming the model.

Math/data layer: numpy and transformers (imported when a vocabulary is built).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np

from rayseq.data.dataset import DialogueData, RaggedRows, places_in_rows
from rayseq.data.hf_files import load_tokenizer
from rayseq.data.preparation import DataError
from rayseq.data.text import detokenize
from rayseq.vocab import Specials, decode_tokens

log = logging.getLogger(__name__)


class HFVocab:
    """A Hugging Face tokenizer with the vocabulary interface rayseq's tasks, rewards and serving read."""

    kind = "hf"

    def __init__(self, path: str, *, separator: bool = True):
        self.path = str(path)
        self.separator = separator  # a separator token between prompt and reply (module docstring)
        self.tokenizer = tok = load_tokenizer(self.path)
        # DataError: what the command lines print as one line (the tokenizer is the run's vocabulary)
        if tok.eos_token_id is None:
            raise DataError(f"{path}: the tokenizer has no end token (eos_token); replies need one")
        if tok.pad_token_id is None or tok.pad_token_id == tok.eos_token_id:
            raise DataError(f"{path}: the tokenizer needs a pad token other than its end token {tok.eos_token!r} "
                             "(rayseq pads replies after their end); add one (tokenizer.add_special_tokens("
                             "{'pad_token': '<pad>'}), model.resize_token_embeddings(len(tokenizer))) and save both")
        bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        unk = tok.unk_token_id if tok.unk_token_id is not None else tok.pad_token_id
        self.specials = Specials(pad=tok.pad_token_id, bos=bos, eos=tok.eos_token_id, unk=unk)
        self._size = len(tok)

    def __len__(self) -> int:
        return self._size

    def encode_text(self, text: str, max_len: int) -> np.ndarray:
        """(k,) int64 ids of ``text`` without special tokens, its LAST ``max_len`` (as inputs are truncated)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return np.asarray(ids[-max_len:] if max_len > 0 else [], dtype=np.int64)

    def decode_text(self, ids) -> str:
        """The text of ``ids`` up to the first end token, special tokens left out."""
        ids = [int(i) for i in ids]
        if self.specials.eos in ids:
            ids = ids[: ids.index(self.specials.eos)]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def decode(self, ids, *, stop_at_eos: bool = True) -> list[str]:
        """Token strings (``Vocab.decode``'s shape), up to the end token; pad left out."""
        return decode_tokens(ids, self.specials, self.tokenizer.convert_ids_to_tokens, stop_at_eos=stop_at_eos)

    def to_spec(self) -> dict:
        """What a checkpoint stores: the tokenizer's directory (serving loads it from there) and, for prompts that
        mark their own end, that no separator follows them (absent: a separator, as checkpoints always had)."""
        return {"hf_tokenizer": self.path, **({} if self.separator else {"separator": False})}

    @classmethod
    def from_spec(cls, spec: dict) -> HFVocab:
        """The vocabulary of a checkpoint's spec (:meth:`to_spec`)."""
        return cls(spec["hf_tokenizer"], separator=bool(spec.get("separator", True)))

    def render(self, messages: list[dict]) -> str:
        """A conversation as the text the model reads: the chat template with the assistant's turn opened."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{self.path}: the tokenizer has no chat template, and the prompts are conversations "
                             "({role, content} lists); give it one (tokenizer.chat_template = ...; save_pretrained) "
                             "or give the prompts as text")
        return self.tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                                  add_generation_prompt=True)


def separator_chat_template(separator: str) -> str:
    """A Jinja chat template that renders what a separator policy read in training: the last message's text (the
    prompt; serving reads the same), then with ``add_generation_prompt`` the separator token ``separator``."""
    return "{{ messages[-1]['content'] }}{% if add_generation_prompt %}" + separator + "{% endif %}"


class HFJoiner:
    """Incremental decoding by token id, as :class:`rayseq.data.text.Joiner` for words: :meth:`push` a token, get the
    text it adds (the decoded reply so far minus the text before it, so the pieces concatenate to the decoded reply);
    :meth:`peek` the piece a token would add. A token that ends inside a multi-byte character adds nothing until
    the character is complete."""

    def __init__(self, vocab: HFVocab):
        self.vocab, self.ids, self.text = vocab, [], ""

    def _piece(self, tid: int) -> tuple[str, str]:
        if tid in (self.vocab.specials.eos, self.vocab.specials.pad):
            return "", self.text
        text = self.vocab.tokenizer.decode(self.ids + [tid], skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for its remaining bytes
            return "", self.text
        return (text[len(self.text):] if text.startswith(self.text) else text), text

    def push(self, tid: int) -> str:
        piece, text = self._piece(int(tid))
        self.ids.append(int(tid))
        if text.startswith(self.text):
            self.text = text
        return piece

    def peek(self, tid: int) -> str:
        return self._piece(int(tid))[0]


def retokenize(data: DialogueData, vocab: HFVocab) -> DialogueData:
    """A :class:`rayseq.data.dataset.DialogueData` with its text re-tokenised by ``vocab``: every row's input and
    reply (as written, or the prepared word tokens detokenised) encoded again; rows, groups and splits unchanged, so
    the references of an input are the same replies. The length caps become the longest encoded input and reply (a
    prompt-only dataset: its prepared ``max_tgt_len``)."""
    return _with_ids(data, vocab, _encoded_ids(data, vocab))


def retokenized(data: DialogueData, vocab: HFVocab, folder, context: int | None = None,
                where: str = "task.data") -> DialogueData:
    """:func:`retokenize` of the dataset prepared in ``folder``, kept in ``folder/retokenized/``: the first process
    on a machine (the driver, before any actor starts) encodes and writes it, every other one (each rollout worker,
    scorer and learner) reads the ids back instead of encoding every row again. One file per dataset content (its
    manifest, vocabulary and shards' sizes and times), tokenizer (its files) and tokenizers version; written whole
    (a temporary file renamed), so processes that encode at once leave one complete file. A folder it cannot write
    is encoded each time (logged once per process). ``context``: the model's positions, which the inputs are fitted to
    (:func:`fit_context`) before they are padded."""
    path = Path(folder).expanduser() / RETOKENIZED / f"{_cache_key(folder, vocab)}.npz"
    try:
        with np.load(path) as stored:
            return _with_ids(data, vocab, _fitted({k: stored[k] for k in stored.files}, context, where,
                                                  fit_command(data, vocab)))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError) as exc:  # a damaged file: encoded again, and replaced
        log.warning("%s: unreadable (%s); encoding the dataset again", path, exc)
    ids = _encoded_ids(data, vocab, context, where)
    try:
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **ids)
        os.replace(tmp, path)
    except OSError as exc:
        if str(folder) not in _UNCACHED:
            _UNCACHED.add(str(folder))
            log.info("%s: cannot keep the re-tokenised dataset there (%s); each process encodes it", folder, exc)
    return _with_ids(data, vocab, _fitted(ids, context, where, fit_command(data, vocab)))


def _fitted(ids: dict[str, np.ndarray], context: int | None, where: str, fix: str) -> dict[str, np.ndarray]:
    return ids if context is None else fit_context(ids, context, where, fix)


def fit_command(data: DialogueData, vocab: HFVocab) -> str:
    """The command that prepares ``data``'s source again for the model whose tokenizer ``vocab`` is."""
    source = data.manifest.get("source") or "SOURCE"
    return f"python -m rayseq.data prepare {source} --out DIR --fit-model {vocab.path}"


def check_room(reply_tokens: int, context: int, where: str, fix: str = "") -> None:
    """A reply of ``reply_tokens`` (the longest, or one of the longest) beside the separator and its end token must
    leave a model of ``context`` positions room for a prompt: DataError naming the lengths and ``fix`` otherwise."""
    if context - (reply_tokens + 2) < 1:
        raise DataError(f"{where}: a reply is {reply_tokens} tokens in this tokenizer, and the model reads {context} "
                        "positions, leaving no room for a prompt; prepare the data for the model: "
                        + (fix or "python -m rayseq.data prepare SOURCE --out DIR --fit-model MODEL_DIR")
                        + " (it drops the replies that do not fit)")


def fit_context(ids: dict[str, np.ndarray], context: int, where: str = "task.data", fix: str = ""
                ) -> dict[str, np.ndarray]:
    """The encoded ids of :func:`_encoded_ids` fitted to a model of ``context`` positions: an input, the separator
    and a reply with its end token are at most ``context`` tokens, so inputs keep their LAST ``context − max_tgt − 2``
    tokens (as every input is truncated); the count of inputs cut is logged. Cut while the rows are unpadded: no
    array is ever as wide as the longest input. A reply that leaves no room for an input is an error naming the
    lengths (:func:`check_room`)."""
    max_tgt = int(ids["max_tgt"])
    check_room(max_tgt, context, where, fix)
    room = context - (max_tgt + 2)  # the reply, its end token and the separator
    if int(ids["max_src"]) <= room:
        return ids
    out, cut = dict(ids, max_src=np.int64(room)), 0
    for name in [k[: -len("/src_len")] for k in ids if k.endswith("/src_len")]:
        lens = ids[f"{name}/src_len"]
        drop = np.maximum(lens - room, 0)  # each row's first tokens that go
        cut += int((drop > 0).sum())
        out[f"{name}/src_ids"] = ids[f"{name}/src_ids"][places_in_rows(lens) >= np.repeat(drop, lens)]
        out[f"{name}/src_len"] = lens - drop
    log.warning("%s: %d input(s) longer than the model's %d positions allow beside a reply of up to %d tokens keep "
                "their last %d tokens", where, cut, context, max_tgt + 1, room)
    return out


RETOKENIZED = "retokenized"  # the prepared dataset's folder of its text encoded by Hugging Face tokenizers
_UNCACHED: set[str] = set()  # folders this process could not write its encoding into (said once)
_TOKENIZER_FILES = (".json", ".txt", ".model", ".jinja", ".tiktoken")  # what a tokenizer reads (not the weights)


def _cache_key(folder, vocab: HFVocab) -> str:
    """What the encoded ids depend on, hashed: the dataset's manifest and vocabulary, its shards' names, sizes and
    modification times, the tokenizer's files, the separator setting and the tokenizers library's version."""
    import hashlib

    import tokenizers

    h = hashlib.sha256(f"rayseq-retokenized-2 {tokenizers.__version__} {vocab.separator}".encode())
    folder = Path(folder).expanduser()
    for name in ("manifest.json", "vocab.json"):
        h.update((folder / name).read_bytes())
    for shard in sorted(folder.glob("*/part-*.parquet")):
        stat = shard.stat()
        h.update(f"{shard.relative_to(folder)} {stat.st_size} {stat.st_mtime_ns}".encode())
    for f in sorted(Path(vocab.path).expanduser().iterdir()):
        if f.is_file() and f.suffix in _TOKENIZER_FILES:
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:24]


def _encoded_ids(data: DialogueData, vocab: HFVocab, context: int | None = None, where: str = "task.data"
                 ) -> dict[str, np.ndarray]:
    """Every split's inputs and replies encoded by ``vocab`` (:func:`retokenize`), unpadded: ``<split>/src_ids`` (the
    rows' ids concatenated, int32) and ``<split>/src_len`` (n,), the same for ``tgt``, and the caps ``max_src``,
    ``max_tgt`` (what :func:`_with_ids` pads to). With the model's positions ``context``, the replies are encoded
    first — the longest by characters first of all — and a reply too long to leave a prompt room is refused
    (:func:`check_room`) before the inputs, the larger part, are encoded."""
    kind = data.tokenizer.get("kind", "words")

    def text(written, tokens: str) -> str:
        """What to encode of a row: as written (a conversation rendered), else the prepared tokens detokenised."""
        if written is None:
            return detokenize(tokens.split(), kind)
        return vocab.render(written) if isinstance(written, list) else written

    def encode(texts: list[str], empty: list[bool] | None = None) -> list[np.ndarray]:
        out = [vocab.encode_text(t, 1 << 30) for t in texts]
        return [np.zeros(0, dtype=np.int64) if empty is not None and empty[i] else
                o if len(o) else np.array([vocab.specials.unk], dtype=np.int64) for i, o in enumerate(out)]

    reply_texts = {}
    for name, s in data.splits.items():
        replies = s.replies if s.replies is not None else [None] * len(s)
        reply_texts[name] = [text(r, t) for r, t in zip(replies, s.tgt_text)]
    fix = fit_command(data, vocab)
    if context is not None:  # the replies with the most characters: nearly always those with the most tokens
        longest = sorted((t for name, texts in reply_texts.items() for t, n in
                          zip(texts, data.splits[name].tgt_len.tolist()) if n), key=len, reverse=True)[:256]
        check_room(max((len(x) for x in encode(longest)), default=0), context, where, fix)
    tgt = {name: encode(texts, empty=(data.splits[name].tgt_len == 0).tolist()) for name, texts in reply_texts.items()}
    # the longest reply; a prompt-only dataset has none: its prepared cap (--max-tgt-len), in this tokenizer's tokens
    max_tgt = max((len(x) for rows in tgt.values() for x in rows), default=0) or data.max_tgt_len
    if context is not None:
        check_room(max_tgt, context, where, fix)
    encoded = {}
    for name, s in data.splits.items():
        prompts = s.prompts if s.prompts is not None else [None] * len(s)
        encoded[name] = (encode([text(p, t) for p, t in zip(prompts, s.src_text)]), tgt[name])
    max_src = max(len(x) for src, _ in encoded.values() for x in src)

    out = {"max_src": np.int64(max_src), "max_tgt": np.int64(max_tgt)}
    for name in data.splits:
        for side, rows in zip(("src", "tgt"), encoded[name]):
            out[f"{name}/{side}_len"] = np.array([len(r) for r in rows], dtype=np.int64)
            out[f"{name}/{side}_ids"] = (np.concatenate(rows) if rows else np.zeros(0, np.int64)).astype(np.int32)
    return out


def _with_ids(data: DialogueData, vocab: HFVocab, ids: dict[str, np.ndarray]) -> DialogueData:
    """``data`` with the ids :func:`_encoded_ids` gave, held unpadded (:class:`~rayseq.data.dataset.RaggedRows`) and
    read padded to the longest input and reply (rows, groups, texts and splits unchanged)."""
    width = {"src": int(ids["max_src"]), "tgt": int(ids["max_tgt"])}
    splits = {}
    for name, s in data.splits.items():
        arrays = {}
        for side in ("src", "tgt"):
            lens = ids[f"{name}/{side}_len"]
            arrays[side] = RaggedRows(ids[f"{name}/{side}_ids"], lens, width[side], vocab.specials.pad)
            arrays[f"{side}_len"] = lens
        splits[name] = dataclasses.replace(s, **arrays)
    template = {"chat_template": True} if getattr(data, "conversational", False) else {}
    tokenizer = {"kind": HFVocab.kind, "path": vocab.path, **template}
    return DialogueData(vocab, tokenizer, int(ids["max_src"]), int(ids["max_tgt"]), data.manifest, splits)


def spec_vocab(spec: dict):
    """The vocabulary a checkpoint's task spec describes: a Hugging Face tokenizer's (:class:`HFVocab`), or rayseq's
    own (words or BPE pieces)."""
    from rayseq.data.subword import vocab_from_spec

    return HFVocab.from_spec(spec) if "hf_tokenizer" in spec else vocab_from_spec(spec)


def encode_all(vocab, text: str) -> list[int]:
    """Every id of ``text`` in ``vocab`` (rayseq's own: its lower-cased words), nothing truncated."""
    from rayseq.data.dataset import encode_text

    return encode_text(text, vocab, {"kind": "words", "lowercase": True}, 1 << 30).tolist()
