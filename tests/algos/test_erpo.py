"""ERPO's token-level q (Tan et al. 2018 Eq. 4, Supplement Algorithm 1) for SPG and the interpolation
algorithm: the batched sampler against a plain per-row loop that scores every candidate with sentence BLEU,
the reference-only and model-only corners, the λ annealing of Supplement C.2 by hand, and undoing an
interval whose validation reward dropped."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rayseq.algos.erpo import erpo_sample
from rayseq.algos.erpo_interpolation import ERPOInterpolation
from rayseq.config import build_config
from rayseq.distributed.actors.learner import Learner
from rayseq.models import make_generator
from rayseq.models.sampling import inverse_cdf_sample
from rayseq.rewards.bleu import sentence_bleu
from rayseq.tasks.chitchat import ChitchatTask


def setup(corpus, *extra):
    cfg = build_config(None, ["task.name=chitchat", f"task.data={corpus}", "task.test_size=100",
                              "model.emb_dim=16", "model.hidden_dim=32", "progress=false", *extra])
    task = ChitchatTask(cfg.task)
    torch.manual_seed(0)
    model = make_generator(cfg, task).eval()
    prompts = task.sample_prompts(np.random.default_rng(0), 12, with_targets=True)
    return cfg, task, model, prompts


def reference_loop(model, task, prompts, max_len, mode, c, lambdas, seed):
    """One row at a time; ΔR(v) = sentence_bleu(prefix + v) − sentence_bleu(prefix) for every v; the same
    uniforms in the same order as the batched sampler (u then u_z per step)."""
    g = torch.Generator().manual_seed(seed)
    B, V, sp = len(prompts), model.vocab_size, task.specials
    draws = [(torch.rand(B, generator=g), torch.rand(B, generator=g, dtype=torch.float64)) for _ in range(max_len)]
    cum = np.cumsum(lambdas)
    out = np.full((B, max_len), sp.pad, dtype=np.int64)
    for b in range(B):
        refs = task.references(prompts.key[b : b + 1])
        h = model.encode(torch.from_numpy(prompts.src[b : b + 1]), torch.from_numpy(prompts.src_len[b : b + 1]))
        tok, reply = torch.tensor([model.bos_id]), []
        for t in range(max_len):
            logits, _, h = model.decode_step(tok, h)
            logp = torch.log_softmax(logits, -1)[0].double()
            base = sentence_bleu([reply], refs)[0] if reply else 0.0
            dr = torch.tensor([sentence_bleu([reply + [v]], refs)[0] - base for v in range(V)])
            dr[sp.eos] = 0.0
            never = torch.zeros(V, dtype=torch.float64)
            never[[sp.pad, sp.bos]] = float("-inf")
            u, uz = draws[t][0][b], draws[t][1][b]
            z = 1 if mode == "spg" else int(np.searchsorted(cum, float(uz), side="right")) + 1
            if z == 3:
                y = int(prompts.tgt[b, t]) if t < prompts.tgt.shape[1] else sp.eos
                y = sp.eos if y == sp.pad else y
            else:
                q = (logp + c * dr if mode == "spg" else (c * logp if z == 1 else c * dr)) + never
                y = int(inverse_cdf_sample(q[None].float(), u[None])[0])
            out[b, t] = y
            if y == sp.eos:
                break
            reply.append(y)
            tok = torch.tensor([y])
    return out


@pytest.mark.parametrize("mode,c,lambdas", [("spg", 1.0, None), ("spg", 8.0, None),
                                            ("interpolation", 1.0, (0.3, 0.4, 0.3)),
                                            ("interpolation", 5.0, (0.0, 1.0, 0.0))])
def test_batched_sampler_matches_the_plain_loop(corpus, mode, c, lambdas):
    cfg, task, model, prompts = setup(corpus)
    lam = lambdas or (0.0, 0.0, 1.0)
    g = torch.Generator().manual_seed(3)
    out, _ = erpo_sample(model, torch.from_numpy(prompts.src), torch.from_numpy(prompts.src_len), task.max_tgt_len,
                         prompts=prompts, task=task, mode=mode, c=c, lambdas=lam, generator_rng=g)
    ref = reference_loop(model, task, prompts, task.max_tgt_len, mode, c, lam, 3)
    got = out.tokens.numpy()
    np.testing.assert_array_equal(got, ref[:, : got.shape[1]])
    assert (ref[:, got.shape[1]:] == task.specials.pad).all()


def test_reference_only_and_model_only_corners(corpus):
    cfg, task, model, prompts = setup(corpus)
    src, src_len = torch.from_numpy(prompts.src), torch.from_numpy(prompts.src_len)
    out, stats = erpo_sample(model, src, src_len, task.max_tgt_len, prompts=prompts, task=task,
                             mode="interpolation", lambdas=(0.0, 0.0, 1.0))
    for b in range(len(prompts)):  # λ = (0, 0, 1): the reference itself (MLE)
        n = int(prompts.tgt_len[b])
        np.testing.assert_array_equal(out.tokens[b, :n].numpy(), prompts.tgt[b, :n])
        assert out.token_mask[b].sum() == n
    assert stats["erpo/z_ref"] == 1.0
    # λ = (1, 0, 0), c = 1: q is π_θ; the logp returned is π_θ's log-probability of the tokens
    out, stats = erpo_sample(model, src, src_len, task.max_tgt_len, prompts=prompts, task=task,
                             mode="interpolation", lambdas=(1.0, 0.0, 0.0),
                             generator_rng=torch.Generator().manual_seed(0))
    lp = model.logprobs(src, src_len, out.tokens).logp * out.token_mask
    torch.testing.assert_close(lp, out.logp, atol=1e-5, rtol=0)
    assert stats["erpo/z_model"] == 1.0


def test_spg_with_a_large_reward_scale_finds_reference_words(corpus):
    cfg, task, model, prompts = setup(corpus)
    prompts = task.sample_prompts(np.random.default_rng(1), 64, with_targets=True)
    src, src_len = torch.from_numpy(prompts.src), torch.from_numpy(prompts.src_len)
    policy = model.sample(src, src_len, task.max_tgt_len, generator=torch.Generator().manual_seed(0))
    spg, _ = erpo_sample(model, src, src_len, task.max_tgt_len, prompts=prompts, task=task, mode="spg", c=30.0,
                         generator_rng=torch.Generator().manual_seed(0))
    r_policy = task.rewards(prompts.src, prompts.src_len, policy.tokens.numpy(), policy.token_mask.numpy(),
                            key=prompts.key)[1]
    r_spg = task.rewards(prompts.src, prompts.src_len, spg.tokens.numpy(), spg.token_mask.numpy(), key=prompts.key)[1]
    assert r_spg.mean() > r_policy.mean() + 0.2  # an untrained model: q ∝ p·exp(30 ΔR) follows the reward


def test_annealing_schedule_by_hand():
    cfg = build_config(None, ["task.name=chitchat", "task.data=x", "algo.name=erpo_interpolation"]).algo
    a = ERPOInterpolation(cfg)
    assert a.lambdas == [0.04, 0.0, 0.96]
    grew = [a.anneal() for _ in range(6)]
    # Supp. C.2: λ1 once, then λ2 four times, periodically; λ3 loses 0.06 each time
    assert grew == ["model", "reward", "reward", "reward", "reward", "model"]
    np.testing.assert_allclose(a.lambdas, [0.04 + 0.12, 0.24, 0.96 - 0.36], atol=1e-12)
    for _ in range(30):
        a.anneal()
    assert a.lambdas[2] == pytest.approx(0.0, abs=1e-12) and sum(a.lambdas) == pytest.approx(1.0)


def test_a_drop_in_validation_reward_restores_the_weights_and_anneals(corpus):
    cfg = build_config(None, ["task.name=chitchat", f"task.data={corpus}", "task.test_size=100",
                              "model.emb_dim=16", "model.hidden_dim=32", "algo.name=erpo_interpolation"])

    learner = Learner(cfg)
    learner.start_stage("train")
    a, s = learner.algo, learner.state
    m = a.on_validation(s, 0.30)  # first validation: kept, snapshot taken
    assert m["interp/restored"] == 0.0
    saved = copy.deepcopy(s.generator.state_dict())
    with torch.no_grad():
        for p in s.generator.parameters():
            p.add_(1.0)
    m = a.on_validation(s, 0.31)  # better: the new weights are kept and saved
    assert m["interp/restored"] == 0.0 and a.lambdas == [0.04, 0.0, 0.96]
    better = copy.deepcopy(s.generator.state_dict())
    assert any(not torch.equal(saved[k], better[k]) for k in saved)
    with torch.no_grad():
        for p in s.generator.parameters():
            p.add_(1.0)
    m = a.on_validation(s, 0.20)  # worse: back to the last validation's weights, λ1 grows
    assert m["interp/restored"] == 1.0 and a.lambdas == pytest.approx([0.10, 0.0, 0.90])
    assert all(torch.equal(better[k], v) for k, v in s.generator.state_dict().items())
    m = a.on_validation(s, 0.10)  # after a drop the next validation is accepted (the authors' code)
    assert m["interp/restored"] == 0.0
    # the λ state and the saved weights survive a checkpoint
    state = learner.state_dict()
    fresh = Learner(cfg)
    fresh.load_state_dict(state)
    assert fresh.algo.lambdas == a.lambdas and fresh.algo.last_reward == 0.10
    assert 0.0 <= learner.validate()["interp/val_reward"] <= 1.0
