"""rollout.engine=vllm's engine against the policy it samples (rayseq.engines.vllm_engine): token ids in and out,
completions grouped per prompt, no banned id, seeds reproducible, the sampled tokens' log-probs those of the policy's
own computation within float32 kernels' differences; new weights (full and LoRA) loaded into the running model, its
checksum the policy's."""

from __future__ import annotations

import pytest
import torch

from rayseq.data.hf_text import HFVocab
from rayseq.engines import GenerationEngine
from rayseq.engines.vllm_engine import VLLMEngine, weights_checksum
from rayseq.models.hf import HFCausalLM
from tests.vllm.conftest import ENGINE_KWARGS


@pytest.fixture(scope="module")
def vocab(vllm_hf_dir):
    return HFVocab(str(vllm_hf_dir))


@pytest.fixture(scope="module")
def policy(vllm_hf_dir, vocab):
    return HFCausalLM(str(vllm_hf_dir), vocab.specials, vocab_size=len(vocab)).eval()


@pytest.fixture(scope="module")
def engine(policy):
    return VLLMEngine.for_policy(policy, seed=0, engine_kwargs=ENGINE_KWARGS)


def prompts(vocab, texts):
    ids = [vocab.encode_text(t, 64).tolist() for t in texts]
    src = torch.full((len(ids), max(map(len, ids))), vocab.specials.pad)
    for i, row in enumerate(ids):
        src[i, : len(row)] = torch.tensor(row)
    return src, torch.tensor([len(r) for r in ids])


def policy_logp(policy, src, src_len, out, n):
    with torch.no_grad():
        return policy.logprobs(src.repeat_interleave(n, 0), src_len.repeat_interleave(n, 0), out.tokens).logp


def test_generates_ids_with_the_policy_logprobs(engine, policy, vocab):
    assert isinstance(engine, GenerationEngine) and not engine.exact
    src, src_len = prompts(vocab, ["hi there", "hey , how are you ?", "do you like music or books ?"])
    out = engine.generate(src, src_len, 10, n=4, seed=7)
    assert out.tokens.shape[0] == 12 and out.tokens.shape[1] <= 10
    real = out.token_mask > 0
    assert set(out.tokens[real].tolist()).isdisjoint(policy.banned_ids)  # never pad or the separator
    lengths = real.sum(1)
    for b in range(12):  # an end token ends a completion (and only there); pad after it
        ids = out.tokens[b, : lengths[b]].tolist()
        assert vocab.specials.eos not in ids[:-1]
        assert (out.tokens[b, lengths[b]:] == vocab.specials.pad).all()
    # float32 on both sides: the engine's log-probs are the policy's up to kernel rounding
    diff = (out.logp - policy_logp(policy, src, src_len, out, 4)).abs()[real]
    assert diff.max() < 1e-3, diff.max()
    assert out.logp[real].lt(0).all() and out.logp[~real].eq(0).all()
    again = engine.generate(src, src_len, 10, n=4, seed=7)
    assert torch.equal(again.tokens, out.tokens)  # seeded per prompt: reproducible
    other = engine.generate(src, src_len, 10, n=4, seed=8)
    assert not torch.equal(other.tokens, out.tokens)
    # the 4 completions of a prompt differ from each other (sampled, not copied)
    assert len({tuple(r) for r in out.tokens[:4].tolist()}) > 1


def test_greedy_is_the_policy_greedy(engine, policy, vocab):
    src, src_len = prompts(vocab, ["hello !", "do you like games or food ?"])
    out = engine.generate(src, src_len, 8, temperature=0.0)
    with torch.no_grad():
        want = policy.greedy(src, src_len, 8)
    width = out.tokens.shape[1]
    assert torch.equal(out.tokens, want[:, :width])
    # greedy=True (the evaluation's greedy replies) is temperature 0, whatever the seed
    assert torch.equal(engine.generate(src, src_len, 8, greedy=True, seed=5).tokens, out.tokens)


def test_new_weights_are_the_ones_it_runs(engine, policy, vocab):
    src, src_len = prompts(vocab, ["hi there", "good , and you ?"])
    before = engine.generate(src, src_len, 8, n=2, seed=3)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.load_weights(policy.state_dict(), 5)
    assert engine.version == 5 and engine.checksum_diff < 1e-12
    got, want = engine.checksum(), weights_checksum(policy.parameters())
    assert got == pytest.approx(want, rel=1e-12)
    # the model vLLM runs computes with them: its prompt log-probs of a sequence are the policy's
    ids = vocab.encode_text("hey , how are you ? i am fine , thanks", 64).tolist()
    with torch.no_grad():
        want_lp = policy.model(input_ids=torch.tensor([ids])).logits.log_softmax(-1)[0, :-1]
    want_lp = want_lp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(engine.probe_logprobs(ids)), want_lp, atol=1e-3)
    after = engine.generate(src, src_len, 8, n=2, seed=3)
    diff = (after.logp - policy_logp(policy, src, src_len, after, 2)).abs()[after.token_mask > 0]
    assert diff.max() < 1e-3  # sampled with the new weights: their log-probs
    stale = (before.logp - policy_logp(policy, src, src_len, before, 2)).abs()[before.token_mask > 0]
    assert stale.max() > 1e-2  # (the old completions' are not)


def test_lora_adapters_are_merged_into_the_running_model(engine, vllm_hf_dir, vocab):
    lora = HFCausalLM(str(vllm_hf_dir), vocab.specials, vocab_size=len(vocab), lora_r=4).eval()
    with torch.no_grad():  # adapters that change the model (peft starts B at 0)
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    engine.policy = lora  # the engine of a worker whose policy is this LoRA model
    engine.load_weights(lora.state_dict(), 6)
    assert engine.checksum_diff < 1e-12
    src, src_len = prompts(vocab, ["hey , how are you ?"])
    out = engine.generate(src, src_len, 8, n=3, seed=1)
    diff = (out.logp - policy_logp(lora, src, src_len, out, 3)).abs()[out.token_mask > 0]
    assert diff.max() < 1e-3
