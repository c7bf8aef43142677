"""The BPE vocabulary: learned at prepare time on the training split, words round-trip through its pieces,
no training text is <unk>, a subword model never emits <unk> (sampled, greedy, served), BLEU counts words, the
tokenizer lives in the dataset, the checkpoint and a resumed run, and the prepare option is validated."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rayseq.config import ConfigError, build_config
from rayseq.data.__main__ import main as prepare_main
from rayseq.data.dataset import DialogueData
from rayseq.data.preparation import DataError, PrepareOptions, prepare
from rayseq.data.subword import BPEJoiner, BPEVocab, train_bpe, vocab_from_spec
from rayseq.data.text import UNK, detokenize, tokenize
from rayseq.distributed.driver import Trainer
from rayseq.tasks.chitchat import ChitchatTask
from tests.conftest import write_corpus

TEXTS = ["hello there , how are you ?", "i ' m fine , thanks ! and you ?", "igloos are cold ; it ' s 3 . 5 degrees",
         "supercalifragilistic words split into pieces", "i think i like it"]


@pytest.fixture(scope="module")
def bpe() -> BPEVocab:
    return train_bpe([t.split() for t in TEXTS], 60)  # a small vocabulary: most words are several pieces


def test_words_round_trip_and_no_unknown_on_training_text(bpe):
    assert len(bpe) <= 60 and bpe.itos[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    for text in TEXTS:
        words = text.split()
        ids = bpe.encode_words(words)
        assert bpe.specials.unk not in ids  # every training character is in the alphabet
        assert bpe.words(ids) == words  # the </w> pieces say where words end
        assert bpe.decode_text(ids) == detokenize(words)
        assert bpe.words(np.r_[ids, bpe.specials.eos, ids]) == words  # up to the end token
    assert len(bpe.encode_words(["supercalifragilistic"])) > 1  # a rare word is split, not <unk>
    # a character training never saw is <unk>, a word of its own
    assert bpe.words(bpe.encode_words(["zz", "hello"])) == [UNK, UNK, "hello"]
    # text in, the last max_len pieces out (as inputs are truncated)
    ids = bpe.encode_text("Hello there, how are you?", 3)
    assert ids.tolist() == bpe.encode_words(tokenize("hello there , how are you ?"))[-3:].tolist()


def test_spec_round_trip(bpe):
    again = vocab_from_spec(json.loads(json.dumps(bpe.to_spec())))
    assert isinstance(again, BPEVocab) and again.itos == bpe.itos
    assert again.encode_words(TEXTS[3].split()).tolist() == bpe.encode_words(TEXTS[3].split()).tolist()
    assert type(vocab_from_spec({"itos": ["<pad>", "<bos>", "<eos>", "<unk>", "a"]})).__name__ == "Vocab"
    bad = dict(bpe.to_spec(), itos=bpe.itos[:-1])
    with pytest.raises(ValueError, match="itos differs"):
        vocab_from_spec(bad)


@pytest.mark.parametrize("truecase", [False, True])
def test_joiner_pieces_concatenate_to_the_text(bpe, truecase):
    """Streaming: each piece's text is known as it comes (a word's first piece is placed, the rest appended) and
    they concatenate to the whole reply's text; peek says what push will add."""
    for text in [*TEXTS, "i like igloos . i said it"]:
        ids = bpe.encode_words(text.split())
        joiner, pieces = BPEJoiner(bpe, truecase), []
        for tid in ids:
            peeked = joiner.peek(tid)
            pieces.append(joiner.push(tid))
            assert peeked == pieces[-1]
        assert "".join(pieces) == bpe.decode_text(ids, truecase=truecase)
    joiner = BPEJoiner(bpe, truecase=True)
    words = "i like igloos . i said it".split()
    assert "".join(joiner.push(t) for t in bpe.encode_words(words)) == "I like igloos. I said it"


def test_prepare_option_is_validated(tmp_path, capsys):
    with pytest.raises(DataError, match="tokenizer must be one of words, bpe"):
        PrepareOptions(tokenizer="chars")
    src = write_corpus(tmp_path / "p.jsonl", 20)
    assert prepare_main(["prepare", f"jsonl:{src}", "--out", str(tmp_path / "x"), "--tokenizer", "wordpiece"]) == 2
    assert "tokenizer must be one of words, bpe (got 'wordpiece')" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    with pytest.raises(DataError, match="vocab_size 10 is below the .* pieces the training split's characters need"):
        prepare(f"jsonl:{src}", tmp_path / "x", PrepareOptions(quiet=True, tokenizer="bpe", vocab_size=10))
    with pytest.raises(ConfigError, match="task.tokenizer"):
        build_config(None, ["task.name=chitchat", "task.tokenizer=chars"])


@pytest.fixture(scope="module")
def bpe_corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("bpe")
    out = d / "prepared"
    m = prepare(f"jsonl:{write_corpus(d / 'pairs.jsonl')}", out,
                PrepareOptions(quiet=True, valid_frac=0.1, test_frac=0.2, seed=0, tokenizer="bpe", vocab_size=60))
    assert m["tokenizer"]["kind"] == "bpe" and m["counts"]["train"]["unk_rate"] == 0.0
    return out


def tiny(corpus, *extra):
    return build_config(None, [
        "task.name=chitchat", f"task.data={corpus}", "task.tokenizer=bpe", "task.test_size=100", "model.emb_dim=16",
        "model.hidden_dim=32", "train.pretrain_iters=3", "train.pretrain_batch_size=32", "train.iters=0",
        "train.batch_size=32", "progress=false", "algo.name=reinforce", "rollout.num_workers=0", *extra])


def test_task_bans_unknown_and_counts_words(bpe_corpus):
    import sacrebleu

    data = DialogueData.load(bpe_corpus)
    assert isinstance(data.vocab, BPEVocab) and len(data.vocab) <= 60
    task = ChitchatTask(tiny(bpe_corpus).task)
    assert task.banned_ids == (task.specials.unk,)
    # BLEU-2 (the reward) on the words the pieces spell, as sacrebleu scores the detokenised words
    b = task.sample_prompts(np.random.default_rng(0), 8)
    refs = task.references(b.key)
    tokens = np.zeros((8, task.max_tgt_len), np.int64)
    made_up = [refs[i][0][: max(1, len(refs[i][0]) - 2)] for i in range(8)]  # a reference cut short
    for i, r in enumerate(made_up):
        tokens[i, : len(r)] = r
        tokens[i, len(r)] = task.specials.eos
    mask = (tokens != 0).astype(np.float32)
    _, score = task.rewards(b.src, b.src_len, tokens, mask, key=b.key)
    bleu = sacrebleu.metrics.BLEU(max_ngram_order=2, tokenize="none", effective_order=True)
    for i in range(8):
        hyp = " ".join(task.vocab.words(made_up[i]))
        expected = bleu.sentence_score(hyp, [" ".join(task.vocab.words(r)) for r in refs[i]]).score / 100
        assert score[i] == pytest.approx(expected, abs=1e-6)
    assert task.bleu_inputs(tokens, task.reply_lengths(tokens, mask), b.key)[1].tolist() == [
        len(task.vocab.words(r)) for r in made_up]


def test_a_subword_model_never_replies_unknown_and_resume_keeps_the_tokenizer(bpe_corpus, tmp_path):
    from rayseq.serving.model import ChatModel, GenRequest
    from rayseq.train import main

    run = tmp_path / "run"
    summary = Trainer(tiny(bpe_corpus, f"run_dir={run}", "train.checkpoint_every=1")).run()
    ck = torch.load(summary["checkpoint"], weights_only=True)
    spec = json.loads((bpe_corpus / "vocab.json").read_text())
    assert ck["task"]["vocab"]["bpe"] == spec["bpe"] and ck["task"]["banned_ids"] == [3]
    # resumed for two REINFORCE iterations: the same tokenizer, and the run goes on
    assert main([f"run_dir={run}", "train.iters=2", "--resume"]) == 0
    ck2 = torch.load(sorted((run / "checkpoints").glob("ckpt_*.pt"))[-1], weights_only=True)
    assert ck2["task"]["vocab"] == ck["task"]["vocab"] and ck2["driver"]["iteration"] == 5
    # make <unk> the most likely token everywhere: still never emitted (training, evaluation, serving)
    model = ChatModel(run)
    assert isinstance(model.vocab, BPEVocab)
    model.generator.out.bias.data[3] = 1e4
    task = ChitchatTask(tiny(bpe_corpus).task)
    src, src_len, _ = task.split("test")
    task_gen = model.generator
    for seed in (None, 1):
        tokens, mask = task.decode(task_gen, src, src_len, seed=seed)
        assert not (tokens[mask > 0] == 3).any()
    out = model.generate([GenRequest(text="hi there", temperature=t, n=4, seed=0, max_tokens=8) for t in (0.0, 1.5)])
    for r in out:
        assert all("…" not in reply for reply in r.replies), r.replies
    assert model.generate([GenRequest(text="zebra hello", max_tokens=3)])[0].unknown_words == ["zebra"]


def test_tokenizer_must_match_the_dataset(corpus):
    with pytest.raises(DataError, match="prepared with the words tokenizer, task.tokenizer=bpe"):
        ChitchatTask(tiny(corpus).task)
