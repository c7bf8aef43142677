"""The counting task (Tuan & Lee 2018; Tuan et al. 2018 Sec. 5.1, Table 1, Fig. 1-2, Supp. D).

x = x_1..x_N (digits, N in 1..10); correct outputs y = (t−1, x_t, N−t) for t in 1..N. Tokens are
vocabulary ids: digit d has id ``task.digit0 + d`` (ids 0..3 are <pad>, <bos>, <eos>, <unk>).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayseq.config import build_config
from rayseq.models import SampleOutput, Seq2SeqGRU
from rayseq.tasks import CountingTask, make_task


def make(*overrides: str) -> CountingTask:
    return CountingTask(build_config(overrides=list(overrides)).task)


@pytest.fixture(scope="module")
def task() -> CountingTask:
    return make()


def digits_to_src(task: CountingTask, rows: list[list[int]]):
    S = task.max_src_len
    src = np.full((len(rows), S), task.specials.pad, dtype=np.int64)
    for i, r in enumerate(rows):
        src[i, : len(r)] = np.asarray(r) + task.digit0
    return src, np.array([len(r) for r in rows], dtype=np.int64)


def test_vocab_layout(task):
    assert len(task.vocab) == 14
    assert task.digit0 == 4 and task.vocab.itos[task.digit0 + 7] == "7"
    assert make_task(build_config().task).name == "counting"


def test_paper_example(task):
    # Tuan et al. Sec. 5.1: input {9, 2, 3} (N = 3) -> correct outputs {0,9,2}, {1,2,1}, {2,3,0}
    outputs = [
        ([0, 9, 2], 1.0),  # t = 1: (0, x_1 = 9, 3 − 1 = 2)
        ([1, 2, 1], 1.0),  # t = 2
        ([2, 3, 0], 1.0),  # t = 3
        ([0, 2, 2], 0.0),  # x_1 is 9, not 2
        ([1, 9, 1], 0.0),  # x_2 is 2
        ([2, 3, 1], 0.0),  # N − t = 0
        ([3, 3, 0], 0.0),  # t = 4 > N
        ([9, 3, 0], 0.0),  # t = 10: reads past the input
    ]
    src, src_len = digits_to_src(task, [[9, 2, 3]] * len(outputs))
    tokens = np.array([o for o, _ in outputs]) + task.digit0
    mask = np.ones(tokens.shape, dtype=np.float32)
    np.testing.assert_array_equal(task.score(src, src_len, tokens, mask), [s for _, s in outputs])
    np.testing.assert_array_equal(task.is_correct(src, src_len, tokens), [s == 1.0 for _, s in outputs])


def test_short_or_long_outputs_score_zero(task):
    d = task.digit0
    eos, pad = task.specials.eos, task.specials.pad
    src, src_len = digits_to_src(task, [[9, 2, 3]] * 4)
    tokens = np.array(
        [
            [d + 0, d + 9, d + 2],  # correct, 3 real tokens
            [d + 0, eos, pad],  # EOS after one token
            [d + 0, d + 9, eos],  # EOS in third place
            [d + 0, d + 9, d + 2],  # correct digits, but the mask says the row ended after 2 tokens
        ]
    )
    mask = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]], dtype=np.float32)
    np.testing.assert_array_equal(task.score(src, src_len, tokens, mask), [1, 0, 0, 0])
    # fewer than 3 token columns (all rows ended early)
    assert (task.score(src[:1], src_len[:1], tokens[:1, :2], mask[:1, :2]) == 0).all()
    # a 4th real token makes the output wrong; a 4th masked column does not
    long = np.concatenate([tokens[:1], [[eos]]], axis=1)
    assert task.score(src[:1], src_len[:1], long, np.ones((1, 4), np.float32))[0] == 0
    assert task.score(src[:1], src_len[:1], long, np.array([[1, 1, 1, 0]], np.float32))[0] == 1


def test_rewards_are_terminal(task):
    src, src_len = digits_to_src(task, [[9, 2, 3], [9, 2, 3]])
    tokens = np.array([[0, 9, 2], [0, 9, 9]]) + task.digit0
    mask = np.ones((2, 3), np.float32)
    r, s = task.rewards(src, src_len, tokens, mask)
    np.testing.assert_array_equal(s, [1, 0])
    np.testing.assert_array_equal(r, [[0, 0, 1], [0, 0, 0]])


def _score_loop(task: CountingTask, src_row, n: int, toks, mask) -> float:
    """The rule, one row: exactly 3 real tokens, all digits, (t−1, x_t, N−t) with 1 <= t <= N."""
    length = int(sum(1 for m in mask if m > 0))
    if length != 3 or len(toks) < 3:
        return 0.0
    y = [int(v) - task.digit0 for v in toks[:3]]
    if any(not 0 <= v <= 9 for v in y):
        return 0.0
    t = y[0] + 1
    if not 1 <= t <= n:
        return 0.0
    x_t = int(src_row[t - 1]) - task.digit0
    return float(y[1] == x_t and y[2] == n - t)


@pytest.mark.parametrize("width", [3, 4])
def test_score_matches_loop(task, width):
    rng = np.random.default_rng(width)
    M = 5000
    src, src_len = task.sample_inputs(rng, M)
    kind = rng.integers(0, 4, size=M)
    # 0: sampled correct targets; 1: a correct target with one digit nudged; 2: random digits;
    # 3: random ids over the whole vocabulary (specials included)
    tokens = rng.integers(0, len(task.vocab), size=(M, width))
    correct = task.sample_targets(rng, src, src_len)
    tokens[kind <= 1, :3] = correct[kind <= 1]
    nudge = (kind == 1).nonzero()[0]
    col = rng.integers(0, 3, size=len(nudge))
    tokens[nudge, col] = task.digit0 + (tokens[nudge, col] - task.digit0 + rng.integers(1, 10, len(nudge))) % 10
    tokens[kind == 2] = rng.integers(0, 10, size=((kind == 2).sum(), width)) + task.digit0
    lengths = np.where(rng.random(M) < 0.7, 3, rng.integers(0, width + 1, size=M))
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.float32)

    got = task.score(src, src_len, tokens, mask)
    expected = np.array([_score_loop(task, src[i], int(src_len[i]), tokens[i], mask[i]) for i in range(M)])
    np.testing.assert_array_equal(got, expected)
    # is_correct ignores the mask: it is the rule on the first 3 tokens
    full = np.ones((M, 3), np.float32)
    expected_rule = [_score_loop(task, src[i], int(src_len[i]), tokens[i, :3], full[i]) for i in range(M)]
    np.testing.assert_array_equal(task.is_correct(src, src_len, tokens), np.array(expected_rule) == 1)
    # the mixture really contains both outcomes in bulk: ~1/4 correct targets × ~0.75 of them length 3
    assert 0.1 < got.mean() < 0.5


def test_sample_targets_always_correct_and_t_uniform(task):
    rng = np.random.default_rng(0)
    src, src_len = task.sample_inputs(rng, 20000)
    y = task.sample_targets(rng, src, src_len)
    assert y.shape == (20000, 3) and y.dtype == np.int64
    assert task.score(src, src_len, y, np.ones((20000, 3), np.float32)).all()
    # t uniform in 1..N: for N = 5, y_1 = t − 1 over 0..4. Pearson χ² with 4 dof has mean 4, sd √8;
    # P(χ²₄ > 30) ≈ 5e-6.
    src5, len5 = digits_to_src(task, [[1, 2, 3, 4, 5]] * 50000)
    y1 = task.sample_targets(rng, src5, len5)[:, 0] - task.digit0
    counts = np.bincount(y1, minlength=10)
    assert counts[5:].sum() == 0
    expected = len(y1) / 5
    chi2 = ((counts[:5] - expected) ** 2 / expected).sum()
    assert chi2 < 30, counts


def test_held_out_set_seeded_and_sized():
    a, b = make("task.test_size=500"), make("task.test_size=500")
    c = make("task.test_size=500", "task.test_seed=7")
    assert a.test_src.shape == (500, 10) and a.test_len.shape == (500,)
    np.testing.assert_array_equal(a.test_src, b.test_src)
    np.testing.assert_array_equal(a.test_len, b.test_len)
    assert not np.array_equal(a.test_src, c.test_src)
    # the test set is independent of the run's seed
    d = CountingTask(build_config(overrides=["task.test_size=500", "seed=99"]).task)
    np.testing.assert_array_equal(a.test_src, d.test_src)
    # rows are right-padded digit strings of their length
    valid = np.arange(10)[None, :] < a.test_len[:, None]
    assert ((a.test_src >= a.digit0) & (a.test_src < a.digit0 + 10))[valid].all()
    assert (a.test_src[~valid] == a.specials.pad).all()


def test_held_out_set_default_size_and_lengths(task):
    cfg = build_config().task
    assert len(task.test_len) == cfg.test_size
    # N uniform in 1..10: counts ~ Binomial(2000, 0.1), mean 200, sd 13.4; χ²₉ < 40 (p ≈ 8e-6)
    counts = np.bincount(task.test_len, minlength=11)[1:]
    assert counts.min() > 0
    assert (((counts - 200) ** 2) / 200).sum() < 40, counts


def _long_keys(src, src_len) -> set:
    return {tuple(r[:n_]) for r, n_ in zip(src.tolist(), src_len.tolist()) if n_ >= 4}


def test_training_inputs_never_hit_held_out_set(task):
    rng = np.random.default_rng(1)
    n = 200_000
    src, src_len = task.sample_inputs(rng, n)
    test_keys, val_keys = _long_keys(task.test_src, task.test_len), _long_keys(task.val_src, task.val_len)
    drawn = [tuple(r[:n_]) for r, n_ in zip(src.tolist(), src_len.tolist()) if n_ >= 4]
    assert sum(k in test_keys for k in drawn) == 0 and sum(k in val_keys for k in drawn) == 0
    assert not task.in_held_out(src, src_len).any()
    # the check has teeth: plain draws from the same distribution do collide (~2% of N = 4 inputs per set)
    raw, raw_len = task._draw(np.random.default_rng(1), n)
    raw_keys = [tuple(r[:n_]) for r, n_ in zip(raw.tolist(), raw_len.tolist()) if n_ >= 4]
    raw_test, raw_val = sum(k in test_keys for k in raw_keys), sum(k in val_keys for k in raw_keys)
    assert raw_test > 100 and raw_val > 100
    assert task.in_held_out(raw, raw_len).sum() == sum(k in test_keys or k in val_keys for k in raw_keys)
    # lengths stay near-uniform: 20000 per N, sd 134; the redraw moves ~4% of N = 4 draws elsewhere,
    # so allow 6% relative
    counts = np.bincount(src_len, minlength=11)[1:]
    np.testing.assert_allclose(counts, n / 10, rtol=0.06)


def test_validation_set_is_disjoint_from_test_and_seeded_apart(task):
    """A validation set for every selection, apart from the test set used only to report."""
    assert len(task.val_len) == task.cfg.val_size
    assert not _long_keys(task.val_src, task.val_len) & _long_keys(task.test_src, task.test_len)
    # its own seed: another val_seed draws another set, the test set stays the same
    other = make(f"task.val_seed={task.cfg.val_seed + 1}")
    assert not np.array_equal(other.val_src, task.val_src)
    np.testing.assert_array_equal(other.test_src, task.test_src)


def test_short_inputs_may_repeat_test_inputs(task):
    # inputs of length < 4 are too few to split (10 + 100 + 1000), so they are not held out
    src, src_len = digits_to_src(task, [[3], [1, 2], [4, 5, 6]])
    assert not task.in_held_out(src, src_len).any()
    src4 = task.test_src[task.test_len >= 4][:5]
    assert task.in_held_out(src4, task.test_len[task.test_len >= 4][:5]).all()


def test_evaluate_untrained_generator():
    task = make("task.test_size=200")
    torch.manual_seed(0)
    gen = Seq2SeqGRU(len(task.vocab), emb_dim=16, hidden_dim=16).train()
    metrics, details = task.evaluate(gen, split="test")
    assert gen.training  # mode restored
    for key in ("test/precision", "test/precision_sampled", "test/y1_tv"):
        assert 0.0 <= metrics[key] <= 1.0, key
    present = sorted(set(task.test_len.tolist()))
    for n in present:
        assert 0.0 <= metrics[f"test/y1_tv_n{n}"] <= 1.0
        assert 0.0 <= metrics[f"test/y1_var_n{n}"] <= 0.09 + 1e-9
        assert sum(details["y1_dist"][n]) == pytest.approx(1.0, abs=1e-4)
    assert metrics["test/y1_tv"] == pytest.approx(np.mean([metrics[f"test/y1_tv_n{n}"] for n in present]))
    # same split, hence seeds (one per chunk of the evaluation batch) -> same metrics
    again, _ = task.evaluate(gen.eval(), split="test")
    assert not gen.training
    assert again == pytest.approx(metrics)
    val, _ = task.evaluate(gen, split="val")  # the validation set: other inputs, val/* names
    assert sorted(val) == sorted(k.replace("test/", "val/") for k in metrics) and val != pytest.approx(
        {k.replace("test/", "val/"): v for k, v in metrics.items()})


def test_variance_constants_of_supplement_d():
    # Supp. D's "variance of the distribution of the first word", as evaluate() computes it:
    # probs.var(axis=1) over the 10 digit probabilities (population variance, mean 0.1).
    one_hot = np.eye(10)[[0, 3, 9]]
    # E[p²] − 0.1² = 1/10 − 0.01 = 0.09
    np.testing.assert_allclose(one_hot.var(axis=1), 0.09)
    for n in range(1, 11):
        uniform = np.where(np.arange(10) < n, 1.0 / n, 0.0)[None, :]
        # E[p²] = n·(1/n)²/10 = 1/(10n) -> variance 1/(10n) − 0.01 (0 at n = 10)
        np.testing.assert_allclose(uniform.var(axis=1), 1 / (10 * n) - 0.01, atol=1e-15)


class _FakeGenerator:
    """Answers ``t = 1`` always (correct) and puts y_1 either uniform over 0..N−1 or on digit 0."""

    def __init__(self, task: CountingTask, y1: str):
        self.task, self.y1, self.training = task, y1, False

    def eval(self):
        self.training = False
        return self

    def train(self, mode: bool = True):
        self.training = mode
        return self

    def sample(self, src, src_len, max_len, **kwargs) -> SampleOutput:
        d = self.task.digit0
        tokens = torch.stack([torch.full_like(src_len, d), src[:, 0], src_len - 1 + d], 1)
        ones = torch.ones(tokens.shape)
        return SampleOutput(tokens, ones, ones, torch.zeros(tokens.shape))

    def first_step_logprobs(self, src, src_len):
        V, d = len(self.task.vocab), self.task.digit0
        p = torch.zeros(len(src_len), V)
        if self.y1 == "uniform":
            digits = torch.arange(10)[None, :] < src_len[:, None]
            p[:, d : d + 10] = digits / src_len[:, None]
        else:
            p[:, d] = 1.0
        return torch.log(p)


def test_evaluate_exact_on_oracle_generators():
    task = make("task.test_size=300")
    present = sorted(set(task.test_len.tolist()))
    assert present == list(range(1, 11))
    # uniform y_1 over 0..N−1 is the ground truth: TV 0, variance 1/(10N) − 0.01; answers are correct
    m, details = task.evaluate(_FakeGenerator(task, "uniform"), split="test")
    assert m["test/precision"] == 1.0 and m["test/precision_sampled"] == 1.0
    assert m["test/y1_tv"] == pytest.approx(0.0, abs=1e-6)
    for n in present:
        assert m[f"test/y1_tv_n{n}"] == pytest.approx(0.0, abs=1e-6)
        assert m[f"test/y1_var_n{n}"] == pytest.approx(1 / (10 * n) - 0.01, abs=1e-6)
        assert details["y1_truth"][n] == pytest.approx([1 / n if k < n else 0.0 for k in range(10)])
    # y_1 always 0 (one-hot): TV to uniform over N digits = 1 − 1/N, variance 0.09
    m, _ = task.evaluate(_FakeGenerator(task, "zero"), split="test")
    for n in present:
        assert m[f"test/y1_tv_n{n}"] == pytest.approx(1 - 1 / n, abs=1e-6)
        assert m[f"test/y1_var_n{n}"] == pytest.approx(0.09, abs=1e-6)
    assert m["test/y1_tv"] == pytest.approx(np.mean([1 - 1 / n for n in present]), abs=1e-6)


def test_the_task_tells_serving_how_its_replies_look(task):
    """The checkpoint's task spec says what serving needs (no task names in serving): a fixed reply length of 3
    digits without an end token, the digit-by-digit tokenizer, and what a correct reply is."""
    spec = task.spec()
    assert spec["fixed_reply_length"] == 3 and spec["conditional"] is True and spec["tokenizer"]["kind"] == "chars"
    assert "0 9 2, 1 2 1 and 2 3 0" in spec["about"] and f"1 to {task.max_src_len} digits" in spec["about"]
    from rayseq.tasks.oracle import OracleTask

    oracle = OracleTask(build_config(None, ["task.name=oracle", "algo.name=mle", "task.vocab_size=20"]).task)
    assert oracle.spec()["conditional"] is False and oracle.spec()["fixed_reply_length"] is None
