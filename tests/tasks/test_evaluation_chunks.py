"""An evaluation split into decodes and figures (rayseq.tasks.evaluation): the chunks and their seeds, checked
against the plain loop every task ran before (one generator over the whole split)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayseq.models import make_generator
from rayseq.tasks import make_task
from rayseq.tasks.evaluation import (
    EvalDecode,
    chunk_seed,
    chunked,
    decodes_split,
    evaluate_here,
    generator_sampler,
    joined,
    run_decode,
)
from tests.conftest import tiny_config


def test_chunks_cover_the_inputs_once_and_seed_chunk_zero_with_the_split_seed():
    d = chunked("val", "sampled", 2500, 1024, 3, seed=2019)
    assert [(x.start, x.stop) for x in d] == [(0, 1024), (1024, 2048), (2048, 2500)]
    assert [x.seed for x in d] == [2019, 2019 * 1009 + 1, 2019 * 1009 + 2]
    assert chunk_seed(7, 0) == 7 and chunk_seed(7, 3) == 7 * 1009 + 3
    assert all(x.seed is None for x in chunked("val", "greedy", 2500, 1024, 3))
    assert chunked("val", "greedy", 0, 1024, 3) == []
    with pytest.raises(ValueError, match="at least one input"):
        chunked("val", "greedy", 10, 0, 3)


def test_joined_puts_chunks_back_in_input_order_and_checks_their_rows():
    decodes = [EvalDecode("val", "greedy", 1, 2, 3, 2), EvalDecode("val", "greedy", 0, 0, 2, 2)]
    out = [(np.full((1, 2), 9), np.ones((1, 2), np.float32)), (np.arange(4).reshape(2, 2), np.ones((2, 2), np.float32))]
    tokens, mask = joined(decodes, out)["greedy"]
    assert tokens.tolist() == [[0, 1], [2, 3], [9, 9]] and mask.shape == (3, 2)
    with pytest.raises(ValueError, match="for 1 rows"):
        joined(decodes[:1], out[1:])
    with pytest.raises(ValueError, match="2 decodes, 1 results"):
        joined(decodes, out[:1])


@pytest.fixture(scope="module")
def counting():
    cfg = tiny_config("task.val_size=1500")
    task = make_task(cfg.task, cfg.reward)
    torch.manual_seed(0)
    return task, make_generator(cfg, task).eval()


def test_chunked_decodes_equal_the_plain_loop(counting):
    """Greedy replies chunk by chunk = one greedy pass over the split; sampled chunk c = a generator seeded with
    chunk_seed(seed, c) on those inputs alone (chunk 0: the split seed's generator, as the whole-split loop drew it)."""
    task, g = counting
    inputs, lengths = task.split("val")
    src, sl = torch.from_numpy(inputs), torch.from_numpy(lengths)
    decodes = task.eval_decodes("val")
    assert [(d.name, d.chunk) for d in decodes] == [("greedy", 0), ("greedy", 1), ("sampled", 0), ("sampled", 1)]
    sample = generator_sampler(g, "cpu")
    got = joined(decodes, [run_decode(sample, *task.eval_inputs(d), d, "cpu") for d in decodes])
    with torch.no_grad():
        plain_greedy = g.sample(src[:1024], sl[:1024], 3, greedy=True)
        assert np.array_equal(got["greedy"][0][:1024], plain_greedy.tokens.numpy())
        plain_greedy = g.sample(src[1024:], sl[1024:], 3, greedy=True)
        assert np.array_equal(got["greedy"][0][1024:], plain_greedy.tokens.numpy())
        first = g.sample(src[:1024], sl[:1024], 3, generator=torch.Generator().manual_seed(task.cfg.val_seed))
        assert np.array_equal(got["sampled"][0][:1024], first.tokens.numpy())
        second = g.sample(src[1024:], sl[1024:], 3,
                          generator=torch.Generator().manual_seed(task.cfg.val_seed * 1009 + 1))
        assert np.array_equal(got["sampled"][0][1024:], second.tokens.numpy())
        # one generator continued over the chunks would have drawn chunk 1 differently: the seed is its own
        gen = torch.Generator().manual_seed(task.cfg.val_seed)
        g.sample(src[:1024], sl[:1024], 3, generator=gen)
        continued = g.sample(src[1024:], sl[1024:], 3, generator=gen)
        assert not np.array_equal(continued.tokens.numpy(), second.tokens.numpy())


def test_a_one_chunk_split_evaluates_as_one_generator_over_the_split(counting):
    """test/* (200 inputs: one chunk): the metrics of the plain loop, a greedy pass and one seeded sampled pass."""
    task, g = counting
    metrics, _ = evaluate_here(task, g, split="test")
    inputs, lengths = task.split("test")
    src, sl = torch.from_numpy(inputs), torch.from_numpy(lengths)
    with torch.no_grad():
        greedy = g.sample(src, sl, 3, greedy=True)
        sampled = g.sample(src, sl, 3, generator=torch.Generator().manual_seed(task.cfg.test_seed))
    precision = task.score(inputs, lengths, greedy.tokens.numpy(), greedy.token_mask.numpy()).mean()
    sampled_precision = task.score(inputs, lengths, sampled.tokens.numpy(), sampled.token_mask.numpy()).mean()
    assert metrics["test/precision"] == float(precision)
    assert metrics["test/precision_sampled"] == float(sampled_precision)


def test_the_built_in_tasks_split_their_evaluation_and_figures_need_every_decode(counting):
    task, g = counting
    assert decodes_split(task)
    decodes = task.eval_decodes("test")
    with pytest.raises(ValueError, match="decodes"):
        task.eval_figures("test", [], g)
    with pytest.raises(ValueError, match="split must be"):
        task.eval_decodes("train")
    assert len(decodes) == 2
