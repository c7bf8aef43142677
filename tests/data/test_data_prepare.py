"""Dialogue data pipeline (rayseq.data.preparation, rayseq.data.dataset, python -m rayseq.data): every
source format on tiny hand-written files, grouping, the conversation-level split, vocabulary, length
caps, the reader, bad input, atomic writing, the CLI, and the real chitchat / chatterbot corpora."""

from __future__ import annotations

import gzip
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayseq.data import DataError, DialogueData, PrepareOptions, encode_text, prepare
from rayseq.data import preparation as dp
from rayseq.data.preparation import RawPair, load_source, merge_speakers, split_conversations, turns_to_pairs

ROOT = Path(__file__).resolve().parents[2]
ALL_TRAIN = {"valid_frac": 0.0, "test_frac": 0.0}  # one split: pairs and groups are easy to check


def opts(**kw) -> PrepareOptions:
    return PrepareOptions(quiet=True, **kw)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def prep(tmp_path: Path, source: str, name: str = "out", **kw) -> DialogueData:
    prepare(source, tmp_path / name, opts(**kw))
    return DialogueData.load(tmp_path / name)


def pairs_of(split) -> list[tuple[str, str]]:
    return list(zip(split.src_text, split.tgt_text))


# ------------------------------------------------------------------------------------ sources


def test_turns_to_pairs_context_and_blocks():
    turns = ["a", "b", "c", "d"]
    assert turns_to_pairs("x", turns) == [RawPair("x", "a", "b"), RawPair("x", "b", "c"), RawPair("x", "c", "d")]
    # K = 2: the two previous turns, joined by a space; the first pair has only one
    assert [p.input for p in turns_to_pairs("x", turns, context_turns=2)] == ["a", "a b", "b c"]
    # blocks of 2 turns: (a b) (c d) -> the pair b -> c across the cut is lost
    assert turns_to_pairs("x", turns, max_conv_turns=2) == [RawPair("x#0", "a", "b"), RawPair("x#1", "c", "d")]
    assert merge_speakers([("u1", "hi"), ("u1", "there"), ("u2", "yo"), ("u1", "ok")]) == ["hi there", "yo", "ok"]


@pytest.mark.parametrize("gz", [False, True])
def test_opensubtitles_plain_and_gz(tmp_path, gz):
    text = "Hello there.\nHi!\nHow are you?\n\n\nBye now\nSee you\n"
    path = tmp_path / ("os.txt.gz" if gz else "os.txt")
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    raw, files, _ = load_source(f"opensubtitles:{path}", opts())
    # blank lines (line 4, 5) end the first conversation; conv ids name the file and the first line
    assert raw == [
        RawPair(f"{path.name}:1", "Hello there.", "Hi!"),
        RawPair(f"{path.name}:1", "Hi!", "How are you?"),
        RawPair(f"{path.name}:6", "Bye now", "See you"),
    ]
    assert files == [path]
    train = prep(tmp_path, f"opensubtitles:{path}", **ALL_TRAIN).splits["train"]
    assert pairs_of(train) == [("hello there .", "hi !"), ("hi !", "how are you ?"), ("bye now", "see you")]


def write_cornell(root: Path, conversations: str | None = None) -> Path:
    root.mkdir()
    sep = " +++$+++ "
    lines = [
        ("L1", "u0", "Hello, Bianca."),
        ("L2", "u1", "Hi."),
        ("L3", "u1", "Who are you?"),  # same speaker as L2: merged into one turn
        ("L4", "u0", "Cameron."),
        ("L5", "u0", ""),  # an empty text (the real file has some)
        ("L6", "u1", "Caf\xe9?"),  # iso-8859-1 byte 0xe9
    ]
    (root / "movie_lines.txt").write_bytes(
        "".join(sep.join([i, u, "m0", u.upper(), t]) + "\n" for i, u, t in lines).encode("iso-8859-1")
    )
    conversations = conversations or (
        f"u0{sep}u1{sep}m0{sep}['L1', 'L2', 'L3', 'L4']\nu0{sep}u1{sep}m0{sep}['L5', 'L6']\n"
    )
    (root / "movie_conversations.txt").write_text(conversations, encoding="iso-8859-1")
    return root


def test_cornell(tmp_path):
    root = write_cornell(tmp_path / "cornell")
    raw, files, _ = load_source(f"cornell:{root}", opts())
    assert raw == [
        RawPair("m0:1", "Hello, Bianca.", "Hi. Who are you?"),
        RawPair("m0:1", "Hi. Who are you?", "Cameron."),
        RawPair("m0:2", "", "Caf\xe9?"),
    ]
    assert [f.name for f in files] == ["movie_lines.txt", "movie_conversations.txt"]
    m = prepare(f"cornell:{root}", tmp_path / "out", opts(**ALL_TRAIN))
    assert m["dropped"]["empty_input"] == 1 and m["counts"]["train"]["pairs"] == 2


def test_jsonl_and_tsv(tmp_path):
    rows = [
        {"input": "Hi", "reply": "Hello", "conv_id": "a"},
        {"input": "Yo", "reply": "Sup"},
        {"input": "How?", "reply": "Fine", "conv_id": 7},
    ]
    raw, _, _ = load_source(f"jsonl:{write_jsonl(tmp_path / 'p.jsonl', rows)}", opts())
    # no conv id: the conversation of its prompt (as tokenised)
    assert raw == [RawPair("a", "Hi", "Hello"), RawPair("prompt:yo", "Yo", "Sup"), RawPair("7", "How?", "Fine")]
    (tmp_path / "p.tsv").write_text("Hi\tHello\ta\n\nYo\tSup\nHow?\tFine\t7\n", encoding="utf-8")
    raw, _, _ = load_source(f"tsv:{tmp_path / 'p.tsv'}", opts())
    assert raw == [RawPair("a", "Hi", "Hello"), RawPair("prompt:yo", "Yo", "Sup"), RawPair("7", "How?", "Fine")]


def test_jsonl_prompt_field_and_its_errors(tmp_path):
    rows = [{"prompt": "Hi!", "reply": "Hello"}, {"input": "hi !", "reply": "Hey"}]
    raw, _, _ = load_source(f"jsonl:{write_jsonl(tmp_path / 'p.jsonl', rows)}", opts())
    # "prompt" and "input" name the same field; the same prompt (as tokenised) is one conversation
    assert raw == [RawPair("prompt:hi !", "Hi!", "Hello"), RawPair("prompt:hi !", "hi !", "Hey")]
    for row, msg in (({"prompt": "a", "input": "a", "reply": "b"}, "both 'prompt' and 'input'"),
                     ({"reply": "b"}, "missing field 'prompt' (or 'input')"),
                     ({"prompt": "a", "reply": "b", "completion": "c"}, "both 'reply' and 'completion'"),
                     ({"prompt": "a", "reply": 3}, "field 'reply' must be a string")):
        with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'bad.jsonl'}:1: {msg}")):
            load_source(f"jsonl:{write_jsonl(tmp_path / 'bad.jsonl', [row])}", opts())


def test_a_prompts_replies_stay_in_one_split(tmp_path):
    """A user file where every prompt has several replies and no conversation ids: each prompt goes to one split
    whole, so valid and test keep inputs (split by row, every held-out prompt would also be a training input and
    be dropped) and a training prompt keeps all its references."""
    colours = ["red", "green", "blue", "black", "white"]
    rows = [{"prompt": f"{colours[k % 5]} or {colours[k // 5]} ?", "reply": f"{colours[j]} , i think"}
            for k in range(20) for j in range(3)]
    data = prep(tmp_path, f"jsonl:{write_jsonl(tmp_path / 'p.jsonl', rows)}", valid_frac=0.1, test_frac=0.1)
    counts = data.manifest["counts"]
    assert [counts[s]["groups"] for s in dp.SPLITS] == [16, 2, 2]
    assert all(counts[s]["dropped_seen_in_train"]["pairs"] == 0 for s in dp.HELD_OUT)
    assert [len(r) for r in data.splits["train"].references()] == [3] * 16


# --------------------------------------------------------------------------------- processing


def test_identical_inputs_share_a_group_and_its_references(tmp_path):
    rows = [
        {"input": "Hi!", "reply": "Hello.", "conv_id": "c1"},
        {"input": "How are you?", "reply": "Fine.", "conv_id": "c1"},
        {"input": "hi !", "reply": "Hey there", "conv_id": "c1"},  # same tokens as "Hi!"
        {"input": "Bye", "reply": "Ciao", "conv_id": "c2"},
    ]
    data = prep(tmp_path, f"jsonl:{write_jsonl(tmp_path / 'p.jsonl', rows)}", **ALL_TRAIN)
    train = data.splits["train"]
    assert train.group.tolist() == [0, 1, 0, 2]  # in order of first appearance
    refs = train.references()
    assert [[" ".join(data.vocab.decode(r)) for r in g] for g in refs] == [
        ["hello .", "hey there"],
        ["fine ."],
        ["ciao"],
    ]
    src, src_len = train.group_inputs()
    assert src.shape == (3, data.max_src_len) and src_len.tolist() == [2, 4, 1]
    assert data.vocab.decode(src[0]) == ["hi", "!"]
    assert data.manifest["counts"]["train"] == {"conversations": 2, "pairs": 4, "prompt_only": 0, "groups": 3,
                                                "unk_rate": 0.0}


def test_inputs_equal_after_unk_share_a_group(tmp_path):
    # min_count 2: "rare1" and "rare2" are <unk>, so the model sees the same input "<unk> ?" twice
    rows = [{"input": "rare1 ?", "reply": "ok ok"}, {"input": "rare2 ?", "reply": "ok ?"}]
    data = prep(tmp_path, f"jsonl:{write_jsonl(tmp_path / 'p.jsonl', rows)}", min_count=2, **ALL_TRAIN)
    train = data.splits["train"]
    assert train.src_text == ["rare1 ?", "rare2 ?"] and train.group.tolist() == [0, 0]
    assert [len(g) for g in train.references()] == [2]


def conv_rows(n: int) -> list[dict]:
    """n conversations of 2 pairs; conversation k has its own word "wk"."""
    return [{"input": f"hello w{k}", "reply": f"hi w{k}", "conv_id": f"c{k:02d}"} for k in range(n) for _ in range(2)]


def test_split_by_conversation_no_leak_and_deterministic(tmp_path):
    src = f"jsonl:{write_jsonl(tmp_path / 'p.jsonl', conv_rows(40))}"
    kw = {"valid_frac": 0.2, "test_frac": 0.1}
    a = prep(tmp_path, src, "a", **kw)
    ids = {s: set(a.splits[s].conv_id) for s in dp.SPLITS}
    assert {s: len(v) for s, v in ids.items()} == {"train": 28, "valid": 8, "test": 4}
    assert ids["train"] | ids["valid"] | ids["test"] == {f"c{k:02d}" for k in range(40)}
    assert not (ids["train"] & ids["valid"] or ids["train"] & ids["test"] or ids["valid"] & ids["test"])
    # the same seed gives the same split (whatever the order the conversations were read in)
    b = prep(tmp_path, src, "b", **kw)
    assert all(a.splits[s].conv_id == b.splits[s].conv_id for s in dp.SPLITS)
    ids_sorted = sorted(f"c{k:02d}" for k in range(40))
    assert split_conversations(ids_sorted, 0, 0.2, 0.1) == split_conversations(ids_sorted[::-1], 0, 0.2, 0.1)
    assert split_conversations(ids_sorted, 1, 0.2, 0.1) != split_conversations(ids_sorted, 0, 0.2, 0.1)
    # the vocabulary comes from train only: "wk" is a word iff conversation k is in train
    assert {w for w in a.vocab.itos if w.startswith("w")} == {f"w{int(c[1:])}" for c in ids["train"]}
    assert a.manifest["counts"]["valid"]["unk_rate"] == 0.5  # hello <unk> -> hi <unk>: 2 of 4 tokens
    # tiny corpora still get one conversation in valid and in test; one conversation stays in train
    assert dp.split_sizes(3, 0.05, 0.05) == (1, 1) and dp.split_sizes(2, 0.05, 0.05) == (0, 0)


COLOURS = ["red", "green", "blue", "cyan", "pink", "gray"]


def shared_input_rows(n: int) -> list[dict]:
    """n <= 36 conversations of 4 pairs. Every conversation asks "hi" and "how are you ?" (the same text
    everywhere) and "i like wk ." (its own word "wk": seen once in train, so <unk> with min_count 2); its
    4th input, two colours, is the only one no other conversation has."""
    rows = []
    for k in range(n):
        a, b = divmod(k, len(COLOURS))
        for inp, reply in [("hi", f"hello number {k % 3}"), ("how are you ?", "fine , thanks"),
                           (f"i like w{k} .", "me too"), (f"{COLOURS[a]} {COLOURS[b]}", "nice colours")]:
            rows.append({"input": inp, "reply": reply, "conv_id": f"c{k:02d}"})
    return rows


def test_held_out_inputs_never_occur_in_train(tmp_path):
    # fails with format v1: the conversation split alone left "hi" in train, valid and test
    n, kw = 36, {"valid_frac": 0.1, "test_frac": 0.2, "min_count": 2}
    data = prep(tmp_path, f"jsonl:{write_jsonl(tmp_path / 'p.jsonl', shared_input_rows(n))}", **kw)
    ids = {s: sorted(set(data.splits[s].conv_id)) for s in dp.SPLITS}
    split_of = split_conversations([f"c{k:02d}" for k in range(n)], 0, 0.1, 0.2)
    n_conv = {s: sum(v == s for v in split_of.values()) for s in dp.SPLITS}
    assert n_conv == {"train": 25, "valid": 4, "test": 7}  # round(3.6), round(7.2)
    assert all(ids[s] == sorted(c for c, v in split_of.items() if v == s) for s in dp.SPLITS)
    v = data.vocab
    assert set(COLOURS) <= set(v.itos) and not any(w.startswith("w") for w in v.itos[4:])  # wk: one train count
    train = data.splits["train"]
    train_ids = {tuple(train.src[i, : train.src_len[i]].tolist()) for i in range(len(train))}
    # by hand: train has hi, how are you ?, i like <unk> . (all 25 "i like wk ." share it), 25 colour pairs
    assert len(train) == 4 * 25 and train.num_groups == 3 + 25
    for s in dp.HELD_OUT:
        split, m = data.splits[s], data.manifest["counts"][s]
        held_ids = {tuple(split.src[i, : split.src_len[i]].tolist()) for i in range(len(split))}
        assert not held_ids & train_ids and not set(split.src_text) & set(train.src_text)
        # each held-out conversation loses hi, how are you ?, and "i like wk ." (text never in train, but
        # the model sees "i like <unk> .", a training input): 3 pairs, 3 distinct inputs over the split
        assert m["dropped_seen_in_train"] == {"pairs": 3 * n_conv[s], "inputs": 3}
        assert m["inputs_seen_in_train"] == 0
        # what is left: the colour pair of each conversation, one group each, groups built after the drop
        assert split.src_text == [f"{COLOURS[int(c[1:]) // 6]} {COLOURS[int(c[1:]) % 6]}" for c in ids[s]]
        assert split.group.tolist() == list(range(n_conv[s]))
        assert (m["pairs"], m["groups"], m["conversations"]) == (n_conv[s], n_conv[s], n_conv[s])
        # the same count from the raw rows, encoded as the model sees them
        raw = [r for r in shared_input_rows(n) if split_of[r["conv_id"]] == s]
        seen = [tuple(v.encode(r["input"].split()).tolist()) for r in raw]
        seen = [key for key in seen if key in train_ids]
        assert m["dropped_seen_in_train"] == {"pairs": len(seen), "inputs": len(set(seen))}
    assert "dropped_seen_in_train" not in data.manifest["counts"]["train"]


def test_vocab_order_cap_min_count_and_unk(tmp_path):
    rows = [{"input": "b b a", "reply": "a c"}, {"input": "d c", "reply": "b a"}]
    # train counts: a 3, b 3 (a tie: alphabetical), c 2, d 1
    src = f"jsonl:{write_jsonl(tmp_path / 'p.jsonl', rows)}"
    data = prep(tmp_path, src, "cap", vocab_size=6, **ALL_TRAIN)
    assert data.vocab.itos == ["<pad>", "<bos>", "<eos>", "<unk>", "a", "b"]
    # 9 tokens, c c d are <unk>
    assert data.manifest["vocab"] == {"size": 6, "unk_rate_train": round(3 / 9, 6)}
    assert data.splits["train"].src[1, :2].tolist() == [3, 3]  # "d c" -> <unk> <unk>
    data = prep(tmp_path, src, "min", min_count=2, **ALL_TRAIN)
    assert data.vocab.itos[4:] == ["a", "b", "c"]
    vocab, counts = dp.build_vocab([["x", "y", "y"], ["z", "x"]], vocab_size=100)
    assert vocab.itos[4:] == ["x", "y", "z"] and counts["y"] == 2


def test_length_caps_drop_and_truncate(tmp_path):
    rows = [
        {"input": "one two three four five", "reply": "ok"},  # input keeps its LAST 3 tokens
        {"input": "hi", "reply": "a b c"},  # reply over 2 tokens: dropped (or truncated)
        {"input": "...?", "reply": ""},  # empty reply
        {"input": "", "reply": "hm"},  # empty input
        {"input": "x", "reply": "y"},
    ]
    src = f"jsonl:{write_jsonl(tmp_path / 'p.jsonl', rows)}"
    data = prep(tmp_path, src, "drop", max_src_len=3, max_tgt_len=2, **ALL_TRAIN)
    assert pairs_of(data.splits["train"]) == [("three four five", "ok"), ("x", "y")]
    assert data.manifest["dropped"] == {"empty_input": 1, "empty_reply": 1, "reply_too_long": 1}
    assert data.manifest["truncated"] == {"inputs": 1, "replies": 0}
    data = prep(tmp_path, src, "trunc", max_src_len=3, max_tgt_len=2, truncate_replies=True, **ALL_TRAIN)
    assert pairs_of(data.splits["train"])[1] == ("hi", "a b")
    assert data.manifest["truncated"] == {"inputs": 1, "replies": 1}
    assert data.splits["train"].src.shape == (3, 3) and data.splits["train"].tgt.shape == (3, 2)


def test_reader_round_trip_and_encode_text(tmp_path):
    src = f"jsonl:{write_jsonl(tmp_path / 'p.jsonl', conv_rows(12))}"
    data = prep(tmp_path, src, shard_size=5, valid_frac=0.25, test_frac=0.25)
    for s, split in data.splits.items():
        shards = sorted((tmp_path / "out" / s).glob("part-*.parquet"))
        assert [p.name for p in shards] == data.manifest["shards"][s]
        assert all(pq.read_metadata(p).num_rows <= 5 for p in shards)
        rows = [r for p in shards for r in pq.read_table(p).to_pylist()]
        assert len(split) == len(rows) == data.manifest["counts"][s]["pairs"]
        for i, r in enumerate(rows):
            assert split.src[i, : split.src_len[i]].tolist() == r["src"]
            assert split.tgt[i, : split.tgt_len[i]].tolist() == r["tgt"]
            assert not split.src[i, split.src_len[i] :].any() and not split.tgt[i, split.tgt_len[i] :].any()
            assert (split.group[i], split.src_text[i], split.tgt_text[i]) == (r["group"], r["src_text"], r["tgt_text"])
        assert split.src.dtype == split.tgt.dtype == split.group.dtype == np.int64
    assert len(data.splits["train"]) == 12 and sum(len(s.conv_id) for s in data.splits.values()) == 24
    assert pq.read_schema(tmp_path / "out" / "train" / "part-00000.parquet").remove_metadata().equals(dp.SCHEMA)
    spec = json.loads((tmp_path / "out" / "vocab.json").read_text())
    assert spec["tokenizer"] == {"kind": "words", "lowercase": True} and spec["max_src_len"] == 20
    # prompts: same tokenizer, keep the last tokens, unknown words -> <unk> (3)
    v = data.vocab
    ids = encode_text("Well, HELLO zzz", v, data.tokenizer, max_len=2)
    assert ids.dtype == np.int64 and ids.tolist() == [v.stoi["hello"], 3]
    assert data.encode("").tolist() == []


def test_load_names_the_missing_file(tmp_path):
    prepare(f"jsonl:{write_jsonl(tmp_path / 'p.jsonl', conv_rows(3))}", tmp_path / "out", opts())
    (tmp_path / "out" / "manifest.json").unlink()
    with pytest.raises(DataError, match="missing manifest.json"):
        DialogueData.load(tmp_path / "out")
    with pytest.raises(DataError, match="no such directory"):
        DialogueData.load(tmp_path / "nope")


def test_v1_dataset_is_refused_with_the_command_that_re_prepares_it(tmp_path, capsys):
    from rayseq.data.__main__ import main

    source = f"jsonl:{write_jsonl(tmp_path / 'p.jsonl', shared_input_rows(36))}"
    out = tmp_path / "old data"  # a space: the command must quote it
    prepare(source, out, opts(min_count=2, truncate_replies=True))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["format_version"] = "rayseq-dialogue-v1"  # what rayseq wrote before held-out inputs were cleaned
    (out / "manifest.json").write_text(json.dumps(manifest))
    command = f"python -m rayseq.data prepare {source} --out '{out}' --truncate-replies --min-count 2 --overwrite"
    with pytest.raises(DataError) as e:
        DialogueData.load(out)
    assert str(e.value) == (
        f"{out / 'manifest.json'}: format_version 'rayseq-dialogue-v1' was prepared by an older rayseq whose valid "
        "and test splits may contain training inputs (held-out scores would partly measure recall of training "
        f"replies); re-prepare it ('{dp.FORMAT_VERSION}') with: {command}"
    )
    # the command is exact: run as given, it re-creates the dataset with the same options
    assert main(shlex.split(command)[3:] + ["--quiet"]) == 0
    printed = capsys.readouterr()
    assert printed.out.count("(dropped 6 pairs / 3 inputs also in train)") == 2 and not printed.err  # 2 convs each
    data = DialogueData.load(out)
    assert data.manifest["options"] == manifest["options"] and data.manifest["format_version"] == dp.FORMAT_VERSION
    manifest["format_version"] = "rayseq-dialogue-v0"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=re.escape(f"'rayseq-dialogue-v0', expected '{dp.FORMAT_VERSION}'")):
        DialogueData.load(out)


# -------------------------------------------------------------------------------------- errors

SEP = " +++$+++ "
BAD_FILES = {
    "bad json": ("jsonl", "p.jsonl", b'{"input": "a", "reply": "b"}\n{"input": \n', "p.jsonl:2: bad JSON"),
    "missing field": ("jsonl", "p.jsonl", b'\n{"reply": "a"}\n', "p.jsonl:2: missing field 'prompt' (or 'input')"),
    "wrong type": ("jsonl", "p.jsonl", b'{"input": 3, "reply": "b"}\n', "p.jsonl:1: field 'input' must be a string"),
    "not an object": ("jsonl", "p.jsonl", b'["a", "b"]\n', "p.jsonl:1: expected a JSON object"),
    "tsv without tab": ("tsv", "p.tsv", b"a\tb\nno tab here\n", "p.tsv:2: no tab"),
    "undecodable": ("tsv", "p.tsv", b"a\tb\nc\t\xff\xfe\n", "p.tsv:2: cannot decode as utf-8"),
    "bad gzip": ("opensubtitles", "os.txt.gz", b"not gzip at all\n", "os.txt.gz:1: cannot read"),
    "no usable pairs": ("tsv", "p.tsv", b"?\t\n", "no usable pairs"),
}


@pytest.mark.parametrize("case", BAD_FILES, ids=list(BAD_FILES))
def test_bad_input_names_file_and_line(tmp_path, case):
    kind, name, content, message = BAD_FILES[case]
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=re.escape(message)):
        prepare(f"{kind}:{tmp_path / name}", tmp_path / "out", opts())
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no output, no temp dir


def test_bad_cornell_files(tmp_path):
    bad_fields = f"u0{SEP}u1{SEP}['L1', 'L2']\n"
    with pytest.raises(DataError, match=r"movie_conversations.txt:1: expected 4 fields"):
        load_source(f"cornell:{write_cornell(tmp_path / 'a', bad_fields)}", opts())
    unknown = f"u0{SEP}u1{SEP}m0{SEP}['L1', 'L2']\nu0{SEP}u1{SEP}m0{SEP}['L1', 'L99']\n"
    with pytest.raises(DataError, match=r"movie_conversations.txt:2: unknown line id 'L99'"):
        load_source(f"cornell:{write_cornell(tmp_path / 'b', unknown)}", opts())
    root = write_cornell(tmp_path / "c")
    with (root / "movie_lines.txt").open("a", encoding="iso-8859-1") as f:
        f.write(f"L7{SEP}u0{SEP}m0 hello\n")
    with pytest.raises(DataError, match=r"movie_lines.txt:7: expected 5 fields"):
        load_source(f"cornell:{root}", opts())
    with pytest.raises(DataError, match="no such directory"):
        load_source(f"cornell:{tmp_path / 'nope'}", opts())
    with pytest.raises(DataError, match="unknown source 'xls:x'"):
        load_source("xls:x", opts())
    with pytest.raises(DataError, match="x: no such file"):
        load_source("csv:x", opts())


def test_missing_chatterbot_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "chatterbot_corpus", None)  # import raises ImportError
    with pytest.raises(DataError, match=r'pip install chatterbot-corpus \(or pip install -e "\.\[chatterbot\]"\)'):
        load_source("chatterbot", opts())


# ------------------------------------------------------------------------------------- writing


def test_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    src = f"jsonl:{write_jsonl(tmp_path / 'p.jsonl', conv_rows(5))}"
    calls, real_write_table = [], pq.write_table

    def failing_write_table(table, path, **kw):  # the second shard fails, after the first was written
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        return real_write_table(table, path, **kw)

    monkeypatch.setattr(dp.pq, "write_table", failing_write_table)
    with pytest.raises(OSError, match="disk full"):
        prepare(src, tmp_path / "out", opts())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]


def test_overwrite_replaces_atomically(tmp_path):
    src = f"jsonl:{write_jsonl(tmp_path / 'p.jsonl', conv_rows(5))}"
    out = tmp_path / "out"
    out.mkdir()
    prepare(src, out, opts())  # an empty directory is fine
    (out / "marker").write_text("old")
    with pytest.raises(DataError, match="exists and is not empty"):
        prepare(src, out, opts())
    assert (out / "marker").exists()
    prepare(src, out, opts(overwrite=True, vocab_size=5))
    assert not (out / "marker").exists() and len(DialogueData.load(out).vocab) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "p.jsonl"]  # no .old-* nor .tmp-* left


# ----------------------------------------------------------------------------------------- CLI


def run_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rayseq.data", "prepare", *args, "--quiet"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cli_ok_and_bad_file(tmp_path):
    src = f"tsv:{tmp_path / 'p.tsv'}"
    (tmp_path / "p.tsv").write_text("Hi\tHello\nHow are you?\tFine\n", encoding="utf-8")
    proc = run_cli(src, "--out", str(tmp_path / "out"), "--test-frac", "0", "--valid-frac", "0")
    assert proc.returncode == 0, proc.stderr
    assert "train" in proc.stdout and DialogueData.load(tmp_path / "out").manifest["counts"]["train"]["pairs"] == 2
    (tmp_path / "p.tsv").write_text("Hi\tHello\nHow are you? Fine\n", encoding="utf-8")
    proc = run_cli(src, "--out", str(tmp_path / "out2"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {tmp_path / 'p.tsv'}:2: no tab (expected input<TAB>reply[<TAB>conv_id])"
    assert not (tmp_path / "out2").exists()


# -------------------------------------------------------------------------------- real corpora


@pytest.mark.e2e
def test_real_chitchat(tmp_path):
    pytest.importorskip("chitchat_dataset")
    m = prepare("chitchat", tmp_path / "cc", opts())
    c = m["counts"]
    assert sum(c[s]["pairs"] for s in dp.SPLITS) > 5000 and all(c[s]["pairs"] > 0 for s in dp.SPLITS)
    assert m["raw_conversations"] > 3000 and m["vocab"]["size"] == 4000 and m["vocab"]["unk_rate_train"] < 0.1
    ids = {s: set(pq.read_table(tmp_path / "cc" / s, columns=["conv_id"]).column(0).to_pylist()) for s in dp.SPLITS}
    assert not (ids["train"] & ids["valid"] or ids["train"] & ids["test"] or ids["valid"] & ids["test"])


def test_real_chatterbot(tmp_path):
    pytest.importorskip("chatterbot_corpus", reason="chatterbot-corpus not installed: pip install -e '.[chatterbot]'")
    m = prepare("chatterbot", tmp_path / "cb", opts())
    assert m["counts"]["train"]["pairs"] > 1000 and len(m["input_files"]) > 10
    # English only, and malformed entries are counted, not fatal
    assert all("/english/" in f["path"] for f in m["input_files"])
    assert m["dropped"].get("malformed_entries", 0) <= 5
    with pytest.raises(DataError, match="no language 'klingon'"):
        load_source("chatterbot", opts(language="klingon"))


def test_a_prepare_error_is_one_clean_line_when_stderr_is_not_a_terminal(tmp_path):
    """`prepare ... 2> file` (a log, CI): no progress-bar fragment glued in front of the error line."""
    good = [json.dumps({"prompt": f"question {i} ?", "reply": "an answer ."}) for i in range(3000)]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join([*good, "{not json"]) + "\n")
    cmd = [sys.executable, "-m", "rayseq.data", "prepare", f"jsonl:{path}", "--out", str(tmp_path / "o")]  # no --quiet
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and "\r" not in r.stderr, repr(r.stderr)
    assert f"{path}:3001" in r.stderr
