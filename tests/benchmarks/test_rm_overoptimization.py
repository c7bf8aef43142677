"""benchmarks/rm_overoptimization.py's pieces: the exact gold reward by hand, the Bradley–Terry labelling of its pairs,
and the fit of Gao et al.'s R(d) = d(α − β log d) against a curve of known α, β."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.rm_overoptimization import fit_rl_form, gold, preference_rows


def test_gold_by_hand():
    replies = ["it was great", "it was great and lovely", "it was awful", "well it was really great and awful",
               "i think it was great and lovely and wonderful and fine"]
    # 1; 1 − 0.5 (a second pleasant word); −1; 1 − 1 (7 words: −0.1); 1 − 1.0 (3 pleasant) − 0.5 (11 words)
    assert gold(None, replies, None) == pytest.approx([1.0, 0.5, -1.0, -0.1, -0.5])


def test_pairs_follow_the_bradley_terry_model_of_gold():
    rows = preference_rows(4000, seed=3)
    g = np.array([gold(None, [r["chosen"], r["rejected"]], None) for r in rows])
    diff = g[:, 0] - g[:, 1]
    # among pairs whose gold differs by exactly 1, the better reply is chosen with probability σ(3) = 0.953
    one = np.abs(np.abs(diff) - 1.0) < 1e-9
    assert one.sum() > 300
    assert (diff[one] > 0).mean() == pytest.approx(1 / (1 + math.exp(-3)), abs=0.03)


def test_fit_recovers_the_rl_form():
    d = np.linspace(0.1, 3.0, 30)
    alpha, beta = 1.2, 0.4
    assert fit_rl_form(d, d * (alpha - beta * np.log(d))) == pytest.approx((alpha, beta), abs=1e-9)
    # d = 0 (the start) carries no information on α, β: left out
    assert fit_rl_form(np.r_[0.0, d], np.r_[0.0, d * (alpha - beta * np.log(d))]) == pytest.approx((alpha, beta))
