"""HFVocab and HFJoiner (rayseq/data/hf_text.py): a Hugging Face tokenizer as a task's vocabulary."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from rayseq.data.dataset import encode_text
from rayseq.data.hf_text import HFJoiner, HFVocab
from rayseq.data.text import decode_ids

TEXT = "héllo , how are you ? 😀 fine"


def test_vocab_encodes_and_decodes_text(hf_dir):
    vocab = HFVocab(str(hf_dir))
    s = vocab.specials
    assert (s.pad, s.bos, s.eos, s.unk) == (0, 1, 2, 3) and len(vocab) == 400
    ids = vocab.encode_text(TEXT, 1000)
    assert ids.dtype == np.int64 and vocab.decode_text(ids) == TEXT
    assert np.array_equal(vocab.encode_text(TEXT, 3), ids[-3:])  # the LAST tokens, as inputs are truncated
    assert np.array_equal(encode_text(TEXT, vocab, {"kind": "hf"}, 1000), ids)  # the dataset's entry point
    with_end = np.concatenate([ids, [s.eos, 50, 60, s.pad]])
    assert decode_ids(vocab, with_end) == TEXT  # up to the end token


def test_joiner_pieces_concatenate_to_the_text(hf_dir):
    """Byte-level BPE splits é and 😀 into several tokens: a token inside a character adds nothing, the one that
    completes it adds the character; the pieces concatenate to the decoded reply and peek == push."""
    vocab = HFVocab(str(hf_dir))
    ids = vocab.encode_text(TEXT, 1000).tolist()
    assert len(ids) > len(TEXT.split())
    joiner, pieces = HFJoiner(vocab), []
    for t in ids:
        peeked = joiner.peek(t)
        pieces.append(joiner.push(t))
        assert peeked == pieces[-1]
    assert "".join(pieces) == TEXT and "\ufffd" not in "".join(pieces)
    assert "" in pieces  # some token ended inside a multi-byte character
    assert joiner.push(vocab.specials.eos) == ""


def test_tokenizer_without_a_pad_token_is_refused(hf_dir, tmp_path):
    import json

    d = tmp_path / "nopad"
    shutil.copytree(hf_dir, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("pad_token", None)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    special = d / "special_tokens_map.json"
    if special.exists():
        m = json.loads(special.read_text())
        m.pop("pad_token", None)
        special.write_text(json.dumps(m))
    with pytest.raises(ValueError, match="needs a pad token other than its end token"):
        HFVocab(str(d))
    with pytest.raises(FileNotFoundError, match="no such directory"):
        HFVocab(str(tmp_path / "nowhere"))


def test_the_retokenised_dataset_is_kept_beside_it_and_read_back_bit_for_bit(corpus, hf_dir, tmp_path, caplog):
    """The first process encodes and writes the ids into the dataset's folder, the next reads the same arrays back;
    a changed tokenizer or dataset is encoded anew (another file); a damaged file is encoded again and replaced; a
    folder that cannot be written is encoded each time."""
    import logging

    from rayseq.data.dataset import DialogueData
    from rayseq.data.hf_text import RETOKENIZED, retokenize, retokenized

    data_dir = tmp_path / "data"
    shutil.copytree(corpus, data_dir)
    words = DialogueData.load(data_dir)
    vocab = HFVocab(str(hf_dir))
    fresh = retokenize(words, vocab)

    def same(a, b):
        assert (a.max_src_len, a.max_tgt_len, a.tokenizer) == (b.max_src_len, b.max_tgt_len, b.tokenizer)
        for name, split in a.splits.items():
            for f in ("src", "src_len", "tgt", "tgt_len"):
                x, y = getattr(split, f), getattr(b.splits[name], f)
                assert x.dtype == y.dtype and np.array_equal(x, y), (name, f)
            assert split.src_text == b.splits[name].src_text and np.array_equal(split.group, b.splits[name].group)

    same(retokenized(words, vocab, data_dir), fresh)  # encoded, written
    (kept,) = (data_dir / RETOKENIZED).iterdir()
    written = kept.stat().st_mtime_ns
    same(retokenized(words, vocab, data_dir), fresh)  # read back, not written again
    assert kept.stat().st_mtime_ns == written

    other = tmp_path / "tok"  # another tokenizer: its own file, its own ids
    shutil.copytree(hf_dir, other)
    config = other / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"<unk>"', '"<pad>"', 1))
    retokenized(words, HFVocab(str(other)), data_dir)
    assert len(list((data_dir / RETOKENIZED).iterdir())) == 2

    kept.write_bytes(b"not an npz")  # damaged: encoded again and replaced
    same(retokenized(words, vocab, data_dir), fresh)
    same(retokenized(words, vocab, data_dir), fresh)
    assert "unreadable" in caplog.text

    shutil.rmtree(data_dir / RETOKENIZED)
    (data_dir / RETOKENIZED).write_text("")  # the folder cannot be made (as in a read-only dataset): encoded each time
    with caplog.at_level(logging.INFO, logger="rayseq.data.hf_text"):
        same(retokenized(words, vocab, data_dir), fresh)
        same(retokenized(words, vocab, data_dir), fresh)
    assert caplog.text.count("cannot keep the re-tokenised dataset") == 1
    assert not list(data_dir.glob("**/*.npz"))


def test_inputs_fitted_to_the_models_positions_keep_their_last_tokens(caplog):
    """fit_context on the unpadded ids is the plain per-row cut: each input keeps its last
    ``context - longest reply - 2`` tokens, the replies and the other splits' rows unchanged; inputs that fit are
    returned as they are; a reply that leaves no room is an error naming the lengths."""
    from rayseq.data.dataset import DataError
    from rayseq.data.hf_text import fit_context

    rng = np.random.default_rng(0)
    rows = {name: [rng.integers(4, 400, rng.integers(1, 40)) for _ in range(n)] for name, n in (("a", 50), ("b", 7))}
    replies = [rng.integers(4, 400, 6) for _ in range(57)]
    ids = {"max_src": np.int64(39), "max_tgt": np.int64(6)}
    for name, r in rows.items():
        ids[f"{name}/src_len"] = np.array([len(x) for x in r])
        ids[f"{name}/src_ids"] = np.concatenate(r).astype(np.int32)
        ids[f"{name}/tgt_len"] = np.full(len(r), 6)
        ids[f"{name}/tgt_ids"] = np.concatenate(replies[: len(r)]).astype(np.int32)
    fitted = fit_context(ids, 28, "task.data=D")  # room for 28 - 6 - 2 = 20 input tokens
    assert int(fitted["max_src"]) == 20 and int(fitted["max_tgt"]) == 6
    for name, r in rows.items():
        want = [x[-20:] for x in r]
        assert fitted[f"{name}/src_len"].tolist() == [len(x) for x in want]
        assert fitted[f"{name}/src_ids"].dtype == np.int32
        assert np.array_equal(fitted[f"{name}/src_ids"], np.concatenate(want))
        for k in ("tgt_len", "tgt_ids"):
            assert fitted[f"{name}/{k}"] is ids[f"{name}/{k}"]
    cut = sum(len(x) > 20 for r in rows.values() for x in r)
    assert cut and f"task.data=D: {cut} input(s) longer than the model's 28 positions" in caplog.text
    assert fit_context(ids, 47, "task.data=D") is ids  # 39 input tokens fit
    with pytest.raises(DataError, match="a reply is 6 tokens .* reads 8 positions, leaving no room .* --fit-model"):
        fit_context(ids, 8, "task.data=D")


def test_data_prepared_for_a_model_fits_it_and_other_data_is_refused_before_its_inputs_are_encoded(hf_dir, tmp_path,
                                                                                                   monkeypatch):
    """`prepare --fit-model DIR` drops the replies longer than half the model's positions in its tokens (here the tiny
    GPT-2's 128: 62 tokens), so a run with that model takes the data; data prepared without it, whose longest reply
    leaves no room for a prompt, is refused once the replies are encoded, before the inputs are, and nothing is
    written (the longest ones by characters are encoded first)."""
    import json

    from rayseq.data.dataset import DataError, DialogueData
    from rayseq.data.hf_text import RETOKENIZED, retokenized
    from rayseq.data.preparation import PrepareOptions, prepare

    long = " ".join(["supercalifragilistic"] * 12)  # 12 words, over 62 of the tiny tokenizer's tokens
    rows = [{"prompt": f"question {i} ?", "reply": "fine , thanks" if i % 10 else long} for i in range(200)]
    source = tmp_path / "long.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    opts = dict(quiet=True, max_tgt_len=40, valid_frac=0.1, test_frac=0.1)
    plain = tmp_path / "plain"
    prepare(f"jsonl:{source}", plain, PrepareOptions(**opts))
    fitted = tmp_path / "fitted"
    m = prepare(f"jsonl:{source}", fitted, PrepareOptions(**opts, fit_model=str(hf_dir)))
    assert m["dropped"]["reply_too_long_for_model"] == 20
    assert m["fit_model"] == {"path": str(hf_dir.resolve()), "positions": 128, "max_reply_tokens": 62}

    vocab = HFVocab(str(hf_dir))
    data = retokenized(DialogueData.load(fitted), vocab, fitted, 128)
    assert data.max_tgt_len <= 62

    encoded: list[int] = []
    real = HFVocab.encode_text
    monkeypatch.setattr(HFVocab, "encode_text", lambda self, t, n: encoded.append(1) or real(self, t, n))
    with pytest.raises(DataError, match=r"a reply is \d+ tokens .* 128 positions.* prepare the data for the model: "
                                        rf"python -m rayseq.data prepare jsonl:{source} --out DIR --fit-model"):
        retokenized(DialogueData.load(plain), vocab, plain, 128)
    assert len(encoded) <= 256  # the longest replies only: neither the other replies nor any input
    assert not (plain / RETOKENIZED).exists() or not list((plain / RETOKENIZED).iterdir())
