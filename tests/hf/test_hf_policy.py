"""HFCausalLM (rayseq/models/hf.py): the rayseq policy interface on a tiny local GPT-2 (tests/hf_fixtures.py)."""

from __future__ import annotations

import pytest
import torch

from rayseq.data.hf_text import HFVocab
from rayseq.models.hf import HFCausalLM


@pytest.fixture(scope="module")
def vocab(hf_dir):
    return HFVocab(str(hf_dir))


@pytest.fixture(scope="module")
def policy(hf_dir, vocab):
    torch.manual_seed(0)
    return HFCausalLM(str(hf_dir), vocab.specials, vocab_size=len(vocab)).eval()


def _prompts(vocab, texts):
    rows = [vocab.encode_text(t, 50) for t in texts]
    S = max(len(r) for r in rows)
    src = torch.full((len(rows), S), vocab.specials.pad, dtype=torch.long)
    for i, r in enumerate(rows):
        src[i, : len(r)] = torch.from_numpy(r)
    return src, torch.tensor([len(r) for r in rows])


TEXTS = ["hi there", "hey , how are you ?", "do you like music or movies ?"]


def test_sampled_logprobs_equal_teacher_forced(policy, vocab):
    """The log-probs sample() returns (incremental, with the KV cache) are those logprobs() computes for the same
    tokens in one pass; 0 after a reply's end."""
    src, src_len = _prompts(vocab, TEXTS)
    out = policy.sample(src, src_len, 12, generator=torch.Generator().manual_seed(1))
    tf = policy.logprobs(src, src_len, out.tokens)
    assert torch.allclose(out.logp, tf.logp, atol=1e-5)
    assert torch.all(tf.logp[out.token_mask == 0] == 0)
    assert tf.states.shape == (*out.tokens.shape, policy.hidden_dim)
    assert tf.logits.shape == (*out.tokens.shape, policy.vocab_size)


def test_step_building_blocks_agree_with_the_lm(policy, vocab):
    """advance + output_logits (the step protocol) give decode_step's logits, and output_logits on logprobs' states
    gives its logits: the LM head is a linear map of the last hidden layer."""
    src, src_len = _prompts(vocab, TEXTS)
    tokens = torch.tensor([[10, 20, 30, vocab.specials.eos]] * 3)
    tf = policy.logprobs(src, src_len, tokens)
    assert torch.allclose(policy.output_logits(tf.states), tf.logits, atol=1e-4)
    logits, hidden, _ = policy.decode_step(torch.full((3,), vocab.specials.bos), policy.encode(src, src_len))
    out, _ = policy.advance(torch.full((3,), vocab.specials.bos), policy.encode(src, src_len))
    assert torch.allclose(out, hidden) and torch.allclose(policy.output_logits(out), logits, atol=1e-4)
    assert policy.state_dim == policy.hidden_dim == 32


def test_rows_do_not_depend_on_their_batch(policy, vocab):
    """Left-aligned prompts with position ids of real tokens: a prompt's log-probs are the same alone and in a batch
    with longer prompts."""
    src, src_len = _prompts(vocab, TEXTS)
    tokens = torch.tensor([[10, 20, 30, vocab.specials.eos]] * 3)
    batch = policy.logprobs(src, src_len, tokens).logp
    for i in range(3):
        alone = policy.logprobs(src[i : i + 1, : src_len[i]], src_len[i : i + 1], tokens[i : i + 1]).logp
        assert torch.allclose(batch[i], alone[0], atol=1e-5)


def test_greedy_is_argmax_and_specials_are_banned(policy, vocab):
    src, src_len = _prompts(vocab, TEXTS)
    tokens = policy.greedy(src, src_len, 8)
    tf = policy.logprobs(src, src_len, tokens)
    mask = (torch.cumsum((tokens == vocab.specials.eos).long(), 1) - (tokens == vocab.specials.eos).long()) == 0
    assert torch.equal(tf.logits.argmax(-1)[mask], tokens[mask])
    first = policy.first_step_logprobs(src, src_len)
    assert torch.allclose(first, torch.log_softmax(tf.logits[:, 0], -1), atol=1e-5)
    s = vocab.specials
    assert torch.all(torch.isinf(first[:, [s.pad, s.bos]])) and torch.all(torch.isfinite(first[:, s.eos]))
    # high temperature: banned ids are still never drawn
    out = policy.sample(src.repeat(20, 1), src_len.repeat(20), 8, temperature=5.0,
                        generator=torch.Generator().manual_seed(0))
    assert not ((out.tokens == s.bos) | ((out.tokens == s.pad) & (out.token_mask > 0))).any()


def test_generate_matches_logprobs(policy, vocab):
    """Serving-time decoding (per-row temperature, seeds): greedy rows equal greedy(); logp at temperature 1."""
    src, src_len = _prompts(vocab, TEXTS)
    B = len(TEXTS)
    out = policy.generate(src, src_len, torch.tensor([6, 6, 6]), torch.tensor([0.0, 1.0, 0.7]),
                          torch.tensor([0, 0, 5]), [torch.Generator().manual_seed(i) for i in range(B)])
    tf = policy.logprobs(src, src_len, out.tokens)
    assert torch.allclose(out.logp, tf.logp, atol=1e-5)
    greedy = policy.greedy(src, src_len, 6)
    n = min(greedy.shape[1], out.tokens.shape[1])
    assert torch.equal(out.tokens[0, :n][out.token_mask[0, :n] > 0], greedy[0, :n][out.token_mask[0, :n] > 0])


def test_generate_draws_as_the_rnn_loop_does(policy, vocab):
    """HFCausalLM.generate draws each row's uniforms step by step (no (B, T, V) array): the same replies as
    Seq2SeqGRU.generate's loop (all uniforms up front) run on this model, for every sampling setting."""
    from rayseq.models.generator import Seq2SeqGRU

    src, src_len = _prompts(vocab, TEXTS * 2)
    args = (torch.tensor([7, 3, 9, 7, 5, 1]), torch.tensor([1.0, 0.0, 1.3, 0.8, 1.0, 2.0]),
            torch.tensor([0, 0, 5, 0, 20, 0]))
    top_p = torch.tensor([1.0, 1.0, 1.0, 0.9, 0.5, 1.0])

    def gens():
        return [torch.Generator().manual_seed(10 + i) for i in range(6)]

    lean = policy.generate(src, src_len, *args, gens(), top_p=top_p)
    ref = Seq2SeqGRU.generate(policy, src, src_len, *args, gens(), top_p=top_p)
    for a, b in zip(lean, ref):
        assert torch.equal(a, b)
    assert lean.tokens.shape[1] == 9 and (lean.token_mask.sum(1) <= args[0]).all()


def test_state_dict_is_the_trained_weights(hf_dir, vocab, policy):
    """Full fine-tuning: every parameter once (GPT-2's tied lm_head not twice); LoRA: only the adapters. A round
    trip restores the policy's outputs."""
    sd = policy.state_dict()
    assert len(sd) == len(list(policy.parameters()))
    assert not any("lm_head" in k for k in sd)
    other = HFCausalLM(str(hf_dir), vocab.specials, vocab_size=len(vocab)).eval()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.1)
    other.load_state_dict(sd)
    src, src_len = _prompts(vocab, TEXTS)
    tokens = torch.tensor([[10, 20, 2]] * 3)
    assert torch.allclose(other.logprobs(src, src_len, tokens).logp, policy.logprobs(src, src_len, tokens).logp)
    lora = HFCausalLM(str(hf_dir), vocab.specials, vocab_size=len(vocab), lora_r=4, lora_target_modules=["c_attn"])
    keys = list(lora.state_dict())
    assert keys and all("lora_" in k for k in keys)
    assert {n for n, p in lora.named_parameters() if p.requires_grad} == set(keys)


def test_lora_reference_is_the_base_model(hf_dir, vocab, policy):
    """With adapters, π_ref is the model with them disabled: the base weights' log-probs, also after the adapters
    have moved; the policy itself changes."""
    lora = HFCausalLM(str(hf_dir), vocab.specials, vocab_size=len(vocab), lora_r=4, lora_target_modules=["c_attn"])
    ref = lora.reference_policy()
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    src, src_len = _prompts(vocab, TEXTS)
    tokens = torch.tensor([[10, 20, 2]] * 3)
    base = policy.logprobs(src, src_len, tokens).logp
    assert torch.allclose(ref.logprobs(src, src_len, tokens).logp, base, atol=1e-5)
    assert not torch.allclose(lora.logprobs(src, src_len, tokens).logp, base, atol=1e-3)
    assert ref.state_dict() == {}


def test_tokenizer_larger_than_the_model_is_refused(hf_dir, vocab):
    with pytest.raises(ValueError, match="the tokenizer has 1000 tokens but the model only 400 output rows"):
        HFCausalLM(str(hf_dir), vocab.specials, vocab_size=1000)
