"""rayseq.envs: every task as a Gymnasium environment: gymnasium's own checker on counting,
oracle and chit-chat; the reward is 0 until the reply ends and then the task's own reward of that reply; the
names it is registered under."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rayseq.config import ConfigError, build_config
from rayseq.envs import GYM_ID, SeqEnv, make_env

SMALL_ORACLE = {"vocab_size": 50, "seq_len": 6}  # a random oracle: cheap to build


def play(env: SeqEnv, tokens, seed: int = 0):
    """Reset with ``seed``, then take ``tokens`` as actions until the episode ends: (first obs, reset info,
    [(reward, terminated, truncated)], last obs, last info)."""
    obs0, info0 = env.reset(seed=seed)
    steps, obs, info = [], obs0, info0
    for tok in tokens:
        obs, r, term, trunc, info = env.step(tok)
        steps.append((r, term, trunc))
        if term or trunc:
            break
    return obs0, info0, steps, obs, info


@pytest.mark.parametrize("name", ["counting", "oracle", "chitchat"])
def test_gymnasium_check_env_passes(name, request):
    kw = {"counting": {}, "oracle": SMALL_ORACLE}.get(name)
    if name == "chitchat":  # the tiny corpus of tests/conftest.py, prepared once per session
        kw = {"data": str(request.getfixturevalue("corpus"))}
    env = make_env(name, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a checker warning fails the test
        check_env(env, skip_render_check=True)
    assert env.action_space.n == len(env.task.vocab)


def test_counting_reward_only_at_the_end_equals_the_tasks():
    env = make_env("counting")
    obs, _ = env.reset(seed=3)
    n, digits = obs["prompt_len"], obs["prompt"][: obs["prompt_len"]] - env.task.digit0
    # y = (t−1, x_t, N−t) with t = 1: correct; the same with the last digit off by one: wrong
    d0 = env.task.digit0
    right = [d0 + 0, d0 + digits[0], d0 + n - 1]
    wrong = right[:2] + [d0 + (n % 10)]
    for reply, expected in ((right, 1.0), (wrong, 0.0)):
        obs0, _, steps, last, info = play(env, reply, seed=3)
        assert [s[0] for s in steps[:-1]] == [0.0, 0.0]  # nothing before the end
        assert steps[-1][1:] == (True, False)  # the cap (3 tokens) ends it: terminated, not truncated
        # the task's own reward of that sequence, as rayseq's rollouts compute it
        tokens = np.array([reply], dtype=np.int64)
        rewards, score = env.task.rewards(obs0["prompt"][None], np.array([n]), tokens, np.ones((1, 3), np.float32))
        assert steps[-1][0] == expected == float(rewards.sum()) == info["score"] == score[0]
        assert last["prefix_len"] == 3 and list(last["prefix"]) == reply


def test_eos_ends_the_episode_and_counting_scores_it_zero():
    env = make_env("counting")
    _, _, steps, last, info = play(env, [env.task.digit0, env.specials.eos])
    assert steps == [(0.0, False, False), (0.0, True, False)] and info["score"] == 0.0
    assert last["prefix_len"] == 2 and last["prefix"][2] == env.specials.pad
    with pytest.raises(RuntimeError, match="reset"):
        env.step(env.task.digit0)


def test_chitchat_reward_is_bleu2_against_the_prompts_references(corpus):
    env = make_env("chitchat", data=str(corpus))
    task = env.task
    obs0, info0, _, _, _ = play(env, [])
    refs = task.references([info0["key"]])[0]
    assert info0["key"] >= 0 and refs  # the prompt's reference group
    ref = list(refs[0])
    for reply, bleu in ((ref + [env.specials.eos], 1.0), (ref[:1] + [env.specials.eos], None)):
        _, _, steps, last, info = play(env, reply)
        assert all(r == 0.0 for r, _, _ in steps[:-1]) and steps[-1][1] is True
        T = env.max_tgt_len
        tokens = np.zeros((1, T), np.int64)
        tokens[0, : len(reply)] = reply
        mask = (np.arange(T) < len(reply)).astype(np.float32)[None]
        _, score = task.rewards(
            obs0["prompt"][None, : task.max_src_len],
            np.array([obs0["prompt_len"]]),
            tokens,
            mask,
            key=np.array([info0["key"]]),
        )
        assert steps[-1][0] == pytest.approx(float(score[0])) == pytest.approx(info["score"])
        if bleu is not None:
            assert steps[-1][0] == pytest.approx(bleu)  # a reference scores 1 against a set holding it


def test_seeded_reset_draws_training_inputs_reproducibly():
    env = make_env("counting")
    a = [env.reset(seed=s)[0]["prompt"].tolist() for s in (0, 1, 0)]
    assert a[0] == a[2] and a[0] != a[1]
    # inputs of the validation and test sets are never drawn (counting holds them out of training)
    for s in range(50):
        obs, _ = env.reset(seed=s)
        src, n = obs["prompt"][None], np.array([obs["prompt_len"]])
        assert not env.task.in_held_out(src, n)[0]


def test_a_task_by_name_config_run_config_or_import_path():
    by_name = make_env("counting", max_len=4)
    assert by_name.observation_space["prompt"].shape == (4,)
    run_cfg = build_config(None, ["task.max_len=4", "task.min_len=2"])
    assert make_env(run_cfg).task.cfg.min_len == 2
    assert make_env(run_cfg.task, max_len=3).task.cfg.max_len == 3
    assert make_env({"name": "rayseq.tasks.counting:CountingTask", "max_len": 2}).max_src_len == 2
    assert make_env(by_name.task) is not None  # an already built task
    with pytest.raises(ConfigError, match="task.seq_len"):
        make_env("counting", seq_len=3)
    with pytest.raises(ValueError, match="nosuch"):
        make_env("nosuch:Task")


def test_oracle_has_no_task_reward_and_its_episodes_have_the_fixed_length():
    env = make_env("oracle", **SMALL_ORACLE)
    assert env.observation_space["prompt_len"].n == 1  # unconditional: an empty prompt
    _, _, steps, last, _ = play(env, [4] * 10)
    assert len(steps) == 6 and steps[-1] == (0.0, True, False) and last["prefix_len"] == 6


def test_gymnasium_make_finds_it():
    env = gym.make(GYM_ID, task="counting", max_len=5)
    obs, _ = env.reset(seed=0)
    assert obs["prompt"].shape == (5,) and env.unwrapped.task.name == "counting"


def reply_words(prompts, replies, references):
    """A user's reward (import path tests.envs.test_env:reply_words): the reply's number of words."""
    return [float(len(r.split())) for r in replies]


def test_a_configured_reward_is_what_the_episode_returns(corpus):
    env = make_env("chitchat", data=str(corpus), reward={"fn": "tests.envs.test_env:reply_words"})
    words = [i for i, w in enumerate(env.task.vocab.itos) if w.isalpha()][:3]  # three ids that are words
    _, _, steps, _, info = play(env, [*words, env.specials.eos])
    assert [r for r, _, _ in steps] == [0.0, 0.0, 0.0, 3.0] and info["score"] == 3.0
    with pytest.raises(ConfigError, match="reward"):  # the oracle task has no reward to configure
        make_env("oracle", reward={"fn": "tests.envs.test_env:reply_words"}, **SMALL_ORACLE)
