"""ChatModel (serving's text in, text out) on hand-made checkpoints, no Ray, no training: model names by
what produced the weights, readable replies without special tokens, stop strings, finish reasons,
OpenAI-style log-probs whose pieces are the reply's text."""

from __future__ import annotations

import math

import pytest
import torch

from rayseq.config import config_to_dict
from rayseq.data.text import UNK_SHOWN
from rayseq.models.generator import build_generator
from rayseq.serving.model import ChatModel, GenRequest, produced_by
from rayseq.vocab import Vocab
from tests.conftest import tiny_config

WORDS = ["i", "'", "m", "fine", ",", "thanks", ".", "you", "?", "hello", "don", "t", "know"]


def make_checkpoint(path, *, task="chitchat", words=WORDS, kind="words", max_tgt_len=8, stage="train",
                    stage_iter=50, iteration=1550, algo="ppo", pretrain_iters=1500, bias=None):
    """A checkpoint file with a random generator; ``bias`` {token: logit bias} steers its choices."""
    cfg = config_to_dict(tiny_config(f"algo.name={algo}", f"train.pretrain_iters={pretrain_iters}"))
    vocab = Vocab(list(words))
    torch.manual_seed(0)
    gen = build_generator(len(vocab), tiny_config().model, vocab.specials)
    with torch.no_grad():
        for tok, b in (bias or {}).items():
            gen.out.bias[vocab.stoi[tok]] += b
    ck = {
        "format": "rayseq-checkpoint-v1", "config": cfg,
        "task": {"name": task, "vocab": vocab.to_spec(), "max_src_len": 10, "max_tgt_len": max_tgt_len,
                 "tokenizer": {"kind": kind, "lowercase": True}},
        "learner": {"generator": gen.state_dict()},
        "driver": {"iteration": iteration, "stage": stage, "stage_iter": stage_iter},
    }
    torch.save(ck, path)
    return str(path)


@pytest.mark.parametrize(("stage", "stage_iter", "iteration", "name"), [
    ("mle", 234, 234, "rayseq-chitchat-mle-it234"),  # still pretraining: not labelled with the RL algorithm
    ("disc", 10, 1510, "rayseq-chitchat-mle-it1500"),  # SeqGAN's D pretraining: G is the MLE model
    ("train", 0, 1500, "rayseq-chitchat-mle-it1500"),  # pretrain-only run (train.iters=0)
    ("train", 50, 1550, "rayseq-chitchat-ppo-it50"),  # 50 PPO iterations after MLE
])
def test_model_is_named_by_what_produced_it(tmp_path, stage, stage_iter, iteration, name):
    m = ChatModel(make_checkpoint(tmp_path / "ck.pt", stage=stage, stage_iter=stage_iter, iteration=iteration))
    assert m.model_id == name
    assert m.info["algo"] == "ppo" and m.info["stage"] == stage and m.info["iteration"] == iteration
    assert m.info["produced_by"] == name.split("-")[2]
    ck = {"driver": {"stage": stage, "stage_iter": stage_iter}, "config": {"algo": {"name": "ppo"},
                                                                           "train": {"pretrain_iters": 1500}}}
    assert produced_by(ck) == (name.split("-")[2], int(name.rsplit("it", 1)[1]))


def test_replies_read_like_text_without_special_tokens(tmp_path):
    m = ChatModel(make_checkpoint(tmp_path / "ck.pt"))
    seq = [m.vocab.stoi[w] for w in ["i", "'", "m", "fine"]] + [m.vocab.specials.unk, m.vocab.stoi["."]]
    # i ' m fine <unk> . <eos>  ->  contraction closed up, sentence start and "i" capitalised, <unk> shown as …
    text, reason, n_tokens, pieces, entries = m._reply(seq + [m.vocab.specials.eos], GenRequest("hi"), None)
    assert text == f"I'm fine {UNK_SHOWN}." and reason == "stop" and n_tokens == 7
    assert pieces == ["I", "'", "m", " fine", f" {UNK_SHOWN}", "."] and entries is None
    _, reason, n_tokens, _, _ = m._reply(seq, GenRequest("hi"), None)  # no end token: the cap cut it
    assert reason == "length" and n_tokens == 6


def test_generated_replies_never_show_special_tokens(tmp_path):
    m = ChatModel(make_checkpoint(tmp_path / "ck.pt", bias={"<unk>": 3.0, "<eos>": -2.0}))
    out = m.generate([GenRequest("hello", temperature=1.5, n=8, seed=0, max_tokens=8)])[0]
    # <unk> made likely (bias 3) is still never sampled: serving bans it, greedy or sampled
    assert not any(UNK_SHOWN in r for r in out.replies)
    assert UNK_SHOWN not in m.generate([GenRequest("hello", max_tokens=8)])[0].replies[0]
    for r, pieces in zip(out.replies, out.pieces):
        assert not any(s in r for s in ("<unk>", "<eos>", "<pad>", "<bos>"))
        assert "".join(pieces) == r


def test_stop_strings_cut_the_reply_and_count_the_tokens_decoded(tmp_path):
    m = ChatModel(make_checkpoint(tmp_path / "ck.pt"))
    ids = [m.vocab.stoi[w] for w in ["hello", ",", "you", "know", "?"]] + [m.vocab.specials.eos]
    # "hello, you know?" ; stop ", y" completes at "you" (the 3rd token): text before it, 3 tokens decoded
    text, reason, n, pieces, _ = m._reply(ids, GenRequest("x", stop=(", y", "zzz")), None)
    assert (text, reason, n, pieces) == ("Hello", "stop", 3, ["Hello"])
    # the earliest occurrence wins, whichever stop string it is; a piece cut in the middle is shortened
    text, reason, n, pieces, _ = m._reply(ids, GenRequest("x", stop=("now", "llo")), None)
    assert (text, n, pieces) == ("He", 1, ["He"])
    text, _, n, pieces, _ = m._reply(ids, GenRequest("x", stop=("ou k",)), None)
    assert (text, n, "".join(pieces)) == ("Hello, y", 4, "Hello, y")
    # a stop string that never appears changes nothing (the end token is counted, as without stop)
    assert m._reply(ids, GenRequest("x", stop=("!",)), None)[:3] == ("Hello, you know?", "stop", 6)
    # through generate: the cut reply is a prefix of the uncut one with the same seed
    full = m.generate([GenRequest("hello", temperature=1.0, seed=3, n=4, max_tokens=8)])[0]
    cut = m.generate([GenRequest("hello", temperature=1.0, seed=3, n=4, max_tokens=8, stop=(" ",))])[0]
    for a, b, reason in zip(full.replies, cut.replies, cut.finish_reasons):
        assert a.startswith(b) and " " not in b
        assert reason == "stop" or b == a


def test_counting_replies_are_complete_at_three_digits(tmp_path):
    """Counting's replies are exactly 3 digits with no end token: 3 digits is a finished reply ("stop"),
    decoding stops there whatever max_tokens says, and only a smaller cap is "length"."""
    m = ChatModel(make_checkpoint(tmp_path / "ck.pt", task="counting", words=[str(d) for d in range(10)],
                                  kind="chars", max_tgt_len=3, bias={"<eos>": -50.0}))
    long, short = m.generate([GenRequest("9 2 3", max_tokens=20), GenRequest("9 2 3", max_tokens=2)])
    assert len(long.replies[0].split()) == 3 and long.finish_reasons == ["stop"] and long.completion_tokens == 3
    assert len(short.replies[0].split()) == 2 and short.finish_reasons == ["length"]
    assert "9 2 3" in m.info["about"] and "0 9 2, 1 2 1 and 2 3 0" in m.info["about"]


def test_logprobs_are_the_models_and_their_pieces_are_the_reply(tmp_path):
    m = ChatModel(make_checkpoint(tmp_path / "ck.pt", bias={"<eos>": -3.0}))
    reqs = [GenRequest("hello", temperature=1.0, seed=5, n=2, max_tokens=8, logprobs=4),
            GenRequest("i know", temperature=0.0, max_tokens=8, logprobs=0), GenRequest("you", max_tokens=8)]
    res = m.generate(reqs)
    assert res[2].logprobs == [None]
    # the chosen tokens' log-probs are those of the decoder that sampled them (π_θ at temperature 1)
    ids, _, _ = m.encode("hello")
    src = torch.tensor([ids, ids])
    out = m.generator.generate(src, torch.tensor([len(ids)] * 2), torch.tensor([8, 8]), torch.ones(2),
                               torch.zeros(2, dtype=torch.long),
                               [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)],
                               banned_ids=m.banned_ids)  # serving never emits <unk>
    for i, (reply, entries) in enumerate(zip(res[0].replies, res[0].logprobs)):
        assert "".join(e["token"] for e in entries) == reply
        assert [e["logprob"] for e in entries] == pytest.approx(out.logp[i, : len(entries)].tolist(), abs=1e-5)
        for e in entries:
            top = e["top_logprobs"]
            assert len(top) == 4 and all(a["logprob"] >= b["logprob"] for a, b in zip(top, top[1:]))
            assert sum(math.exp(t["logprob"]) for t in top) <= 1 + 1e-6
            assert e["logprob"] <= top[0]["logprob"] + 1e-6
            assert e["bytes"] == list(e["token"].encode())
            assert all(t["token"] == "<eos>" or t["bytes"] == list(t["token"].encode()) for t in top)
    greedy = res[1].logprobs[0]
    assert greedy and all(e["top_logprobs"] == [] for e in greedy)
    assert "".join(e["token"] for e in greedy) == res[1].replies[0]
