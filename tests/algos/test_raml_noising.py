"""RAML (ERPO Sec. 3.3, Ma et al. 2017's n-gram sampler) and unigram data noising (ERPO Sec. 3.5):
the samplers against plain loops on the same random draws, the exp(R/τ) draw's probabilities, the
batches they build, and one learner update on each."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rayseq.algos.data_noising import UNIGRAM_PROMPTS, DataNoising, unigram_distribution, unigram_noise
from rayseq.algos.raml import (
    RAML,
    categorical_from_uniforms,
    content_lengths,
    draw_ngram_params,
    exp_reward_probs,
    ngram_replace,
    raml_pool,
    sample_exponentiated,
)
from rayseq.config import build_config
from rayseq.tasks import make_task
from rayseq.types import PromptBatch
from rayseq.vocab import Specials

SP = Specials()
PAD, EOS = SP.pad, SP.eos
# chi-square critical values at p = 0.001 (df -> value); seeds are fixed, so the tests are deterministic
CHI2_999 = {2: 13.816, 3: 16.266, 5: 20.515}


def chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


def algo_cfg(*overrides: str):
    """RAML's keys with algo.name=raml, data noising's with data_noising (keys others do not read are refused)."""
    name = "data_noising" if any("noise_" in o for o in overrides) else "raml"
    return build_config(None, ["task.name=counting", f"algo.name={name}", *overrides]).algo


@pytest.fixture(scope="module")
def counting():
    return make_task(build_config(None, ["task.name=counting", "task.test_size=200"]).task)


def make_refs(rng, lengths, T, vocab_size, low=4):
    """References of ``lengths`` word tokens + EOS, right-padded to T."""
    B = len(lengths)
    tgt = np.full((B, T), PAD, dtype=np.int64)
    for b, L in enumerate(lengths):
        tgt[b, :L] = rng.integers(low, vocab_size, size=L)
        tgt[b, L] = EOS
    return tgt, np.asarray(lengths, dtype=np.int64) + 1


class FakeTask:
    """Full control: vocabulary size, a reward on the tokens, fixed training targets; records reward calls."""

    def __init__(self, vocab_size=12, reward_fn=None, train_rows=None):
        self.vocab = list(range(vocab_size))
        self.specials = SP
        self.reward_fn = reward_fn or (lambda src, tokens, mask, key: (tokens == 4).sum(1) / tokens.shape[1])
        self.train_rows = train_rows
        self.calls = []
        self.prompt_calls = 0

    def rewards(self, src, src_len, tokens, token_mask, key=None):
        self.calls.append({"src": src, "src_len": src_len, "tokens": tokens, "mask": token_mask, "key": key})
        score = np.asarray(self.reward_fn(src, tokens, token_mask, key), dtype=np.float32)
        return np.zeros(token_mask.shape, np.float32), score

    def sample_prompts(self, rng, n, *, with_targets=False):
        self.prompt_calls += 1
        rows = np.asarray(self.train_rows, dtype=np.int64)
        idx = rng.integers(0, len(rows), size=n)
        tgt = rows[idx]
        tgt_len = (tgt != PAD).sum(1).astype(np.int64)
        return PromptBatch(np.ones((n, 2), np.int64) * 5, np.full(n, 2, np.int64), tgt, tgt_len,
                           np.arange(n, dtype=np.int64))


def fake_batch(rng, lengths, T=9, vocab_size=12, S=3):
    tgt, tgt_len = make_refs(rng, lengths, T, vocab_size)
    B = len(lengths)
    src = rng.integers(4, vocab_size, size=(B, S))
    return PromptBatch(src, rng.integers(1, S + 1, size=B), tgt, tgt_len, 1000 + np.arange(B, dtype=np.int64))


# -- 1. the n-gram replacement sampler -----------------------------------------------------------------
def test_content_lengths_with_and_without_eos():
    tgt = np.array([[5, 6, EOS, PAD], [5, 6, 7, PAD], [EOS, PAD, PAD, PAD], [PAD] * 4])
    assert content_lengths(tgt, np.array([3, 3, 1, 0]), EOS).tolist() == [2, 3, 0, 0]


def test_draw_ngram_params_ranges_and_uniformity():
    rng = np.random.default_rng(0)
    L = np.array([0, 1, 2, 3, 7, 20])
    n, start, new_ids = draw_ngram_params(rng, L, 20000, max_ngram=4, vocab_size=11)
    for b, l in enumerate(L):
        if l == 0:
            assert (n[b] == 0).all() and (start[b] == 0).all()
            continue
        n_max = max(1, min(l - 1, 4))
        assert set(np.unique(n[b])) == set(range(1, n_max + 1))  # every n in 1..n_max, nothing else
        counts = np.bincount(n[b] - 1, minlength=n_max)
        assert np.abs(counts / counts.sum() - 1 / n_max).max() < 0.02  # uniform
        assert (start[b] >= 0).all() and (start[b] + n[b] <= l).all()  # never touches EOS
        sel = n[b] == 1
        assert set(np.unique(start[b][sel])) == set(range(l))  # start uniform over 0..L-n: all reached
    assert new_ids.min() >= 4 and new_ids.max() == 10


def test_raml_pool_matches_per_candidate_loop():
    rng = np.random.default_rng(1)
    V, T, P, G = 15, 10, 7, 3
    lengths = [0, 1, 2, 5, 8, 9]
    tgt, tgt_len = make_refs(rng, lengths, T, V)
    pool = raml_pool(np.random.default_rng(42), tgt, tgt_len, P, G, V, EOS)

    # the same draws, in the documented order, consumed by a plain loop
    r = np.random.default_rng(42)
    B = len(lengths)
    u_n, u_start = r.random((B, P - 1)), r.random((B, P - 1))
    ids = r.integers(4, V, size=(B, P - 1, G), dtype=np.int64)
    expected = np.zeros((B, P, T), dtype=np.int64)
    for b in range(B):
        L = lengths[b]
        expected[b, 0] = tgt[b]
        for j in range(P - 1):
            cand = list(tgt[b])
            if L > 0:
                n_max = max(1, min(L - 1, G))
                n = 1 + int(u_n[b, j] * n_max)
                start = int(u_start[b, j] * (L - n + 1))
                cand[start : start + n] = list(ids[b, j, :n])
            expected[b, j + 1] = cand
    np.testing.assert_array_equal(pool, expected)
    assert (pool[np.arange(B), :, tgt_len - 1] == EOS).all()
    assert ((pool != tgt[:, None, :]).sum(2) <= G).all()
    assert ((pool != tgt[:, None, :]).any(2)[1:]).any()  # it does replace something


def test_ngram_replace_matches_loop_on_arbitrary_params():
    rng = np.random.default_rng(2)
    B, k, T, G = 4, 6, 8, 4
    tgt = rng.integers(4, 30, size=(B, T))
    n = rng.integers(0, G + 1, size=(B, k))
    start = rng.integers(0, T - G + 1, size=(B, k))
    new_ids = rng.integers(100, 200, size=(B, k, G))
    out = ngram_replace(tgt, n, start, new_ids)
    for b in range(B):
        for j in range(k):
            cand = tgt[b].copy()
            for i in range(n[b, j]):
                cand[start[b, j] + i] = new_ids[b, j, i]
            np.testing.assert_array_equal(out[b, j], cand)


# -- 2. the exp(R/τ) draw ------------------------------------------------------------------------------
def test_exp_reward_probs_hand_computed():
    # R = (0, 0.5, 1), τ = 0.4: R/τ = (0, 1.25, 2.5); e^0 = 1, e^1.25 = 3.490343, e^2.5 = 12.182494,
    # Z = 16.672837 -> p = (1, 3.490343, 12.182494) / Z = (0.0599778, 0.2093431, 0.7306791)
    p = exp_reward_probs(np.array([[0.0, 0.5, 1.0]]), 0.4)
    np.testing.assert_allclose(p[0], [0.0599778, 0.2093431, 0.7306791], atol=1e-6)
    # shifting R does not change the distribution; huge R/τ does not overflow
    np.testing.assert_allclose(exp_reward_probs(np.array([[1000.0, 1000.5, 1001.0]]), 0.4), p, atol=1e-12)
    np.testing.assert_allclose(exp_reward_probs(np.array([[0.0, 0.0, 1.0]]), 1e-3)[0], [0, 0, 1], atol=1e-12)

    idx = sample_exponentiated(np.random.default_rng(3), np.array([[0.0, 0.5, 1.0]]), 0.4, 200000)
    counts = np.bincount(idx[0], minlength=3)
    assert chi2(counts, p[0]) < CHI2_999[2]
    np.testing.assert_allclose(counts / counts.sum(), p[0], atol=0.005)


def test_sample_exponentiated_frequencies_match_softmax_per_row():
    rng = np.random.default_rng(4)
    R = rng.random((4, 6))  # a fake reward for 4 examples' pools of 6 candidates
    tau = 0.25
    idx = sample_exponentiated(np.random.default_rng(5), R, tau, 100000)
    for b in range(4):
        p = np.exp(R[b] / tau) / np.exp(R[b] / tau).sum()
        assert chi2(np.bincount(idx[b], minlength=6), p) < CHI2_999[5]
    # and a wrong temperature is detected by the same test
    p_wrong = np.exp(R[0] / 0.5) / np.exp(R[0] / 0.5).sum()
    assert chi2(np.bincount(idx[0], minlength=6), p_wrong) > CHI2_999[5]


def test_categorical_from_uniforms_matches_loop():
    rng = np.random.default_rng(6)
    probs = rng.random((5, 7))
    probs[:, 2] = 0.0  # a zero-probability candidate is never drawn
    probs /= probs.sum(1, keepdims=True)
    u = rng.random((5, 300))
    u[0, 0] = 0.0
    idx = categorical_from_uniforms(probs, u)
    for b in range(5):
        for j in range(300):
            acc, pick = 0.0, probs.shape[1] - 1
            for i in range(probs.shape[1]):
                acc += probs[b, i]
                if u[b, j] < acc:
                    pick = i
                    break
            assert idx[b, j] == pick
    assert not (idx == 2).any()


# -- 3. the RAML batch ---------------------------------------------------------------------------------
def test_raml_augment_shapes_eos_key_and_composition():
    rng = np.random.default_rng(7)
    lengths = [0, 1, 2, 4, 7]
    batch = fake_batch(rng, lengths)
    task = FakeTask()
    cfg = algo_cfg("algo.raml_pool=9", "algo.raml_samples=5", "algo.raml_max_ngram=3", "algo.raml_tau=0.3")
    out, m = RAML(cfg).augment(task, batch, np.random.default_rng(8), 0)
    B, T, k, P = len(lengths), batch.tgt.shape[1], 5, 9
    assert len(out) == B * k and out.tgt.shape == (B * k, T)
    rows = np.repeat(np.arange(B), k)
    np.testing.assert_array_equal(out.src, batch.src[rows])
    np.testing.assert_array_equal(out.src_len, batch.src_len[rows])
    np.testing.assert_array_equal(out.key, batch.key[rows])
    np.testing.assert_array_equal(out.tgt_len, batch.tgt_len[rows])
    assert (out.tgt[np.arange(B * k), out.tgt_len - 1] == EOS).all()  # EOS kept, still last
    pad = np.arange(T)[None, :] >= out.tgt_len[:, None]
    assert (out.tgt[pad] == PAD).all()
    real = ~pad & (out.tgt != EOS)
    assert (out.tgt[real] >= 4).all()
    np.testing.assert_array_equal(out.tgt[rows == 0], batch.tgt[[0] * k])  # L = 0: only the reference

    # one batched reward call over B·P rows, with src / key repeated per candidate
    (call,) = task.calls
    assert call["tokens"].shape == (B * P, T)
    np.testing.assert_array_equal(call["key"], np.repeat(batch.key, P))
    np.testing.assert_array_equal(call["src"], np.repeat(batch.src, P, axis=0))
    np.testing.assert_array_equal(call["mask"].sum(1), np.repeat(batch.tgt_len, P))

    # augment = pool (draws 1-3) then exp(R/τ) sampling (draw 4), on the same generator
    r = np.random.default_rng(8)
    pool = raml_pool(r, batch.tgt, batch.tgt_len, P, 3, 12, EOS)
    np.testing.assert_array_equal(call["tokens"], pool.reshape(B * P, T))
    R = task.reward_fn(None, pool.reshape(B * P, T), None, None).reshape(B, P)
    idx = sample_exponentiated(r, R, 0.3, k)
    np.testing.assert_array_equal(out.tgt.reshape(B, k, T), np.take_along_axis(pool, idx[:, :, None], axis=1))
    assert m["raml/rows"] == B * k
    assert m["raml/reward_mean"] == pytest.approx(np.take_along_axis(R, idx, axis=1).mean(), rel=1e-6)
    assert m["raml/reward_ref"] == pytest.approx(R[:, 0].mean(), rel=1e-6)
    drawn = out.tgt.reshape(B, k, T)
    unique = np.mean([len({tuple(s) for s in drawn[b]}) / k for b in range(B)])
    assert m["raml/unique_frac"] == pytest.approx(unique)


def test_raml_without_key_passes_none(counting):
    batch = counting.sample_prompts(np.random.default_rng(9), 6, with_targets=True)
    assert batch.key is None
    out, _ = RAML(algo_cfg("algo.raml_pool=5", "algo.raml_samples=2")).augment(
        counting, batch, np.random.default_rng(0), 0)
    assert out.key is None and len(out) == 12


def test_raml_on_counting_favours_correct_outputs(counting):
    batch = counting.sample_prompts(np.random.default_rng(10), 256, with_targets=True)
    cfg = algo_cfg()  # paper defaults: pool 100, 10 samples, τ = 0.4, n ≤ 4
    out, m = RAML(cfg).augment(counting, batch, np.random.default_rng(11), 0)
    assert len(out) == 256 * cfg.raml_samples
    np.testing.assert_array_equal(out.tgt_len, 3)  # counting's targets: 3 digits, no EOS
    assert ((out.tgt >= counting.digit0) & (out.tgt < counting.digit0 + 10)).all()
    assert m["raml/reward_ref"] == 1.0
    # the drawn samples' rewards, recomputed, are the metric
    _, score = counting.rewards(out.src, out.src_len, out.tgt, np.ones(out.tgt.shape, np.float32))
    assert m["raml/reward_mean"] == pytest.approx(float(score.mean()))
    # exp(R/τ) favours correct outputs: far above the pool's mean reward (few replacements stay correct)
    assert m["raml/reward_pool"] < 0.2
    assert m["raml/reward_mean"] > m["raml/reward_pool"] + 0.2
    assert 0.1 < m["raml/unique_frac"] <= 1.0
    # a colder temperature concentrates on the correct candidates
    cold, _ = RAML(algo_cfg("algo.raml_tau=0.05")).augment(counting, batch, np.random.default_rng(11), 0)
    _, cold_score = counting.rewards(cold.src, cold.src_len, cold.tgt, np.ones(cold.tgt.shape, np.float32))
    assert cold_score.mean() == 1.0


# -- 4. data noising -----------------------------------------------------------------------------------
# training targets, each with word counts 4 x5, 5 x3, 6 x2 (unk, EOS, pad not counted) -> u = (.5, .3, .2) exactly
TRAIN_ROWS = [[4, 4, 4, 4, 4, 5, 5, 5, 6, 6, 3, EOS], [6, 5, 4, 6, 5, 4, 4, 5, 4, 4, EOS, PAD]]
U_TRUE = np.array([0, 0, 0, 0, 0.5, 0.3, 0.2, 0, 0, 0, 0, 0])


def test_unigram_distribution_known_and_cached():
    task = FakeTask(train_rows=TRAIN_ROWS)
    u = unigram_distribution(task)
    np.testing.assert_allclose(u.sum(), 1.0)
    assert (u[:4] == 0).all() and (u[7:] == 0).all()
    # both training rows have the same word counts, so the estimate is exact whichever rows are drawn
    np.testing.assert_allclose(u, U_TRUE, atol=1e-12)
    task.prompt_calls = 0
    algo = DataNoising(algo_cfg("algo.noise_gamma=0.1"))  # its default
    batch = fake_batch(np.random.default_rng(0), [3, 4])
    algo.augment(task, batch, np.random.default_rng(1), 0)
    algo.augment(task, batch, np.random.default_rng(2), 1)
    assert task.prompt_calls == 1  # estimated once, lazily
    np.testing.assert_allclose(algo.unigram(task), U_TRUE, atol=1e-12)


def test_unigram_on_counting(counting):
    u = unigram_distribution(counting)
    assert u.shape == (len(counting.vocab),) and (u[:4] == 0).all() and u.sum() == pytest.approx(1.0)
    assert (u[4:] > 0).all()
    # counting's targets (t−1, x_t, N−t): small digits are the most frequent
    assert u[counting.digit0] > u[counting.digit0 + 9]
    assert UNIGRAM_PROMPTS == 20000


def test_noising_gamma_zero_is_identity_and_gamma_one_replaces_all():
    task = FakeTask(train_rows=TRAIN_ROWS)
    rng = np.random.default_rng(12)
    lengths = rng.integers(0, 11, size=300)
    batch = fake_batch(rng, lengths, T=12)
    batch.tgt[batch.tgt >= 4] = 9  # references use only id 9, which u never proposes
    out, m = DataNoising(algo_cfg("algo.noise_gamma=0")).augment(task, batch, np.random.default_rng(0), 0)
    np.testing.assert_array_equal(out.tgt, batch.tgt)
    assert out.src is batch.src and out.key is batch.key and m["noise/replaced_frac"] == 0.0

    out, m = DataNoising(algo_cfg("algo.noise_gamma=1")).augment(task, batch, np.random.default_rng(0), 0)
    content = np.arange(12)[None, :] < lengths[:, None]
    assert np.isin(out.tgt[content], [4, 5, 6]).all()  # every word token replaced by a unigram sample
    np.testing.assert_array_equal(out.tgt[~content], batch.tgt[~content])  # EOS and padding untouched
    np.testing.assert_array_equal(out.tgt_len, batch.tgt_len)
    assert m["noise/replaced_frac"] == 1.0 and m["noise/changed_frac"] == 1.0
    # the replacements follow u
    counts = np.bincount(out.tgt[content], minlength=7)[4:7]
    assert chi2(counts, U_TRUE[4:7]) < CHI2_999[2]


def test_noising_replaced_fraction_is_gamma(counting):
    batch = counting.sample_prompts(np.random.default_rng(13), 20000, with_targets=True)
    out, m = DataNoising(algo_cfg("algo.noise_gamma=0.3")).augment(counting, batch, np.random.default_rng(1), 0)
    assert m["noise/replaced_frac"] == pytest.approx(0.3, abs=0.01)  # 60000 tokens: sd 0.002
    changed = (out.tgt != batch.tgt).mean()
    assert changed == pytest.approx(m["noise/changed_frac"]) and changed < m["noise/replaced_frac"]
    assert ((out.tgt >= 4) & (out.tgt < len(counting.vocab))).all()


def test_unigram_noise_matches_loop():
    rng = np.random.default_rng(14)
    B, T = 40, 9
    tgt, tgt_len = make_refs(rng, rng.integers(0, T, size=B), T, 12)
    L = content_lengths(tgt, tgt_len, EOS)
    u_rep, u_smp = rng.random((B, T)), rng.random((B, T))
    u_smp[0, 0] = 0.0
    gamma = 0.4
    out, replaced = unigram_noise(tgt, L, u_rep, u_smp, gamma, U_TRUE)
    cdf = np.cumsum(U_TRUE)
    for b in range(B):
        for t in range(T):
            if t < L[b] and u_rep[b, t] < gamma:
                new = next(i for i in range(len(cdf)) if u_smp[b, t] < cdf[i])
                assert replaced[b, t] and out[b, t] == new
            else:
                assert not replaced[b, t] and out[b, t] == tgt[b, t]
    # the augment draws: replacement uniforms first, then sample uniforms
    task = FakeTask(train_rows=TRAIN_ROWS)
    batch = PromptBatch(np.ones((B, 2), np.int64), np.full(B, 2), tgt, tgt_len)
    got, _ = DataNoising(algo_cfg(f"algo.noise_gamma={gamma}")).augment(task, batch, np.random.default_rng(15), 0)
    r = np.random.default_rng(15)
    a, c = r.random((B, T)), r.random((B, T))
    np.testing.assert_array_equal(got.tgt, unigram_noise(tgt, L, a, c, gamma, U_TRUE)[0])


# -- 5. one learner update -----------------------------------------------------------------------------
@pytest.mark.parametrize("algo_cls", [RAML, DataNoising])
def test_update_on_learner_state(counting, algo_cls):
    from rayseq.distributed.actors.learner import Learner

    overrides = ["task.name=counting", "task.test_size=200", "model.hidden_dim=16", "model.emb_dim=8",
                 "algo.raml.raml_pool=8", "algo.raml.raml_samples=4", "algo.data_noising.noise_gamma=0.5"]
    cfg = build_config(None, [*overrides, "algo.name=" + ("raml" if algo_cls is RAML else "data_noising")])
    learner = Learner(cfg)
    algo = algo_cls(learner.cfg.algo)
    assert algo.kind == "supervised" and algo.needs_targets
    batch = learner.task.sample_prompts(np.random.default_rng(0), 16, with_targets=True)
    aug, _ = algo.augment(learner.task, batch, np.random.default_rng(1), 0)
    before = [p.detach().clone() for p in learner.state.generator.parameters()]
    metrics = algo.update(learner.state, aug, 0)
    assert math.isfinite(metrics["loss/nll"]) and metrics["loss/nll"] > 0
    assert metrics["data/tokens"] == float(aug.tgt_len.sum())
    after = list(learner.state.generator.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
