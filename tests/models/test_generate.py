"""Serving-time decoding (Seq2SeqGRU.generate) and tokenisation: per-row settings, reproducibility
independent of the batch, top-k, top-p, never emitting <pad>/<bos>; checked against plain loops.
Detokenisation: readable text, no special tokens, and it tokenises back to the same tokens."""

from __future__ import annotations

import pytest
import torch

from rayseq.data.text import UNK_SHOWN, Joiner, detokenize, detokenize_pieces, tokenize
from rayseq.models.generator import Seq2SeqGRU

V = 14


def model():
    torch.manual_seed(0)
    m = Seq2SeqGRU(V, emb_dim=16, hidden_dim=16)
    m.eval()
    return m


def batch(B=6, S=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    src_len = torch.randint(1, S + 1, (B,), generator=g)
    return src, src_len


def gens(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


def test_greedy_rows_equal_greedy_decoding_except_banned_tokens():
    m = model()
    src, sl = batch()
    B = len(sl)
    out = m.generate(src, sl, torch.full((B,), 4), torch.zeros(B), torch.zeros(B, dtype=torch.long), gens(range(B)))
    # the same loop by hand: argmax over logits with <pad>/<bos> excluded
    for i in range(B):
        h = m.encode(src[i : i + 1], sl[i : i + 1])
        tok = torch.tensor([m.bos_id])
        for t in range(4):
            logits, _, h = m.decode_step(tok, h)
            logits[:, [m.pad_id, m.bos_id]] = float("-inf")
            tok = logits.argmax(-1)
            assert out.tokens[i, t] == tok.item()
            if tok.item() == m.eos_id:
                break


def test_a_seeded_row_does_not_depend_on_its_batch_neighbours():
    m = model()
    src, sl = batch(B=5)
    B = 5
    temps, ks = torch.tensor([1.0, 0.7, 1.3, 1.0, 0.0]), torch.tensor([0, 3, 0, 5, 0])
    caps = torch.tensor([6, 2, 9, 4, 6])  # neighbours with other length caps change nothing either
    full = m.generate(src, sl, caps, temps, ks, gens([11, 12, 13, 14, 15]))
    for i in range(B):
        alone = m.generate(src[i : i + 1], sl[i : i + 1], caps[i : i + 1], temps[i : i + 1], ks[i : i + 1],
                           gens([11 + i]))
        n = alone.tokens.shape[1]
        assert torch.equal(alone.tokens[0], full.tokens[i, :n])


def test_per_row_length_caps_and_masks():
    m = model()
    src, sl = batch(B=3)
    out = m.generate(src, sl, torch.tensor([1, 3, 5]), torch.ones(3), torch.zeros(3, dtype=torch.long), gens([1, 2, 3]))
    lengths = out.token_mask.sum(1)
    assert (lengths <= torch.tensor([1, 3, 5])).all()
    assert (out.tokens[out.token_mask == 0] == m.pad_id).all()


def first_step():
    """A model, one input and the logits (1, V) of its first reply token, <pad>/<bos> masked as sampling does."""
    m = model()
    src, sl = batch(B=1)
    logits, _, _ = m.decode_step(torch.tensor([m.bos_id]), m.encode(src, sl))
    logits[:, [m.pad_id, m.bos_id]] = float("-inf")
    return m, src, sl, logits


def test_top_k_samples_only_among_the_k_most_likely():
    m, src, sl, logits = first_step()
    top2 = set(logits[0].topk(2).indices.tolist())
    seen = set()
    for s in range(200):
        out = m.generate(src, sl, torch.tensor([1]), torch.tensor([2.0]), torch.tensor([2]), gens([s]))
        seen.add(out.tokens[0, 0].item())
    assert seen == top2  # 200 draws at temperature 2: both appear, nothing else does


def test_never_emits_pad_or_bos_even_when_they_are_likely():
    m = model()
    with torch.no_grad():
        m.out.bias[m.pad_id] = 50.0
        m.out.bias[m.bos_id] = 50.0
    src, sl = batch()
    B = len(sl)
    out = m.generate(src, sl, torch.full((B,), 5), torch.ones(B), torch.zeros(B, dtype=torch.long), gens(range(B)))
    real = out.tokens[out.token_mask > 0]
    assert not ((real == m.pad_id) | (real == m.bos_id)).any()


def test_tokenize_words_and_chars():
    assert tokenize("How's the Weather?") == ["how", "'", "s", "the", "weather", "?"]
    assert tokenize("9 2 3", "chars") == ["9", "2", "3"] == tokenize("923", "chars")
    assert tokenize("   ", "words") == []
    assert detokenize(["i", "am", "fine", "."]) == "i am fine."


def test_top_p_samples_only_in_the_nucleus():
    m, src, sl, logits = first_step()
    # the nucleus by hand: most likely first, keep tokens while the mass before them is < p
    probs = torch.softmax(logits[0] / 1.5, -1)
    order = probs.argsort(descending=True).tolist()
    nucleus, mass = set(), 0.0
    for t in order:
        if mass >= 0.5:
            break
        nucleus.add(t)
        mass += probs[t].item()
    assert 1 < len(nucleus) < V - 2  # a real cut on this model
    seen = set()
    for s in range(300):
        out = m.generate(src, sl, torch.tensor([1]), torch.tensor([1.5]), torch.tensor([0]), gens([s]),
                         top_p=torch.tensor([0.5]))
        seen.add(out.tokens[0, 0].item())
    assert seen == nucleus


def test_top_p_one_cuts_nothing_and_rows_stay_independent():
    m = model()
    src, sl = batch(B=4)
    caps, temps, ks = torch.tensor([5, 3, 6, 4]), torch.tensor([1.0, 0.8, 1.2, 0.0]), torch.tensor([0, 0, 4, 0])
    top_p = torch.tensor([1.0, 0.3, 0.9, 0.5])
    plain = m.generate(src, sl, caps, temps, ks, gens([1, 2, 3, 4]))
    ones = m.generate(src, sl, caps, temps, ks, gens([1, 2, 3, 4]), top_p=torch.ones(4))
    assert torch.equal(plain.tokens, ones.tokens)
    full = m.generate(src, sl, caps, temps, ks, gens([1, 2, 3, 4]), top_p=top_p)
    for i in range(4):
        alone = m.generate(src[i : i + 1], sl[i : i + 1], caps[i : i + 1], temps[i : i + 1], ks[i : i + 1],
                           gens([1 + i]), top_p=top_p[i : i + 1])
        assert torch.equal(alone.tokens[0], full.tokens[i, : alone.tokens.shape[1]])
    assert torch.equal(full.tokens[0], plain.tokens[0])  # row 0 has top_p = 1: as without top-p
    assert torch.equal(full.tokens[3], plain.tokens[3])  # row 3 is greedy: top-p changes nothing


@pytest.mark.parametrize(("text", "expected"), [
    ("I'm fine, thanks.", "i'm fine, thanks."),
    ("Don't worry! What's up?", "don't worry! what's up?"),
    ('He said "hi there".', 'he said "hi there".'),
    ("the cats' toys", "the cats' toys"),
    ("it costs $3.5 (ok)", "it costs $3.5 (ok)"),
    ("'hello' she said", "'hello' she said"),
    ("we'll see... you're 10:30 late, 1,000 times", "we'll see... you're 10:30 late, 1,000 times"),
])
def test_detokenize_reads_like_text_and_tokenizes_back(text, expected):
    tokens = tokenize(text)
    assert detokenize(tokens) == expected
    assert tokenize(detokenize(tokens)) == tokens
    assert "".join(detokenize_pieces(tokens)) == expected


def test_detokenize_hides_special_tokens_and_truecases():
    tokens = ["<bos>", "i", "'", "m", "from", "<unk>", ".", "and", "you", "?", "<eos>", "<pad>"]
    assert detokenize(tokens) == f"i'm from {UNK_SHOWN}. and you?"
    assert detokenize(tokens, truecase=True) == f"I'm from {UNK_SHOWN}. And you?"
    assert detokenize(["9", "<unk>", "2", "<eos>"], "chars") == f"9 {UNK_SHOWN} 2"
    # incremental: a token's piece depends on the tokens before it only, so peeking is exact
    j = Joiner("words", truecase=True)
    for t in ["i", "'"]:
        j.push(t)
    assert (j.peek("m"), j.peek("fine"), j.peek("?"), j.peek("<eos>")) == ("m", " fine", "?", "")
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        detokenize(["a"], "bytes")


# ------------------------------------------------------------------------------------- repetition controls


def test_penalize_by_hand():
    from rayseq.models.protocol import penalize

    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    counts = torch.tensor([[1.0, 2.0, 0.0, 0.0]])  # tokens 0 and 1 are in the reply (token 1 twice)
    one = torch.ones(1)
    # CTRL θ = 2: 2 / 2 = 1 (positive: divided), −1 · 2 = −2 (negative: multiplied); unseen tokens unchanged
    assert penalize(logits, counts, 2 * one, 0 * one, 0 * one).tolist() == [[1.0, -2.0, 0.5, 3.0]]
    # presence 0.5 and frequency 0.25: 2 − 0.5 − 0.25 = 1.25, −1 − 0.5 − 0.5 = −2
    assert penalize(logits, counts, one, 0.5 * one, 0.25 * one).tolist() == [[1.25, -2.0, 0.5, 3.0]]


def test_repeated_ngram_bans_against_a_plain_loop():
    from rayseq.models.protocol import repeated_ngram_bans

    g = torch.Generator().manual_seed(0)
    reply = torch.randint(4, 8, (30, 12), generator=g)  # 4 symbols: many repeats
    for n in (1, 2, 3, 4):
        for t in range(0, 13):
            got = repeated_ngram_bans(reply[:, :t], n)
            for b in range(30):
                row = reply[b, :t].tolist()
                # every earlier n-gram whose first n − 1 tokens are the reply's last n − 1 bans its last token
                want = [row[i + n - 1] for i in range(t - n + 1) if row[i : i + n - 1] == row[t - n + 1 :]]
                assert sorted(set(got[b])) == sorted(set(want)), (n, t, b)


def test_generate_never_repeats_an_ngram_nor_emits_banned_ids_and_penalties_change_greedy():
    m = model()
    src, sl = batch(B=8)
    B = 8
    caps, temps, ks = torch.full((B,), 12), torch.tensor([0.0, 1.5] * 4), torch.zeros(B, dtype=torch.long)
    with torch.no_grad():  # no end token: long replies over few symbols, so the rules must act
        m.out.bias[m.eos_id] = -1e4
    plain = m.generate(src, sl, caps, temps, ks, gens(range(B)))
    out = m.generate(src, sl, caps, temps, ks, gens(range(B)), no_repeat_ngram_size=torch.full((B,), 2),
                     banned_ids=(3, 5))
    for row in out.tokens.tolist():
        bigrams = list(zip(row, row[1:]))
        assert len(bigrams) == len(set(bigrams)) and not {3, 5} & set(row)
    assert any(len(set(zip(r, r[1:]))) < len(r) - 1 for r in plain.tokens.tolist())  # without it, repeats
    # a greedy row by hand with the CTRL penalty θ = 3 and presence 1: the argmax of the penalised logits
    theta, presence = 3.0, 1.0
    pen = m.generate(src[:1], sl[:1], caps[:1], torch.zeros(1), ks[:1], gens([0]),
                     repetition_penalty=torch.tensor([theta]), presence_penalty=torch.tensor([presence]))
    h = m.encode(src[:1], sl[:1])
    tok, seen = torch.tensor([m.bos_id]), set()
    for t in range(12):
        logits, _, h = m.decode_step(tok, h)
        z = logits[0].clone()
        for s in seen:
            z[s] = (z[s] / theta if z[s] > 0 else z[s] * theta) - presence
        tok = z.argmax().view(1)
        assert pen.tokens[0, t].item() == tok.item()
        seen.add(tok.item())
    assert len(set(pen.tokens[0].tolist())) > len(set(plain.tokens[0].tolist()))  # it repeats less
