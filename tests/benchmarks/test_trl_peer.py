"""benchmarks/trl_peer.py's pieces that decide its figures: the reward both trainers call, and how step times and
rewards become the table's medians. The runs themselves (TRL, Ray, minutes on 2 cores) are not run here."""

from __future__ import annotations

import pytest

from benchmarks import trl_peer as tp
from rayseq import reward_protocol


def test_vowel_share_by_hand_and_on_trls_protocol():
    # "aei" 3/3; "Hello!" h e l l o -> 2/5; "" and "123 ?" have no letters -> 0
    assert tp.vowel_share(["aei", "Hello!", "", "123 ?"]) == [1.0, 0.4, 0.0, 0.0]
    assert reward_protocol.is_keyword(tp.vowel_share)  # TRL's keyword protocol: both trainers call it as is


def test_medians_skip_warmup_then_take_the_median_over_seeds():
    # step ends (seconds after step 1): steps 2..5 take 1, 2, 3, 10 s; warmup 2 drops step 2's -> median(2, 3, 10)
    a = {"method": "trl", "batch": 8, "seed": 0, "steps": 5, "startup_s": 5.0, "step_ends": [0, 1, 3, 6, 16],
         "rewards": [0.1, 0.2, 0.3, 0.4, 0.5]}
    assert tp.step_seconds(a, warmup=2) == [2, 3, 10]
    b = {**a, "seed": 1, "step_ends": [0, 1, 2, 3, 4], "rewards": [0.0] * 5, "startup_s": 7.0}
    s = tp.summarise([a, b], warmup=2, last=2)["8"]["trl"]
    assert s["step_s"] == [3, 1] and s["median_step_s"] == 2 and s["completions_per_s"] == 4
    assert s["final_reward"] == [pytest.approx(0.45), 0.0] and s["median_final_reward"] == pytest.approx(0.225)


def test_ratio_to_trl_pairs_runs_of_the_same_round():
    # round (seed) 0: TRL 4 s/step, rayseq 2 s -> 2x; round 1: TRL 2 s, rayseq 2 s -> 1x; round 2 has no TRL run
    def run(method, seed, step):
        return {"method": method, "batch": 64, "seed": seed, "steps": 3, "startup_s": 1.0,
                "step_ends": [0, step, 2 * step], "rewards": [0.5] * 3}

    runs = [run("trl", 0, 4), run("rayseq", 0, 2), run("trl", 1, 2), run("rayseq", 1, 2), run("rayseq", 2, 8)]
    s = tp.summarise(runs, warmup=1)["64"]
    assert s["rayseq"]["vs_trl"] == [2.0, 1.0] and s["rayseq"]["median_vs_trl"] == 1.5
    assert s["rayseq"]["median_step_s"] == 2 and s["trl"]["median_step_s"] == 3
    assert "vs_trl" not in s["trl"]


def test_rounds_rotate_the_methods_order():
    methods = ["trl", "trl_defaults", "rayseq", "rayseq_ray"]
    orders = [tp.round_order(methods, i) for i in range(4)]
    assert orders[0] == methods and orders[1] == ["trl_defaults", "rayseq", "rayseq_ray", "trl"]
    assert all(sorted(o) == sorted(methods) for o in orders)
    assert {o[0] for o in orders} == set(methods)  # every method runs first once in 4 rounds

