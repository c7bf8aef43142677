"""reasoning-gym, TextArena and GEM through their adapters (rayseq/episodes/adapters.py): hand-played episodes get
the package's own answers and rewards, a GRPO group's seed is one game, what downloads at run time is refused, and
GRPO trains on each through the CLI."""

from __future__ import annotations

import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayseq.episodes.protocol import DownloadRefused, EnvError, make_environment
from rayseq.train import main as train_main
from tests.episodes.test_episodes import SMALL


def binary_search(env, seed: int, guess: str, lo: int, hi: int, higher=("higher",)):
    """Play guess-the-number by halving [lo, hi]: (guesses, last reward, done, info)."""
    env.reset(seed)
    for n in range(1, 20):
        g = (lo + hi) // 2
        obs, reward, done, info = env.step(guess.format(g))
        if done:
            return n, g, reward, info
        if any(h in obs.lower() for h in higher):
            lo = g + 1
        else:
            hi = g - 1
    raise AssertionError("never ended")


# -- reasoning-gym ----------------------------------------------------------------------------------------------
def test_reasoning_gym_scores_with_the_tasks_own_scorer():
    pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra")
    env = make_environment("reasoning_gym", {"task": "basic_arithmetic", "prompt": "none"})
    first = env.reset(1)
    assert first == [{"role": "user", "content": "Calculate 5 - 3 - 6."}]  # reasoning-gym's item 0 of seed 1
    assert env.step("5 - 3 - 6 = -4, so <answer>-4</answer>")[1:3] == (1.0, True)  # hand-computed: -4
    env.reset(1)
    reward, done, info = env.step("<answer>-5</answer>")[1:]
    assert reward < 1.0 and done and info == {"success": False, "answered": True}
    env.reset(1)
    assert env.step("-4")[3]["answered"] is False  # no <answer> tags: no answer
    # the seed is the question: a group's episodes share it, other seeds differ
    assert env.reset(7) == env.reset(7) and len({env.reset(s)[0]["content"] for s in range(6)}) > 3
    countdown = make_environment("reasoning_gym", {"task": "countdown", "config": {"min_numbers": 3,
                                                                                    "max_numbers": 3}})
    msgs = countdown.reset(5)
    assert msgs[0]["role"] == "system" and "<answer>" in msgs[0]["content"]
    assert len(countdown.entry["metadata"]["numbers"]) == 3
    assert countdown.step(f"<answer>{countdown.entry['answer']}</answer>")[1] == 1.0
    with pytest.raises(EnvError, match="env.kwargs.task='nope': not a reasoning-gym task"):
        make_environment("reasoning_gym", {"task": "nope"})


# -- TextArena ----------------------------------------------------------------------------------------------------
def test_textarena_tictactoe_against_the_fixed_opponent():
    pytest.importorskip("textarena", reason="the textarena extra")
    env = make_environment("textarena", {"game": "TicTacToe-v0", "opponent": "first"})
    first = env.reset(0)
    assert "Tic Tac Toe" in first and "Available Moves: '[0]'" in first
    # we play O in the centre; the fixed opponent takes the first free cell: 0, then 1 (we block 2), then 3, ...
    obs, reward, done, _ = env.step("[4]")
    assert not done and "Player 1 placed their symbol (X) in cell 0" in obs and "[Player 0]" not in obs
    assert env.step("[2]")[1:3] == (0.0, False)  # X takes 1
    assert env.step("[8]")[1:3] == (0.0, False)  # X takes 3
    obs, reward, done, info = env.step("[6]")  # 2-4-6: our diagonal
    assert (reward, done, info["success"]) == (1.0, True, True) and "won" in info["reason"]
    env.reset(0)
    for move in ("[8]", "[7]"):  # X: 0, 1, then 2 wins the top row
        env.step(move)
    assert env.step("[5]")[1:3] == (-1.0, True)


def test_textarena_guess_the_number_and_refusals():
    pytest.importorskip("textarena", reason="the textarena extra")
    env = make_environment("textarena", {"game": "GuessTheNumber-v0"})
    n, g, reward, info = binary_search(env, 3, "[{}]", 1, 20)
    assert reward == 1.0 and info["success"] and n <= 5  # 2^5 - 1 >= 20
    assert binary_search(env, 3, "[{}]", 1, 20)[1] == g  # the seed is the game
    with pytest.raises(DownloadRefused, match="Wordle-v0 loads NLTK word lists"):
        make_environment("textarena", {"game": "Wordle-v0"})
    with pytest.raises(EnvError, match="env.kwargs.game='Nothing-v0'"):
        make_environment("textarena", {"game": "Nothing-v0"})


# -- GEM ----------------------------------------------------------------------------------------------------------
def test_gem_guess_the_number_and_refusals():
    pytest.importorskip("gem", reason="the gem extra")
    env = make_environment("gem", {"env_id": "game:GuessTheNumber-v0-easy"})
    assert "between 1 and 10" in env.reset(0)
    found = {}
    for seed in range(8):
        n, g, reward, info = binary_search(env, seed, "\\boxed{{{}}}", 1, 10)
        assert reward == 1.0 and info["success"] and n <= 4  # 2^4 - 1 >= 10
        found[seed] = g
        assert binary_search(env, seed, "\\boxed{{{}}}", 1, 10)[1] == g  # the seed is the game
    assert len(set(found.values())) > 2
    obs = env.reset(0) and env.step("\\boxed{5}")[0]
    assert obs is None or re.search(r"Enter your next guess\.$", obs)  # GEM's suffix says what to do next
    for env_id, what in (("game:Wordle-v0-easy", "NLTK word lists"), ("math:Orz57K", "Hugging Face dataset")):
        with pytest.raises(DownloadRefused, match=what):
            make_environment("gem", {"env_id": env_id})


# -- GRPO through the CLI, a Transformer from scratch on characters -------------------------------------------------
@pytest.mark.e2e
@pytest.mark.parametrize("package,args", [
    ("reasoning_gym", ["env.name=reasoning_gym", "env.kwargs.task=basic_arithmetic", "env.kwargs.prompt=direct"]),
    ("textarena", ["env.name=textarena", "env.kwargs.game=TicTacToe-v0", "env.max_turns=5"]),
    ("gem", ["env.name=gem", "env.kwargs.env_id=game:GuessTheNumber-v0-easy", "env.max_turns=4"]),
])
def test_grpo_trains_on_the_package_from_the_cli(package, args, tmp_path, capsys):
    pytest.importorskip(package)
    run = tmp_path / "run"
    code = train_main([*args, "task.vocabulary=chars", "algo.name=grpo", "algo.group_size=2", "model.arch=transformer",
                       "train.batch_size=4", "train.iters=2", "env.max_tokens=1024", "model.max_positions=4096",
                       f"run_dir={run}", *SMALL])
    assert code == 0, capsys.readouterr().err
    rows = [r for r in pq.read_table(run / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert len(rows) == 2 and all(np.isfinite(r["loss/policy"]) and r["episode/failures"] == 0 for r in rows)


# -- OpenEnv --------------------------------------------------------------------------------------------------------
APP = "tests.envpkgs.openenv_guess:app"


@pytest.mark.slow  # the server's start (uvicorn, OpenEnv's imports) takes 10-25 s on a shared CPU
def test_openenv_episodes_through_its_own_server_and_client(tmp_path, capsys):
    pytest.importorskip("openenv", reason="the openenv extra")
    env = make_environment("openenv", {"app": APP})
    other = make_environment("openenv", {"app": APP})  # the same server, a session of its own
    assert other.url == env.url and env.reset(3) == other.reset(4) == "guess a number from 1 to 20"
    n, g, reward, _ = binary_search(env, 3, "{}", 1, 20)
    assert reward == 1.0 and n <= 5 and binary_search(env, 3, "{}", 1, 20)[1] == g  # the seed is the game
    env.reset(3)
    other.reset(3)
    assert env.step("0")[:3] == ("higher", 0.0, False) and other.step(str(g))[:3] == ("correct", 1.0, True)
    assert env.step(str(g))[:3] == ("correct", 1.0, True)  # the sessions' games are apart
    env.close(), other.close()
    with pytest.raises(EnvError, match="give env.kwargs.app .* or env.kwargs.base_url"):
        make_environment("openenv")
    with pytest.raises(EnvError, match='server did not start .*Could not import module "tests.envpkgs.nowhere"'):
        make_environment("openenv", {"app": "tests.envpkgs.nowhere:app", "startup_timeout_s": 60})
    run = tmp_path / "run"
    code = train_main(["env.name=openenv", f"env.kwargs.app={APP}", "env.max_turns=5", "task.vocabulary=chars",
                       "algo.name=grpo", "algo.group_size=2", "model.arch=transformer", "train.batch_size=4",
                       "train.iters=2", f"run_dir={run}", *SMALL])
    assert code == 0, capsys.readouterr().err
    rows = [r for r in pq.read_table(run / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert len(rows) == 2 and all(r["episode/failures"] == 0 and r["episode/turns"] >= 1 for r in rows)
