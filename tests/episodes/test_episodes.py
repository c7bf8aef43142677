"""Episodes with exact tokens: a whole episode replayed, the environments' failures survived and counted, the clear
errors of an environment that cannot start, and GRPO, REINFORCE, RLOO and PPO trained on an environment through the
CLI."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayseq.config import build_config
from rayseq.episodes.decode import StepContinuation
from rayseq.episodes.pool import LocalEnvs
from rayseq.episodes.protocol import EnvError, make_environment
from rayseq.episodes.runner import Limits, rollout_arrays, run_episodes
from rayseq.models.factory import make_generator
from rayseq.tasks import make_task
from rayseq.train import main as train_main
from tests.episodes.envs_for_tests import Faulty, Scored

ENVS = "tests.episodes.envs_for_tests"
SMALL = ["model.emb_dim=16", "model.hidden_dim=32", "model.ff_dim=64", "progress=false", "rollout.num_workers=0",
         "task.val_size=8", "task.test_size=8", "env.max_action_tokens=4"]


def episode_config(*overrides: str, run_dir=None):
    extra = [f"run_dir={run_dir}"] if run_dir is not None else []
    return build_config(None, SMALL + extra + list(overrides))


class Recorded:
    """A continuation that keeps what it was given and what it sampled, call by call."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __call__(self, srcs, prefixes, max_new, **kw):
        out = self.inner(srcs, prefixes, max_new, **kw)
        self.calls.append(([list(p) for p in prefixes], out))
        return out


@pytest.mark.parametrize("arch", ["rnn", "transformer"])
def test_a_replayed_episode_is_its_sampled_ids_and_rendered_observations(arch):
    """Three turns of Scored per episode, 4 episodes: the trained row is, turn by turn, the ids the policy sampled
    (never decoded and encoded again) then the observation's words and <turn> (with <eos> first where the action was
    cut at env.max_action_tokens); action_mask is 1 on sampled ids only; each turn's reward sits on its last sampled
    id; the log-probs are the engine's, and the policy's teacher-forced pass over the whole row gives them back."""
    cfg = episode_config(f"model.arch={arch}", f"env.name={ENVS}:Scored", "algo.name=grpo", "algo.group_size=2",
                         "train.batch_size=4")
    task = make_task(cfg.task)
    torch.manual_seed(0)
    policy = make_generator(cfg, task).eval()
    made = []

    def factory():
        made.append(Scored())
        return made[-1]

    cont = Recorded(StepContinuation(policy, torch.device("cpu")))
    seeds = [5, 5, 6, 7]
    episodes = run_episodes(LocalEnvs(factory, None), task.renderer, cont, seeds, [{}] * 4, Limits(3, 256, 4), seed=1)
    vocab, sp = task.vocab, task.specials

    def words(text):
        return [int(i) for i in vocab.encode(text.split())]

    a = rollout_arrays(episodes, sp.pad, task.renderer)
    assert len(a["tokens"]) == 4 and len(cont.calls) == 3  # one row per episode, one sampling call per turn
    for b, (ep, env) in enumerate(zip(episodes, made)):
        assert env.seed == seeds[b] and ep.turns == 3 and ep.failure is None
        tokens, mask, rewards, logp = [], [], [], []
        for k, (prefixes, out) in enumerate(cont.calls):
            assert prefixes[b] == tokens  # turn k continued exactly the episode so far
            ids, ended = out.ids[b], out.ended[b]
            assert str(env.heard[k]) == " ".join(vocab.decode(ids[:-1] if ended else ids))
            assert list(env.heard[k].token_ids) == (ids[:-1] if ended else ids)  # the action carries its ids
            tokens += ids
            mask += [1] * len(ids)
            logp += list(out.logp[b])
            rewards += [0.0] * len(ids)
            rewards[-1] = env.gave[k]  # the turn's reward on its last sampled id
            if k < 2:  # the observation that answers it, rendered: (<eos> if cut) words <turn>
                obs = ([] if ended else [sp.eos]) + words(env.said[k + 1]) + [vocab.stoi["<turn>"]]
                tokens += obs
                mask += [0] * len(obs)
                logp += [0.0] * len(obs)
                rewards += [0.0] * len(obs)
        n = len(tokens)
        assert a["src"][b, : a["src_len"][b]].tolist() == words(env.said[0])
        assert a["tokens"][b, :n].tolist() == tokens and not a["token_mask"][b, n:].any()
        assert a["action_mask"][b, :n].tolist() == mask
        np.testing.assert_allclose(a["rewards"][b, :n], rewards, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(a["logp"][b, :n], np.asarray(logp, np.float32))
        assert a["episode_return"][b] == pytest.approx(sum(env.gave))
        assert a["episode_drift"][b] == 0  # one token per word: re-encoding the conversation changes nothing
    # the policy's own log-probs of the whole trained rows, teacher-forced in one pass, are the sampled ones
    with torch.no_grad():
        tf = policy.logprobs(torch.from_numpy(a["src"]), torch.from_numpy(a["src_len"]),
                             torch.from_numpy(a["tokens"])).logp.numpy()
    sampled = a["action_mask"] > 0
    np.testing.assert_allclose(tf[sampled], a["logp"][sampled], rtol=0, atol=2e-5)
    assert np.isfinite(tf[a["token_mask"] > 0]).all()  # every trained token, observations' too, has a finite log-prob
    # the episodes of one seed (a GRPO group's) started from the same game
    assert made[0].said[0] == made[1].said[0]


def test_retokenization_drift_counts_changed_and_missing_ids():
    from rayseq.episodes.render import retokenization_drift

    assert retokenization_drift(np.array([4, 5, 6]), np.array([4, 5, 6])) == 0
    assert retokenization_drift(np.array([4, 5, 6, 7]), np.array([4, 9, 6])) == 2  # one changed, one missing


def test_failing_environments_end_their_episodes_and_are_counted():
    """Faulty: odd seeds raise at the second step, seed 2 hangs there past env.step_timeout_s; the others play on."""
    cfg = episode_config(f"env.name={ENVS}:Faulty", "algo.name=reinforce", "train.batch_size=4")
    task = make_task(cfg.task)
    torch.manual_seed(0)
    policy = make_generator(cfg, task).eval()
    envs = LocalEnvs(Faulty, step_timeout_s=1.0)
    try:
        episodes = run_episodes(envs, task.renderer, StepContinuation(policy, torch.device("cpu")), [0, 1, 2, 3],
                                [{}] * 4, Limits(3, 256, 4), seed=0)
    finally:
        envs.close()
    assert [ep.turns for ep in episodes] == [3, 2, 2, 2]
    assert episodes[0].failure is None
    assert episodes[1].failure.startswith("raised: RuntimeError") and episodes[3].failure.startswith("raised")
    assert episodes[2].failure.startswith("timeout")
    a = rollout_arrays(episodes, task.specials.pad)
    assert a["episode_failed"].tolist() == [0, 1, 1, 1] and a["episode_timeout"].tolist() == [0, 0, 1, 0]
    # a failed episode keeps what it sampled: its actions are trained with the rewards it got
    assert all(a["action_mask"][b].sum() > 0 for b in range(4))


@pytest.mark.parametrize(("name", "says"), [
    ("nosuch.module:Env", "module 'nosuch' not found"),
    (f"{ENVS}:Nope", "has no attribute 'Nope'"),
    (f"{ENVS}:NOT_AN_ENV", "not a class or a function"),
    ("guess_numbr", "unknown environment 'guess_numbr'"),
    (f"{ENVS}:Unbuildable", "Unbuildable() raised FileNotFoundError: no such file: missing.txt"),
    (f"{ENVS}:NoStart", "reset(0) raised KeyError"),
])
def test_an_environment_that_cannot_start_is_a_one_line_error(name, says, tmp_path, capsys):
    code = train_main([f"env.name={name}", "algo.name=grpo", "algo.group_size=2", "train.batch_size=4",
                       "train.iters=1", f"run_dir={tmp_path / 'run'}", *SMALL])
    err = capsys.readouterr().err
    assert code == 2 and "env.name" in err and says in err and "Traceback" not in err


def test_the_episodes_task_keys_apply_with_env_name():
    """env.name derives task.name=env: its keys (task.vocabulary) are accepted as given, before the derivation."""
    assert episode_config(f"env.name={ENVS}:Echo", "task.vocabulary=chars").task.vocabulary == "chars"
    with pytest.raises(ValueError, match="task.min_len: task.name=env does not read this key"):
        episode_config(f"env.name={ENVS}:Echo", "task.min_len=3")


@pytest.mark.parametrize(("name", "extra"), [("reasoning_gym", "reasoning-gym"), ("textarena", "textarena"),
                                             ("gem", "gem"), ("openenv", "openenv")])
def test_an_adapter_whose_package_is_missing_names_its_extra(name, extra, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: ImportError
    with pytest.raises(EnvError, match=rf'pip install -e "\.\[{extra}\]"'):
        make_environment(name)


def train_rows(run_dir):
    return [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r["stage"] == "train"]


@pytest.mark.e2e
@pytest.mark.parametrize(("algo", "arch"), [("grpo", "transformer"), ("reinforce", "rnn"), ("rloo", "rnn"),
                                           ("ppo", "transformer")])
def test_an_algorithm_trains_on_guess_the_number_from_the_cli(algo, arch, tmp_path, capsys):
    """``python -m rayseq.train env.name=guess_number ...``: episodes per iteration, their figures logged, the policy
    updated, the evaluation's episodes written as text to viewer/."""
    run = tmp_path / "run"
    group = ["algo.group_size=4"] if algo in ("grpo", "rloo") else []
    code = train_main(["env.name=guess_number", "env.kwargs.hi=15", "env.kwargs.max_guesses=4", f"algo.name={algo}",
                       f"model.arch={arch}", "train.batch_size=8", "train.iters=2", "train.eval_every=2",
                       f"run_dir={run}", *group, *SMALL])
    assert code == 0, capsys.readouterr().err
    rows = train_rows(run)
    assert len(rows) == 2
    for r in rows:
        assert 1 <= r["episode/turns"] <= 4 and 0 <= r["episode/success"] <= 1
        assert r["episode/failures"] == 0 and np.isfinite(r["loss/policy"])
    assert rows[0]["rollout/reward_mean"] == pytest.approx(rows[0]["episode/return"])
    text = "\n".join(p.read_text() for p in (run / "viewer").glob("val-*.txt"))
    assert "guess a number from 0 to 15 in 4 guesses" in text and "policy |" in text


@pytest.mark.e2e
def test_an_environment_that_raises_during_training_is_counted_not_fatal(tmp_path, capsys):
    run = tmp_path / "run"
    code = train_main([f"env.name={ENVS}:Faulty", "algo.name=reinforce", "train.batch_size=8", "train.iters=2",
                       "env.step_timeout_s=1", f"run_dir={run}", *SMALL])
    assert code == 0, capsys.readouterr().err
    rows = train_rows(run)
    assert sum(r["episode/failures"] for r in rows) > 0 and all(np.isfinite(r["loss/policy"]) for r in rows)


@pytest.mark.ray
@pytest.mark.e2e
def test_grpo_on_guess_the_number_with_ray_rollout_workers(tmp_path, capsys):
    """The same run on two Ray rollout workers (the CLI's own embedded Ray): each worker plays its shard's episodes;
    a GRPO group's G episodes are one game."""
    run = tmp_path / "run"
    code = train_main(["env.name=guess_number", "env.kwargs.hi=15", "env.kwargs.max_guesses=4", "algo.name=grpo",
                       "algo.group_size=4", "model.arch=transformer", "train.batch_size=8", "train.iters=2",
                       f"run_dir={run}", *SMALL, "rollout.num_workers=2", "rollout.num_cpus_per_worker=0.5",
                       "learner.num_cpus=0.5"])
    assert code == 0, capsys.readouterr().err
    rows = train_rows(run)
    assert len(rows) == 2 and all(r["rollout/worker_restarts"] == 0 for r in rows)
    assert all(1 <= r["episode/turns"] <= 4 for r in rows)


@pytest.mark.e2e
def test_the_guides_own_environment_trains_with_the_guides_command(tmp_path, monkeypatch, capsys):
    """docs/guides/environments.md: its my_env.py is examples/episodes/my_env.py, and its command trains it (with a
    tiny budget appended) from the folder that holds the file."""
    from tests.doc_examples import ROOT, code_blocks, commands, page

    blocks = code_blocks(page("docs/guides/environments.md"))
    example = (ROOT / "examples" / "episodes" / "my_env.py").read_text(encoding="utf-8")
    assert next(b for lang, b in blocks if lang == "python") == example
    cmd = next(c for lang, b in blocks if lang == "bash" for c in commands(b) if any("my_env:" in a for a in c))
    (tmp_path / "my_env.py").write_text(example)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code = train_main([*cmd[3:], "train.iters=2", "train.batch_size=8", f"run_dir={tmp_path / 'run'}", *SMALL])
    assert code == 0, capsys.readouterr().err
    rows = train_rows(tmp_path / "run")
    assert len(rows) == 2 and all(1 <= r["episode/turns"] <= 2 for r in rows)


@pytest.mark.ray
def test_environment_actors_survive_a_hung_environment(ray_session):
    """env.num_actors: slot b lives on actor b mod 2. Seed 2 hangs its actor (killed and replaced after
    env.step_timeout_s), which takes slot 0's environment with it: episode 0 ends as a failure rather than restarting
    its game silently; odd seeds raise. The next batch on the same pool plays every episode to its end."""
    from rayseq.distributed.env_actors import ActorEnvs

    cfg = episode_config(f"env.name={ENVS}:Faulty", "algo.name=reinforce", "train.batch_size=4")
    task = make_task(cfg.task)
    torch.manual_seed(0)
    policy = make_generator(cfg, task).eval()
    cont = StepContinuation(policy, torch.device("cpu"))
    envs = ActorEnvs(f"{ENVS}:Faulty", {}, num_actors=2, max_concurrent=4, step_timeout_s=1.0)
    try:
        first = run_episodes(envs, task.renderer, cont, [0, 1, 2, 3], [{}] * 4, Limits(3, 256, 4), seed=0)
        again = run_episodes(envs, task.renderer, cont, [0, 4, 8, 12], [{}] * 4, Limits(3, 256, 4), seed=1)
    finally:
        envs.close()
    assert first[2].failure.startswith("timeout") and envs.replaced == 1
    assert first[1].failure.startswith("raised: RuntimeError") and first[3].failure.startswith("raised")
    assert "replaced" in first[0].failure and first[0].turns == 3
    assert all(ep.failure is None and ep.turns == 3 for ep in again)
