"""The per-prompt seeds of a vLLM call (``row_seed``): seed · 100003 + row, reduced into [0, 2^63), the range of the
signed 64-bit seed vLLM gives a torch generator. Plain arithmetic: no vLLM needed."""

from __future__ import annotations

from rayseq.engines.vllm_engine import row_seed
from rayseq.seeding import derive_seed


def test_small_seeds_are_kept_and_large_ones_fit_a_signed_64_bit_integer():
    assert [row_seed(2, b) for b in range(3)] == [200_006, 200_007, 200_008]  # 2 · 100003 + b, as before
    big = derive_seed(0, "episode_turn", 1)  # an episode's turn seed: up to 2^63 − 1
    seeds = [row_seed(big, b) for b in range(4)]
    assert all(0 <= s < 2**63 for s in seeds) and len(set(seeds)) == 4
    assert seeds[1] == (big * 100_003 + 1) - ((big * 100_003 + 1) // 2**63) * 2**63
    assert row_seed(2**63 - 1, 0) == (2**63 - 1) * 100_003 % 2**63 != 2**63 - 1
