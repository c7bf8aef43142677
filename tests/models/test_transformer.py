"""TransformerGenerator (model.arch=transformer): the KV cache against uncached decoding, the phase methods the
algorithms use (sampled log-probs = teacher-forced ones, greedy, banned ids, MIXER's forced prefix, serving's
generate), the decoder-only variant, and Monte-Carlo search from cached prefix states against the plain loop.

"Uncached" is what a cache saves: at step t re-run the whole decoder over <bos>, y_1..y_{t−1} (one causal pass,
``logprobs``) and read its last position; "cached" steps ``decode_step`` one token at a time over the cache.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rayseq.config import ConfigError, build_config
from rayseq.models import TransformerGenerator, make_generator
from rayseq.models.factory import generator_from_parts
from rayseq.rewards.mc_search import draw_uniforms, mc_search, mc_search_loop, q_values
from rayseq.vocab import Specials

V, PAD, BOS, EOS = 14, 0, 1, 2


def make_model(conditional: bool = True, *, banned=(), layers: int = 2, seed: int = 0, dtype=torch.float64,
               eos_bias: float | None = None) -> TransformerGenerator:
    torch.manual_seed(seed)
    m = TransformerGenerator(V, hidden_dim=16, num_layers=layers, n_heads=4, ff_dim=24, max_positions=16,
                             conditional=conditional, banned_ids=banned)
    with torch.no_grad():
        m.out.weight.mul_(4.0)  # sharper than the default init: rows disagree, argmax is stable
        if eos_bias is not None:
            m.out.bias[EOS] = eos_bias
    return m.to(dtype).eval()


def make_batch(conditional: bool = True, B: int = 5, S: int = 6, seed: int = 0):
    """Right-padded sources with garbage past src_len (the mask must hide it); (B, 0) when unconditional."""
    g = torch.Generator().manual_seed(seed)
    if not conditional:
        return torch.zeros(B, 0, dtype=torch.long), torch.zeros(B, dtype=torch.long)
    src_len = torch.randint(1, S + 1, (B,), generator=g)
    src_len[0], src_len[1] = S, 1
    return torch.randint(4, V, (B, S), generator=g), src_len


def pad_to(x: torch.Tensor, T: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, T - x.shape[1]))


@pytest.mark.parametrize("conditional", [True, False])
def test_cached_steps_equal_uncached_decoding(conditional):
    model = make_model(conditional, dtype=torch.float32)
    src, src_len = make_batch(conditional)
    B, T = src.shape[0], 9
    tokens = torch.randint(3, V, (B, T), generator=torch.Generator().manual_seed(1))
    state = model.encode(src, src_len)
    tok = torch.full((B,), BOS)
    for t in range(T):
        cached, out, state = model.decode_step(tok, state)
        assert state[0].shape[2] == t + 1  # the cache holds <bos>, y_1..y_t
        # uncached: the whole prefix again, its last position
        full = model.logprobs(src, src_len, tokens[:, : t + 1])
        torch.testing.assert_close(cached, full.logits[:, t], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, full.states[:, t], atol=1e-5, rtol=1e-5)
        tok = tokens[:, t]


def test_padding_past_src_len_is_ignored():
    model = make_model()
    src, src_len = make_batch()
    tokens = torch.randint(3, V, (src.shape[0], 5))
    ref = model.logprobs(src, src_len, tokens).logp
    wider = torch.cat([src, torch.randint(4, V, (src.shape[0], 3))], 1)  # more garbage after the real tokens
    torch.testing.assert_close(model.logprobs(wider, src_len, tokens).logp, ref)
    for b in range(src.shape[0]):  # and each row alone, unpadded
        L = int(src_len[b])
        torch.testing.assert_close(model.logprobs(src[b : b + 1, :L], src_len[b : b + 1], tokens[b : b + 1]).logp,
                                   ref[b : b + 1])


@pytest.mark.parametrize("conditional", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampled_logp_equals_teacher_forced(conditional, temperature):
    model = make_model(conditional, eos_bias=1.0)
    src, src_len = make_batch(conditional, B=32)
    s = model.sample(src, src_len, 8, temperature=temperature, generator=torch.Generator().manual_seed(2))
    tf = model.logprobs(src, src_len, s.tokens).logp
    torch.testing.assert_close(s.logp, tf * s.token_mask)
    assert (s.token_mask.sum(1) < 8).any()  # some rows ended with EOS: their pad positions have logp 0
    assert (s.logp[s.token_mask == 0] == 0).all()


def test_greedy_is_the_argmax_of_the_teacher_forced_logits_and_serving_agrees():
    model = make_model()
    src, src_len = make_batch()
    g = model.greedy(src, src_len, 7)
    logits = model.logprobs(src, src_len, g).logits
    assert torch.equal(logits.argmax(-1), g)  # no EOS here (4× sharper random weights): every position is real
    B = src.shape[0]
    out = model.generate(src, src_len, torch.full((B,), 7), torch.zeros(B), torch.zeros(B, dtype=torch.long),
                         [None] * B)
    assert torch.equal(out.tokens, g)


def test_banned_ids_are_never_sampled_and_fix_the_oracle_length():
    # the oracle task bans every special (0-3): no EOS, so every sequence has max_len tokens
    model = make_model(False, banned=(0, 1, 2, 3), eos_bias=50.0)  # EOS would win every step if it were allowed
    src, src_len = make_batch(False, B=64)
    s = model.sample(src, src_len, 10, generator=torch.Generator().manual_seed(0))
    assert (s.tokens >= 4).all() and (s.token_mask == 1).all() and s.tokens.shape == (64, 10)
    logits = model.logprobs(src, src_len, s.tokens).logits
    assert torch.isneginf(logits[..., :4]).all() and torch.isfinite(logits[..., 4:]).all()
    assert model.banned_ids == (0, 1, 2, 3)


def test_mixer_forced_prefix():
    model = make_model()
    src, src_len = make_batch()
    B = src.shape[0]
    prefix = torch.randint(3, V, (B, 4), generator=torch.Generator().manual_seed(3))
    plen = torch.tensor([0, 1, 2, 4, 3])
    s = model.sample(src, src_len, 6, prefix=prefix, prefix_len=plen, generator=torch.Generator().manual_seed(4))
    for b in range(B):
        n = int(plen[b])
        assert torch.equal(s.tokens[b, :n], prefix[b, :n])
        assert (s.action_mask[b, :n] == 0).all() and (s.action_mask[b, n:] == s.token_mask[b, n:]).all()
    # forced or sampled, the recorded logp is the policy's
    torch.testing.assert_close(s.logp, model.logprobs(src, src_len, s.tokens).logp * s.token_mask)


def test_decoder_only_ignores_the_source_and_has_no_encoder():
    model = make_model(False)
    assert not hasattr(model, "encoder") and not hasattr(model.decoder[0], "cross_attn")
    tokens = torch.randint(4, V, (3, 6))
    a = model.logprobs(torch.zeros(3, 0, dtype=torch.long), torch.zeros(3, dtype=torch.long), tokens).logp
    b = model.logprobs(torch.randint(4, V, (3, 5)), torch.full((3,), 5), tokens).logp
    torch.testing.assert_close(a, b)
    # the state is only the self-attention cache: 2 tensors per layer
    assert len(model.encode(torch.zeros(3, 0, dtype=torch.long), torch.zeros(3, dtype=torch.long))) == 4


@pytest.mark.parametrize("conditional", [True, False])
def test_prefix_states_equal_stepping_the_cache(conditional):
    model = make_model(conditional, dtype=torch.float32)
    src, src_len = make_batch(conditional)
    tokens = torch.randint(3, V, (src.shape[0], 6))
    outs, states = model.prefix_states(src, src_len, tokens)
    # the generic StepDecoding.prefix_states steps advance() one token at a time
    ref_outs, ref_states = super(TransformerGenerator, model).prefix_states(src, src_len, tokens)
    assert len(outs) == len(states) == tokens.shape[1] - 1
    for o, r, s, rs in zip(outs, ref_outs, states, ref_states):
        torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-5)
        assert len(s) == len(rs)
        for x, y in zip(s, rs):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("conditional,banned", [(False, (0, 1, 2, 3)), (True, ())])
def test_batched_search_equals_plain_loop_under_shared_uniforms(conditional, banned):
    # as tests/rewards/test_mc_search.py does for the GRU: exact, in float64, with the same U[b, t−1, n, p]; the
    # batched search continues from cached keys/values, the loop re-runs every prefix
    model = make_model(conditional, banned=banned, eos_bias=None if banned else 4.0)
    B, T, N = 5, 7, 3
    src, src_len = make_batch(conditional, B=B)
    s = model.sample(src, src_len, T, generator=torch.Generator().manual_seed(1))
    tokens, mask = pad_to(s.tokens, T), pad_to(s.token_mask, T)
    u = draw_uniforms(B, T, N, torch.Generator().manual_seed(2)).double()
    batched = mc_search(model, src, src_len, tokens, mask, N, u=u)
    looped, _ = mc_search_loop(model, src, src_len, tokens, mask, N, u=u)
    assert torch.equal(batched.tokens, looped.tokens)
    assert torch.equal(batched.lengths, looped.lengths)
    for t in range(1, T):  # each continuation keeps its prefix
        assert torch.equal(batched.tokens[:, t - 1, :, :t], tokens[:, None, :t].expand(B, N, t))
    if banned:
        assert (batched.tokens >= 4).all() and (batched.lengths == T).all()
    else:
        assert (mask.sum(1) < T).any()  # some sequences ended: only their open prefixes were searched


def test_search_q_converges_to_the_exact_expectation():
    # in distribution: D(Y) = 1 if y_T == 5; for the last prefix Q = P(y_T = 5 | prefix), from the softmax
    model = make_model(False, banned=(0, 1, 2, 3), dtype=torch.float32)
    B, T, N = 4, 5, 4000
    src, src_len = make_batch(False, B=B)
    s = model.sample(src, src_len, T, generator=torch.Generator().manual_seed(0))
    c = mc_search(model, src, src_len, s.tokens, s.token_mask, N, generator=torch.Generator().manual_seed(1))
    q = q_values((c.tokens[..., -1] == 5).float(), (s.tokens[:, -1] == 5).float(), torch.full((B,), T))
    exact = torch.softmax(model.logprobs(src, src_len, s.tokens).logits[:, -1], -1)[:, 5]
    se = torch.sqrt(exact * (1 - exact) / N)
    assert (torch.abs(q[:, T - 2] - exact) < 4 * se + 1e-6).all(), (q[:, T - 2], exact)


def test_max_positions_is_a_clear_error():
    model = make_model()
    src, src_len = make_batch()
    with pytest.raises(ValueError, match="max_positions=16"):
        model.sample(src, src_len, 20)
    with pytest.raises(ValueError, match="source needs 17"):
        model.encode(torch.randint(4, V, (2, 17)), torch.full((2,), 17))


def test_config_arch_names_and_errors():
    cfg = build_config(None, ["model.arch=transformer", "model.hidden_dim=32", "model.ff_dim=40",
                              "model.num_layers=1"])
    task = SimpleNamespace(vocab=list(range(V)), specials=Specials(pad=PAD, bos=BOS, eos=EOS, unk=3),
                           conditional=True, banned_ids=())
    m = make_generator(cfg, task)
    assert isinstance(m, TransformerGenerator) and m.state_dim == 32 and len(m.decoder) == 1
    assert m.decoder[0].ff[0].out_features == 40
    # serving's rebuild from a checkpoint's model config has the same parameters
    again = generator_from_parts(cfg.model, task.vocab, task.specials)
    assert {k: v.shape for k, v in again.state_dict().items()} == {k: v.shape for k, v in m.state_dict().items()}
    with pytest.raises(ConfigError, match="unknown model 'gpt'"):
        build_config(None, ["model.arch=gpt"])
    with pytest.raises(ConfigError, match="multiple of model.n_heads=3"):
        build_config(None, ["model.arch=transformer", "model.n_heads=3"])
    with pytest.raises(ConfigError, match="is not a model class"):
        build_config(None, ["model.arch=rayseq.models.sampling:CHUNK_ROWS"])
    # a user's own class by import path, through the same protocol
    own = build_config(None, ["model.arch=rayseq.models.transformer:TransformerGenerator"])
    assert isinstance(make_generator(own, task), TransformerGenerator)


def test_parameter_count_of_the_counting_comparison_size():
    # benchmarks/transformer.py compares the GRU default (201,742 parameters on counting's 14 tokens) with
    # hidden_dim 96, ff_dim 192, one layer each side: within 10 % of it
    task = SimpleNamespace(vocab=list(range(14)), specials=Specials(pad=PAD, bos=BOS, eos=EOS, unk=3),
                           conditional=True, banned_ids=())
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    gru = make_generator(build_config(None, []), task)
    tf = make_generator(build_config(None, ["model.arch=transformer", "model.hidden_dim=96", "model.ff_dim=192"]),
                        task)
    assert n(gru) == 201_742 and math.isclose(n(tf), n(gru), rel_tol=0.1)


def test_parameter_count_of_the_chitchat_comparison_size():
    # benchmarks/transformer.py's chitchat part: the chit-chat benchmark's GRU (emb 64, hidden 128 on 4,000 tokens:
    # 920,992 parameters) against hidden_dim 96, ff_dim 192, one layer each side, 32 positions: within 10 % of it
    task = SimpleNamespace(vocab=list(range(4000)), specials=Specials(pad=PAD, bos=BOS, eos=EOS, unk=3),
                           conditional=True, banned_ids=())
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    gru = make_generator(build_config(None, ["model.emb_dim=64", "model.hidden_dim=128"]), task)
    tf = make_generator(build_config(None, ["model.arch=transformer", "model.hidden_dim=96", "model.ff_dim=192",
                                            "model.n_heads=4", "model.num_layers=1", "model.max_positions=32"]), task)
    assert n(gru) == 920_992 and math.isclose(n(tf), n(gru), rel_tol=0.1)


def _pass_with_checkpointing(model: TransformerGenerator, on: bool, src, src_len, tokens, a: torch.Tensor) -> tuple:
    """One teacher-forced pass with gradients and its backward: (logp, gradients, layer forward calls before the
    backward, after it, bytes of the tensors the graph saved, which a checkpointed layer's recomputation replaces)."""
    model.enable_checkpointing(on)
    calls = [0]
    hooks = [blk.ff.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))  # each layer's insides
             for blk in (*getattr(model, "encoder", ()), *model.decoder)]
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    torch.manual_seed(1)  # the dropout masks
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model.logprobs(src, src_len, tokens)
    before = calls[0]
    grads = torch.autograd.grad((a * out.logp).sum(), list(model.parameters()))
    for h in hooks:
        h.remove()
    return out.logp.detach(), grads, before, calls[0], saved[0]


@pytest.mark.parametrize("conditional", [True, False])
def test_activation_checkpointing_recomputes_the_layers_with_the_same_gradients(conditional):
    """``enable_checkpointing``: the log-probs and every parameter's gradient of a training pass with dropout 0.1 equal
    the pass without it (within 1e-6: the recomputation replays the dropout masks), while each layer runs twice (its
    forward, then its recomputation in backward) and the graph keeps only the layers' inputs: with 3 layers of
    ff_dim 64 the tensors saved for backward shrink to less than a third. Without gradients, or in evaluation mode,
    nothing is recomputed."""
    torch.manual_seed(0)
    model = TransformerGenerator(V, hidden_dim=16, num_layers=3, n_heads=4, ff_dim=64, max_positions=16, dropout=0.1,
                                 conditional=conditional).train()
    src, src_len = make_batch(conditional)
    tokens = torch.randint(3, V, (5, 7), generator=torch.Generator().manual_seed(2))
    a = torch.randn(5, 7)
    layers = 2 * 3 if conditional else 3
    logp, grads, before, after, saved = _pass_with_checkpointing(model, False, src, src_len, tokens, a)
    logp_c, grads_c, before_c, after_c, saved_c = _pass_with_checkpointing(model, True, src, src_len, tokens, a)
    assert (before, after) == (layers, layers) and (before_c, after_c) == (layers, 2 * layers)
    assert saved_c < saved / 3
    torch.testing.assert_close(logp_c, logp, rtol=0, atol=1e-6)
    for g, g_c in zip(grads, grads_c):
        torch.testing.assert_close(g_c, g, rtol=1e-5, atol=1e-6)
    calls = [0]
    hooks = [blk.ff.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1)) for blk in model.decoder]
    with torch.no_grad():
        model.logprobs(src, src_len, tokens)
    model.eval()
    model.logprobs(src, src_len, tokens).logp.sum().backward()
    assert calls[0] == 2 * 3  # one forward each, no recomputation
    for h in hooks:
        h.remove()


def test_activation_checkpointing_through_the_config():
    """``learner.activation_checkpointing=true`` turns it on in the learner's Transformer; a GRU has no layers to
    recompute."""
    from rayseq.distributed.actors.learner import Learner
    from tests.conftest import tiny_config

    learner = Learner(tiny_config("model.arch=transformer", "learner.activation_checkpointing=true"))
    assert learner.state.generator.checkpointing
    assert not Learner(tiny_config("model.arch=transformer")).state.generator.checkpointing
    with pytest.raises(ConfigError, match="model.arch=rnn has none to recompute"):
        build_config(None, ["model.arch=rnn", "learner.activation_checkpointing=true"])


def test_activation_checkpointing_of_an_hf_policy_through_the_config(corpus, hf_dir):
    """The same key turns on transformers' gradient checkpointing in a Hugging Face policy."""
    from rayseq.distributed.actors.learner import Learner
    from tests.conftest import tiny_config

    hf = ("task.name=pairs", f"task.data={corpus}", "model.arch=hf", f"model.path={hf_dir}")
    for on in (True, False):
        learner = Learner(tiny_config(*hf, f"learner.activation_checkpointing={str(on).lower()}"))
        assert learner.state.generator.model.is_gradient_checkpointing == on
