"""Credit over turns (rayseq.algos.turn_credit): each estimator against a small episode table computed by hand, the
token rows read as turns, the vectorised group baseline against a plain loop, the config's checks, and the key
through the training path (``rayseq.train``)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayseq.algos.episode_metrics import episode_metrics
from rayseq.algos.turn_credit import (
    gigpo_advantages,
    observation_keys,
    spread,
    trajectory_advantages,
    turn_gae_advantages,
    turn_group_advantages,
    turn_returns,
    turn_table,
)
from rayseq.config import build_config
from rayseq.episodes.games import GridWorld, GuessNumber
from rayseq.train import main as train_main

# one group of G = 3 episodes of the same start: 2, 1 and 3 turns
REWARDS = np.array([[0.0, 1.0, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 2.0]])
MASK = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])


def test_turn_returns_by_hand():
    assert turn_returns(REWARDS, MASK, 1.0) == pytest.approx(np.array([[1, 1, 0], [0.5, 0, 0], [2, 2, 2]]))
    # γ = 0.5: episode 0: G_1 = 0 + 0.5·1; episode 2: G_2 = 0.5·2, G_1 = 0.5·1
    assert turn_returns(REWARDS, MASK, 0.5) == pytest.approx(np.array([[0.5, 1, 0], [0.5, 0, 0], [0.5, 1, 2]]))


def test_trajectory_advantages_by_hand():
    # R = (1, 0.5, 2): 1 − (0.5 + 2)/2, 0.5 − (1 + 2)/2, 2 − (1 + 0.5)/2 on every turn each episode has
    want = np.array([[-0.25, -0.25, 0], [-1, 0, 0], [1.25, 1.25, 1.25]])
    assert trajectory_advantages(REWARDS, MASK, 3) == pytest.approx(want)


def test_turn_group_advantages_by_hand():
    # turn 1: everyone's return from turn 1 against the other two's: as trajectory level; turn 2: episodes 0 and 2
    # (returns 1 and 2) against each other; turn 3: episode 2 alone, baseline 0
    want = np.array([[-0.25, -1, 0], [-1, 0, 0], [1.25, 1, 2]])
    assert turn_group_advantages(REWARDS, MASK, 3, 1.0) == pytest.approx(want)
    # γ = 0.5: G = [[.5, 1], [.5], [.5, 1, 2]]; turn 1 all equal (0), turn 2: 1 − 1, 1 − 1; turn 3: 2
    assert turn_group_advantages(REWARDS, MASK, 3, 0.5) == pytest.approx(np.array([[0, 0, 0], [0, 0, 0], [0, 0, 2]]))


def plain_turn_group(rewards, mask, G, gamma):
    ret = turn_returns(rewards, mask, gamma)
    out = np.zeros_like(ret)
    for i in range(len(ret)):
        g0 = i // G * G
        for k in range(ret.shape[1]):
            if mask[i, k]:
                others = [ret[j, k] for j in range(g0, g0 + G) if j != i and mask[j, k]]
                out[i, k] = ret[i, k] - (np.mean(others) if others else 0.0)
    return out


def random_table(B: int, K: int, seed: int) -> tuple:
    """(rewards, mask) of B episodes of 1..K turns, and (B, K) observation keys out of 3."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(K)[None] < rng.integers(1, K + 1, B)[:, None]).astype(float)
    return rng.normal(size=(B, K)) * mask, mask, rng.integers(0, 3, (B, K))


def test_the_vectorised_group_baseline_is_the_plain_loops():
    rewards, mask, _ = random_table(12, 5, 0)
    for gamma in (1.0, 0.7):
        assert turn_group_advantages(rewards, mask, 4, gamma) == pytest.approx(plain_turn_group(rewards, mask, 4,
                                                                                                 gamma))


def plain_gigpo(rewards, mask, states, G, gamma):
    ret = turn_returns(rewards, mask, gamma)
    fallback = ret - plain_turn_group(rewards, mask, G, gamma)
    out = np.zeros_like(ret)
    B, K = ret.shape
    for i in range(B):
        rows = range(i // G * G, i // G * G + G)
        for k in range(K):
            if mask[i, k]:
                same = [ret[j, m] for j in rows if j != i for m in range(K)
                        if mask[j, m] and states[j, m] == states[i, k]]
                out[i, k] = ret[i, k] - (np.mean(same) if same else fallback[i, k])
    return out


def test_the_vectorised_step_groups_are_the_plain_loops():
    rewards, mask, states = random_table(16, 4, 1)
    for gamma in (1.0, 0.8):
        assert gigpo_advantages(rewards, mask, states, 4, gamma) == pytest.approx(plain_gigpo(rewards, mask, states, 4,
                                                                                              gamma))


def test_gigpo_advantages_by_hand():
    # every episode starts at A; episode 0's turn 2 and episode 2's turn 3 stand at B; episode 2's turn 2 at C
    states = np.array([[1, 2, 0], [1, 0, 0], [1, 3, 2]])
    want = np.array([
        [1 - (0.5 + 2) / 2, 1 - 2, 0],  # A: the others' returns from A; B: episode 2's from its turn 3 (2)
        [0.5 - (1 + 2) / 2, 0, 0],
        [2 - (1 + 0.5) / 2, 2 - 1, 2 - 1],  # C: no other episode there -> turn 2's baseline (episode 0's, 1); B: 1
    ])
    assert gigpo_advantages(REWARDS, MASK, states, 3, 1.0) == pytest.approx(want)


def test_turn_gae_by_hand():
    values = torch.tensor([[0.5, 0.8, 0.0], [0.4, 0.0, 0.0], [0.5, 1.0, 1.5]])
    adv, targets = turn_gae_advantages(torch.tensor(REWARDS, dtype=torch.float32), values,
                                       torch.tensor(MASK, dtype=torch.float32), gamma=1.0, lam=0.5)
    # episode 0: δ_2 = 1 − 0.8, δ_1 = 0.8 − 0.5, A_1 = 0.3 + 0.5·0.2; episode 2: δ = (0.5, 0.5, 0.5)
    want = torch.tensor([[0.4, 0.2, 0.0], [0.1, 0.0, 0.0], [0.875, 0.75, 0.5]])
    assert torch.allclose(adv, want, atol=1e-6)
    assert torch.allclose(targets, (want + values) * torch.tensor(MASK, dtype=torch.float32), atol=1e-6)
    # λ = 1: the return from the turn on minus V
    adv1, _ = turn_gae_advantages(torch.tensor(REWARDS, dtype=torch.float32), values,
                                  torch.tensor(MASK, dtype=torch.float32), gamma=1.0, lam=1.0)
    ret = torch.tensor(turn_returns(REWARDS, MASK), dtype=torch.float32)
    assert torch.allclose(adv1, (ret - values) * torch.tensor(MASK, dtype=torch.float32), atol=1e-6)


def test_token_rows_read_as_turns_and_advantages_spread_back():
    # row 0: turn 1 (2 sampled tokens, an observation token), turn 2 (1 sampled, 1 observation), padding;
    # row 1 continues an episode at turn 3
    turn = np.array([[1, 1, 1, 2, 2, 0], [3, 3, 4, 4, 0, 0]])
    sampled = np.array([[1, 1, 0, 1, 0, 0], [1, 0, 1, 0, 0, 0]], np.float32)
    rewards = np.array([[0, 0.3, 0, 1.0, 0, 0], [0.2, 0, 0.7, 0, 0, 0]], np.float32)
    t = turn_table(rewards, turn, sampled)
    assert t.rewards == pytest.approx(np.array([[0.3, 1.0], [0.2, 0.7]]))
    assert t.mask.tolist() == [[1, 1], [1, 1]]
    assert t.start.tolist() == [[0, 3], [0, 2]]
    assert t.column.tolist() == [[0, 0, 0, 1, 1, -1], [0, 0, 1, 1, -1, -1]]
    out = spread(np.array([[2.0, -1.0], [3.0, 5.0]]), t.column, sampled)
    assert out.tolist() == [[2, 2, 0, -1, 0, 0], [3, 0, 5, 0, 0, 0]]
    # the observation before turn 2 of row 0 is its token 2; before row 1's first turn, its prompt
    src, src_len = np.array([[7, 8], [9, 0]]), np.array([2, 1])
    tokens = np.array([[11, 12, 13, 14, 15, 0], [21, 22, 23, 24, 0, 0]])
    keys = observation_keys(src, src_len, tokens, sampled, t)
    assert keys[0, 0] == hash((7, 8)) and keys[0, 1] == hash((13,))
    assert keys[1, 0] == hash((9,)) and keys[1, 1] == hash((22,))


def plain_turn_table(rewards, turn, sampled):
    first = {i: min([t for t in turn[i] if t > 0], default=1) for i in range(len(turn))}
    K = max(1, max(int(t) - first[i] + 1 for i in range(len(turn)) for t in turn[i] if t > 0))
    table, mask, start = np.zeros((len(turn), K)), np.zeros((len(turn), K)), np.zeros((len(turn), K), np.int64)
    for i in range(len(turn)):
        seen = set()
        for t, k in enumerate(turn[i]):
            if k > 0:
                c = k - first[i]
                table[i, c] += rewards[i, t]
                mask[i, c] = 1
                if sampled[i, t] and c not in seen:
                    start[i, c] = t
                    seen.add(c)
    return table, mask, start


def test_the_vectorised_turn_table_is_the_plain_loops():
    rng = np.random.default_rng(3)
    B, T = 10, 14
    lengths = rng.integers(1, T + 1, B)
    turn = np.where(np.arange(T)[None] < lengths[:, None],
                    rng.integers(1, 3, B)[:, None] + np.sort(rng.integers(0, 4, (B, T)), 1), 0)
    sampled = (rng.random((B, T)) < 0.6) * (turn > 0)
    rewards = rng.normal(size=(B, T)) * sampled
    t = turn_table(rewards, turn, sampled)
    table, mask, start = plain_turn_table(rewards, turn, sampled)
    assert t.rewards == pytest.approx(table) and (t.mask == mask).all() and (t.start == start).all()


def test_every_turns_reward_is_in_the_episode_metrics():
    """``episode/turn_reward/k``: turn k's mean reward over the episodes that reached it, read from each episode's first
    row (a row that continues an episode carries none)."""
    extras = {"episode_continues": np.array([0, 0, 1, 0]), "episode_turns": np.array([2, 3, 3, 1]),
              "episode_return": np.array([1.0, 0.5, 0.5, 0.0]),
              "episode_turn_rewards": np.array([[0, 1, 0], [0.5, -0.5, 0.5], [0, 0, 0], [0, 0, 0]])}
    extras.update({k: np.zeros(4) for k in ("episode_success", "episode_failed", "episode_timeout", "episode_tokens",
                                            "episode_truncated", "episode_splits", "episode_drift")})
    m = episode_metrics(extras)
    assert m["episode/turn_reward/1"] == pytest.approx((0 + 0.5 + 0) / 3)
    assert m["episode/turn_reward/2"] == pytest.approx((1 - 0.5) / 2)
    assert m["episode/turn_reward/3"] == pytest.approx(0.5)
    assert m["episode/return"] == pytest.approx(0.5)


def test_guess_number_warmer_colder_rewards():
    env = GuessNumber(0, 15, 4, warmer=0.1)
    env.reset(0)
    secret = env.secret
    far, near = (15, secret + 1) if secret < 8 else (0, secret - 1)
    assert env.step(str(far))[1] == 0.0  # the first guess: nothing to compare
    assert env.step(str(near))[1] == pytest.approx(0.1)  # warmer
    assert env.step(str(far))[1] == pytest.approx(-0.1)  # colder
    assert env.step(str(secret))[1] == pytest.approx(1.1)  # the hit, and warmer
    plain = GuessNumber(0, 15, 4)
    plain.reset(0)
    assert [plain.step(g)[1] for g in (str(far), str(near))] == [0.0, 0.0]
    with pytest.raises(ValueError, match="warmer"):
        GuessNumber(warmer=-1)


def test_gridworld_steps_cost_and_the_goal_pays():
    env = GridWorld(size=2, step_cost=0.1, max_steps=3)
    obs = env.reset(0)
    assert obs.startswith("at ") and obs.endswith("goal 1 1")
    r, c = env.pos
    obs, reward, done, _ = env.step("left" if c == 0 else "up" if r == 0 else "left")  # into the wall
    assert obs.startswith("wall") and reward == pytest.approx(-0.1) and not done
    moves = (["down"] if r == 0 else []) + (["right"] if c == 0 else [])
    for m in moves:
        obs, reward, done, info = env.step(m)
    assert done and info["success"] and reward == pytest.approx(0.9)


@pytest.mark.parametrize(("overrides", "says"), [
    (["algo.name=rloo", "algo.group_size=4", "train.batch_size=8", "algo.turn_credit=turn_returns"], "needs episodes"),
    (["env.name=guess_number", "algo.name=grpo", "algo.group_size=4", "train.batch_size=8",
      "algo.turn_credit=gigpo"], "algo.scale_rewards=none"),
    (["env.name=guess_number", "algo.name=grpo", "algo.group_size=4", "train.batch_size=8", "algo.scale_rewards=none",
      "algo.turn_credit=turn_returns", "algo.importance_sampling_level=sequence"], "importance_sampling_level"),
    (["env.name=guess_number", "algo.name=rloo", "algo.group_size=4", "train.batch_size=8",
      "algo.turn_credit=turn_gae"], "turn_credit"),
    (["env.name=guess_number", "algo.name=actor_critic", "algo.turn_credit=gigpo"], "turn_credit"),
])
def test_turn_credit_configs_that_cannot_run_are_refused(overrides, says):
    with pytest.raises(Exception, match=says):
        build_config(None, overrides)


SMALL = ["model.emb_dim=16", "model.hidden_dim=32", "model.ff_dim=64", "progress=false", "rollout.num_workers=0",
         "task.val_size=4", "task.test_size=4", "env.max_action_tokens=1", "model.arch=rnn"]


@pytest.mark.e2e
@pytest.mark.parametrize("algo", [
    ["algo.name=rloo", "algo.group_size=4", "algo.turn_credit=turn_returns", "algo.turn_gamma=0.9"],
    ["algo.name=grpo", "algo.group_size=4", "algo.turn_credit=gigpo", "algo.scale_rewards=none"],
    ["algo.name=actor_critic", "algo.turn_credit=turn_gae"],
])
def test_turn_credit_trains_through_the_cli(algo, tmp_path, capsys):
    """``python -m rayseq.train env.name=guess_number algo.turn_credit=...``: the estimator runs in the update
    (its ``credit/*`` metrics), and the per-turn rewards are logged (``episode/turn_reward/k``)."""
    run = tmp_path / "run"
    code = train_main(["env.name=guess_number", "env.kwargs.hi=15", "env.kwargs.max_guesses=4",
                       "env.kwargs.warmer=0.1", "train.batch_size=8", "train.iters=2", "train.eval_every=2",
                       f"run_dir={run}", *algo, *SMALL])
    assert code == 0, capsys.readouterr().err
    rows = [r for r in pq.read_table(run / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert len(rows) == 2
    for r in rows:
        assert r["credit/turns_per_row"] == pytest.approx(r["episode/turns"])
        assert np.isfinite(r["credit/turn_advantage_abs"]) and np.isfinite(r["loss/policy"])
        assert r["episode/turn_reward/1"] is not None
        # the mean of the per-turn rewards weighted by the episodes reaching each turn is the mean return
        per_turn = [r.get(f"episode/turn_reward/{k}") for k in range(1, 5)]
        assert all(-0.11 <= x <= 1.11 for x in per_turn if x is not None)
