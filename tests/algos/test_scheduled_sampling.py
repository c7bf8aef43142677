"""Scheduled sampling (Bengio et al. 2015; ERPO Supp. C.2): the decay, the batched decoder against a per-row
loop, teacher forcing at ε = 1, model-fed inputs at ε = 0, and the learner update."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rayseq.algos.scheduled_sampling import ScheduledSampling, inverse_sigmoid_decay, scheduled_sampling_logprobs
from rayseq.models.generator import Seq2SeqGRU
from rayseq.models.sampling import inverse_cdf_sample

V, B, S, T = 13, 6, 5, 7


def make_gen(cell="gru", num_layers=1, banned_ids=(), seed=0):
    torch.manual_seed(seed)
    g = Seq2SeqGRU(V, emb_dim=8, hidden_dim=12, num_layers=num_layers, cell=cell, banned_ids=banned_ids)
    with torch.no_grad():  # larger weights than the default init, so inputs change the distributions a lot
        for p in g.parameters():
            p.mul_(3.0)
    return g.eval()


def make_data(seed=0, b=B, t=T):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (b, S), generator=gen)
    src_len = torch.randint(1, S + 1, (b,), generator=gen)
    tgt = torch.randint(3, V, (b, t), generator=gen)
    coins = torch.rand(b, t, generator=gen)
    uniforms = torch.rand(b, t, generator=gen)
    return src, src_len, tgt, coins, uniforms


# -- 1. the decay ------------------------------------------------------------------------------------
def test_inverse_sigmoid_decay_hand_values():
    k = 500.0
    # i = 0: exp(0) = 1, so ε = 500 / (500 + 1) = 500/501 ≈ 0.998004
    assert inverse_sigmoid_decay(0, k) == pytest.approx(500 / 501, abs=1e-12)
    # i = k·ln k: exp(i/k) = exp(ln 500) = 500, so ε = 500 / (500 + 500) = 0.5
    assert inverse_sigmoid_decay(k * math.log(k), k) == pytest.approx(0.5, abs=1e-12)
    # i = 1000: exp(2) = 7.389056..., ε = 500 / 507.389056 = 0.985437...
    assert inverse_sigmoid_decay(1000, k) == pytest.approx(500 / (500 + math.exp(2)), abs=1e-12)
    assert inverse_sigmoid_decay(1000, k) == pytest.approx(0.985437, abs=1e-6)
    # i = 5000: exp(10) = 22026.47, ε = 500 / 22526.47 = 0.0221961...
    assert inverse_sigmoid_decay(5000, k) == pytest.approx(0.0221961, abs=1e-7)
    # k = 600 (summarisation), i = 600·ln 600: 0.5 as well
    assert inverse_sigmoid_decay(600 * math.log(600), 600) == pytest.approx(0.5, abs=1e-12)
    values = [inverse_sigmoid_decay(i, k) for i in range(0, 20001, 50)]
    assert all(a > b for a, b in zip(values, values[1:]))  # strictly decreasing
    assert values[-1] == pytest.approx(500 * math.exp(-40), rel=1e-9)  # i = 20000: 500 / (500 + e^40) ≈ 2.1e-15
    assert inverse_sigmoid_decay(10**9, k) == 0.0  # no overflow in exp(i/k)


# -- 2. ε = 1 is teacher forcing -------------------------------------------------------------------------
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_eps_one_is_teacher_forcing(cell):
    g = make_gen(cell)
    src, src_len, tgt, coins, uniforms = make_data()
    logp, fed = scheduled_sampling_logprobs(g, src, src_len, tgt, 1.0, coins, uniforms)
    ref = g.logprobs(src, src_len, tgt).logp
    assert torch.allclose(logp, ref, atol=1e-6)
    assert fed.shape == (B, T) and fed.sum() == 0
    # coins that all fall below ε (ε < 1 here) take the same path
    logp2, fed2 = scheduled_sampling_logprobs(g, src, src_len, tgt, 0.7, coins * 0.5, uniforms)
    assert torch.allclose(logp2, ref, atol=1e-6) and fed2.sum() == 0


# -- 3. batched decoder == per-row plain loop -------------------------------------------------------------
def plain_loop(g, src, src_len, tgt, eps, coins, uniforms):
    """Row by row, batch size 1, step by step with Seq2SeqGRU.decode_step (its _logits applies logit_bias)."""
    logps, feds = [], []
    with torch.no_grad():
        for b in range(src.shape[0]):
            h = g.encode(src[b : b + 1], src_len[b : b + 1])
            tok, logits = torch.tensor([g.bos_id]), None
            row_lp, row_fed = [], []
            for t in range(tgt.shape[1]):
                if t == 0:
                    fed = 0.0
                elif coins[b, t] < eps:
                    tok, fed = tgt[b, t - 1 : t], 0.0
                else:
                    tok, fed = inverse_cdf_sample(logits, uniforms[b, t : t + 1]), 1.0
                logits, _, h = g.decode_step(tok, h)
                row_lp.append(torch.log_softmax(logits, -1)[0, tgt[b, t]].item())
                row_fed.append(fed)
            logps.append(row_lp)
            feds.append(row_fed)
    return torch.tensor(logps), torch.tensor(feds)


@pytest.mark.parametrize(
    "cell,num_layers,banned", [("gru", 1, ()), ("lstm", 1, ()), ("gru", 2, (0, 5, 7)), ("lstm", 3, (1, 9))]
)
@pytest.mark.parametrize("eps", [0.5, 0.0])
def test_batched_matches_plain_loop(cell, num_layers, banned, eps):
    g = make_gen(cell, num_layers, banned)
    src, src_len, tgt, coins, uniforms = make_data(seed=num_layers)
    logp, fed = scheduled_sampling_logprobs(g, src, src_len, tgt, eps, coins, uniforms)
    ref_lp, ref_fed = plain_loop(g, src, src_len, tgt, eps, coins, uniforms)
    assert torch.equal(fed, ref_fed)
    assert torch.allclose(logp, ref_lp, atol=1e-5)
    # the sampled inputs change the result: it is not teacher forcing
    assert not torch.allclose(logp, g.logprobs(src, src_len, tgt).logp, atol=1e-3)
    if eps == 0.0:
        assert fed[:, 0].sum() == 0 and fed[:, 1:].sum() == B * (T - 1)
    if banned:  # banned ids are never fed (they have probability 0)
        _, _, _, coins2, uniforms2 = make_data(seed=42, b=64)
        src2, len2, tgt2 = src.repeat(11, 1)[:64], src_len.repeat(11)[:64], tgt.repeat(11, 1)[:64]
        _, fed2 = scheduled_sampling_logprobs(g, src2, len2, tgt2, 0.0, coins2, uniforms2)
        assert fed2[:, 1:].all()


def test_coin_fraction_and_tgt_len():
    g = make_gen("gru")
    src, src_len, tgt, coins, uniforms = make_data(seed=3, b=200, t=T)
    _, fed = scheduled_sampling_logprobs(g, src, src_len, tgt, 0.3, coins, uniforms)
    assert torch.equal(fed[:, 1:].bool(), coins[:, 1:] >= 0.3)
    assert abs(fed[:, 1:].mean().item() - 0.7) < 0.05
    # tgt_len: no model inputs after the end; logp inside the reference unchanged
    tgt_len = torch.randint(1, T + 1, (200,), generator=torch.Generator().manual_seed(0))
    logp_full, _ = scheduled_sampling_logprobs(g, src, src_len, tgt, 0.3, coins, uniforms)
    logp_cut, fed_cut = scheduled_sampling_logprobs(g, src, src_len, tgt, 0.3, coins, uniforms, tgt_len=tgt_len)
    inside = torch.arange(T)[None, :] < tgt_len[:, None]
    assert fed_cut[~inside].sum() == 0
    assert torch.equal(fed_cut[inside], fed[inside])
    assert torch.allclose(logp_cut[inside], logp_full[inside], atol=1e-6)


# -- 4. ε = 0 feeds the model's own (predictable) tokens ------------------------------------------------
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_eps_zero_feeds_model_tokens(cell):
    g = make_gen(cell)
    x = 4
    with torch.no_grad():
        g.out.bias.zero_()
        g.out.bias[x] = 60.0  # p(x) ≥ 1 − V·exp(−60 + max|other logits|): every sample is x
    src, src_len, tgt, coins, uniforms = make_data(seed=5)
    tgt[tgt == x] = 3  # reference never contains x, so feeding x differs from teacher forcing
    logp, fed = scheduled_sampling_logprobs(g, src, src_len, tgt, 0.0, coins, uniforms)
    assert fed[:, 1:].sum() == B * (T - 1)
    # inputs built by hand: BOS, x, x, ..., x; logits from one teacher-forced pass on that sequence
    fed_seq = torch.full_like(tgt, x)
    logits = g.logprobs(src, src_len, fed_seq).logits
    expect = torch.log_softmax(logits, -1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(logp, expect, atol=1e-5)
    tf = g.logprobs(src, src_len, tgt).logp
    assert torch.allclose(logp[:, 0], tf[:, 0], atol=1e-6)  # step 0's input is BOS either way
    assert (logp[:, 1:] - tf[:, 1:]).abs().max() > 1e-2


def test_gradients_flow_through_loss_not_samples():
    g = make_gen("lstm", 2).train()
    src, src_len, tgt, coins, uniforms = make_data(seed=7)
    logp, fed = scheduled_sampling_logprobs(g, src, src_len, tgt, 0.5, coins, uniforms)
    assert fed.sum() > 0 and logp.requires_grad
    (-logp.mean()).backward()
    grads = {n: p.grad for n, p in g.named_parameters()}
    assert all(gr is not None and torch.isfinite(gr).all() for gr in grads.values())
    assert grads["out.weight"].abs().sum() > 0 and grads["encoder.weight_ih_l0"].abs().sum() > 0


# -- 5. the learner update --------------------------------------------------------------------------------
def make_learner():
    from rayseq.config import build_config
    from rayseq.distributed.actors.learner import Learner

    return Learner(build_config(
        None, ["task.name=counting", "algo.name=scheduled_sampling", "model.hidden_dim=16", "model.emb_dim=8"]
    ))


def test_update_on_learner_state():
    L = make_learner()
    batch = L.task.sample_prompts(np.random.default_rng(0), 32, with_targets=True)
    algo = ScheduledSampling(L.cfg.algo)
    assert algo.kind == "supervised" and algo.needs_targets
    assert L.cfg.algo.ss_k == 500
    before = {k: v.clone() for k, v in L.state.generator.state_dict().items()}
    it = 4000  # ε = 500 / (500 + e^8) = 500 / 3480.958 = 0.143639
    metrics = algo.update(L.state, batch, it)
    assert set(metrics) == {"loss/nll", "ss/epsilon", "ss/model_fed_frac", "policy/grad_norm", "data/tokens"}
    assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["ss/epsilon"] == pytest.approx(500 / (500 + math.exp(it / 500)), rel=1e-12)
    assert metrics["ss/epsilon"] == pytest.approx(0.143639, abs=1e-6)
    # fraction over real tokens; step 0 (BOS input) is never model-fed, others with prob. 1 − ε
    n_tok = float(batch.tgt_len.sum())
    assert metrics["data/tokens"] == n_tok
    expected = (1 - metrics["ss/epsilon"]) * (n_tok - len(batch)) / n_tok
    assert abs(metrics["ss/model_fed_frac"] - expected) < 0.08
    assert metrics["loss/nll"] > 0 and metrics["policy/grad_norm"] > 0
    after = L.state.generator.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)

    # reproducible: the same iteration on the same weights gives the same update; early iterations ≈ MLE
    L2 = make_learner()
    L2.state.generator.load_state_dict(before)
    assert ScheduledSampling(L2.cfg.algo).update(L2.state, batch, it) == metrics
    m0 = ScheduledSampling(L2.cfg.algo).update(make_learner().state, batch, 0)
    assert m0["ss/epsilon"] == pytest.approx(500 / 501)
    assert m0["ss/model_fed_frac"] < 0.02
