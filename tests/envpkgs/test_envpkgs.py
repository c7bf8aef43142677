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
    env.reset(0)
    assert env.step("five")[:3] == (None, -0.1, True)  # GEM ends the game on a reply without \boxed{}, at -0.1
    obs = env.reset(0) and env.step("\\boxed{5}")[0]
    assert obs is None or re.search(r"Enter your next guess\.$", obs)  # GEM's suffix says what to do next
    partial = make_environment("gem", {"env_id": "rg:complex_arithmetic"})  # reasoning-gym's task inside GEM
    assert partial.reset(1) == "Divide the complex numbers: (-33.0 - 21.0i) ÷ (-3.0 + 3.0i)"
    _, reward, done, info = partial.step("\\boxed{0}")  # wrong: partial credit, not a success
    assert done and 0 < reward < 1 and info["success"] is False
    # the quotient, hand-computed: (-33 - 21i)(-3 - 3i) / 18 = (99 - 63 + (99 + 63)i) / 18 = 2 + 9i
    assert partial.reset(1) and partial.step("\\boxed{2.0 + 9.0i}")[1:3] == (1.0, True)
    for env_id, what in (("game:Wordle-v0-easy", "NLTK word lists"), ("math:Orz57K", "Hugging Face dataset")):
        with pytest.raises(DownloadRefused, match=what):
            make_environment("gem", {"env_id": env_id})


# -- the guide's commands (docs/guides/environments.md), made small -------------------------------------------------
def guide_command(name: str) -> list[str]:
    """The arguments of the guide's ``python -m rayseq.train env.name=<name> ...`` command."""
    from tests.doc_commands import bash_blocks, command_lines

    for block in bash_blocks("docs/guides/environments.md"):
        for args in command_lines(block.code):
            if args[:3] == ["python", "-m", "rayseq.train"] and f"env.name={name}" in args:
                return args[3:]
    raise AssertionError(f"the guide has no command with env.name={name}")


SMALLER = ["algo.group_size=2", "train.batch_size=4", "train.iters=2", *SMALL]


@pytest.mark.e2e
@pytest.mark.parametrize("name,package", [("reasoning_gym", "reasoning_gym"), ("textarena", "textarena"),
                                          ("gem", "gem")])
def test_the_guides_command_trains_grpo_on_the_package(name, package, tmp_path, capsys):
    pytest.importorskip(package)
    run = tmp_path / "run"
    assert train_main([*guide_command(name), *SMALLER, f"run_dir={run}"]) == 0, capsys.readouterr().err
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
    run = tmp_path / "run"  # the guide's command with this app
    args = [f"env.kwargs.app={APP}" if a.startswith("env.kwargs.app=") else a for a in guide_command("openenv")]
    assert train_main([*args, *SMALLER, f"run_dir={run}"]) == 0, capsys.readouterr().err
    rows = [r for r in pq.read_table(run / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert len(rows) == 2 and all(r["episode/failures"] == 0 and r["episode/turns"] >= 1 for r in rows)


# -- the packages in environment actors (env.num_actors) -----------------------------------------------------------
def _servers_of(parent: int) -> list[int]:
    """The pids of the OpenEnv servers that process ``parent`` started (rayseq.episodes.child_server)."""
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "rayseq.episodes.child_server" in args and APP in args and args[args.index("--parent") + 1] == str(parent):
            found.append(int(pid))
    return found


@pytest.mark.ray
@pytest.mark.slow  # two actors' start-ups and an OpenEnv server's (uvicorn, OpenEnv's imports): 20-40 s
def test_packages_play_in_environment_actors_and_a_killed_actor_takes_its_server_along(ray_session):
    """TextArena's tic-tac-toe in a pool of two actors plays as in the process, move for move; an OpenEnv server
    started inside an actor (the heavy environment env.num_actors is for) ends when that actor is killed."""
    import random
    import time

    from rayseq.distributed.env_actors import ActorEnvs
    from rayseq.episodes.adapters import random_move

    pytest.importorskip("textarena", reason="the textarena extra")
    kwargs = {"game": "TicTacToe-v0", "opponent": "first"}
    here = [make_environment("textarena", kwargs) for _ in range(4)]
    pool = ActorEnvs("textarena", kwargs, num_actors=2, max_concurrent=2, step_timeout_s=120)
    try:
        seeds = [0, 1, 2, 3]
        obs = pool.call([(b, "reset", (s,), {}) for b, s in enumerate(seeds)])
        assert obs == [env.reset(s) for env, s in zip(here, seeds)]
        done = [False] * 4
        rngs = [random.Random(s) for s in seeds]
        for _ in range(5):
            live = [b for b in range(4) if not done[b]]
            moves = {b: random_move(obs[b], rngs[b]) for b in live}
            theirs = pool.call([(b, "step", (moves[b],), {}) for b in live])
            for b, result in zip(live, theirs):
                assert tuple(result[:3]) == tuple(here[b].step(moves[b])[:3])
                obs[b], done[b] = result[0], result[2]
        assert pool.replaced == 0
    finally:
        pool.close()

    pytest.importorskip("openenv", reason="the openenv extra")
    pool = ActorEnvs("openenv", {"app": APP}, num_actors=1, max_concurrent=2, step_timeout_s=120)
    try:
        assert pool.call([(0, "reset", (3,), {}), (1, "reset", (4,), {})]) == ["guess a number from 1 to 20"] * 2
        actor_pid = ray_session.get(pool.actors[0].__ray_call__.remote(lambda self: __import__("os").getpid()))
        servers = _servers_of(actor_pid)
        assert len(servers) == 1  # one server per process, shared by its environments
        ray_session.kill(pool.actors[0], no_restart=True)  # no exit handler runs: as a lost node or a hung actor
        deadline = time.monotonic() + 30
        while _servers_of(actor_pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _servers_of(actor_pid), "the OpenEnv server outlived its killed actor"
    finally:
        pool.close()
