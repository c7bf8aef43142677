"""Episodes sampled by vLLM (``env.name`` with ``rollout.engine=vllm``, a Hugging Face policy with a chat template):
the worker holds the policy's frame only; an episode's trained ids are, turn by turn, the ids vLLM sampled and the
chat template's rendered observations (masked out of ``action_mask``), with vLLM's log-probs kept as it gave them and
the learner's recomputed ones beside them; GRPO trains from the CLI on a built-in game, a user's class, a TRL
``environment_factory`` class and (where the packages are installed) each adapter's package, in-process and on a
Ray worker."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayseq.config import build_config
from rayseq.train import main as train_main
from tests.episodes.envs_for_tests import Echo
from tests.episodes.test_chat_render import ENDS_REPLIES, TOOLS_TEMPLATE
from tests.episodes.test_episodes import Recorded
from tests.hf_fixtures import with_chat_template
from tests.vllm.conftest import ENGINE_KWARGS

ENVS = "tests.episodes.envs_for_tests"
FACTORY = f"{ENVS}:TRLCounter"  # a class written for TRL's GRPOTrainer(environment_factory=...)
SIZED = f"rollout.engine_kwargs={{kv_cache_memory_bytes: {ENGINE_KWARGS['kv_cache_memory_bytes']}}}"
TINY = ["progress=false", "task.val_size=4", "task.test_size=4", "algo.name=grpo", "algo.group_size=2",
        "train.batch_size=4", "train.iters=2", "seed=0", "model.arch=hf", "rollout.engine=vllm", SIZED]


@pytest.fixture(scope="module")
def chat_dir(vllm_hf_dir, tmp_path_factory):
    """The vLLM tests' tiny GPT-2 whose chat template closes each reply with its end token."""
    return with_chat_template(vllm_hf_dir, tmp_path_factory.mktemp("episodes") / "tiny-chat", ENDS_REPLIES)


def test_a_vllm_episode_is_its_sampled_ids_and_the_rendered_observations(chat_dir, tmp_path):
    """Four episodes of Scored (three turns each) sampled by vLLM on a worker without the policy's weights: each row
    is, turn by turn, the ids vLLM returned then the template's suffix (``<|user|> say <word><|assistant|> ``, the
    words the environment said), the suffix out of ``action_mask``; the row's engine log-probs are vLLM's, untouched;
    the learner's log-probs of the row (its micro-batched pass) equal the policy's own teacher-forced ones (1e-6) and
    vLLM's within its float32 kernels' rounding (1e-3), the importance weights near 1."""
    from rayseq.algos.common import behaviour_logprobs
    from rayseq.distributed.actors.learner import Learner
    from rayseq.distributed.actors.worker import RolloutWorker
    from rayseq.episodes.decode import StreamContinuation
    from rayseq.models.hf import HFPolicyFrame
    from rayseq.types import RolloutRequest

    cfg = build_config(None, [*TINY, f"model.path={chat_dir}", f"env.name={ENVS}:Scored", "env.max_action_tokens=6",
                              "rollout.num_workers=0", f"run_dir={tmp_path / 'run'}"])
    learner = Learner(cfg)
    learner.start_stage("train")
    worker = RolloutWorker(cfg)
    assert worker.generator is None and isinstance(worker.policy, HFPolicyFrame)  # the engine holds the weights
    assert isinstance(worker.sampler.continuation, StreamContinuation)
    assert worker.sampler.limits.context == 128  # the tiny GPT-2's positions (vLLM's max_model_len the same)
    with torch.no_grad():  # weights the engine's start (model.path's) do not have
        for p in learner.state.generator.parameters():
            p.add_(0.02 * torch.randn_like(p))
    worker.set_weights(learner.get_weights(), 1)
    assert worker.engine.checksum_diff == 0.0
    worker.sampler.continuation = cont = Recorded(worker.sampler.continuation)
    prompts = learner.task.sample_prompts(np.random.default_rng(0), 4)
    rollout = worker.sample(prompts, RolloutRequest(max_len=cfg.env.max_tokens, seed=3), score=True)
    assert rollout.logp is None and rollout.engine_logp is not None  # the policy's are the learner's to compute
    assert rollout.info["engine_checksum_diff"] == 0.0  # sampled with the weights the learner gave
    assert len(rollout) == 4 and len(cont.calls) == 3 and rollout.extras["episode_splits"].sum() == 0
    tok = learner.task.vocab.tokenizer
    for b, seed in enumerate(rollout.key):
        n = int(rollout.token_mask[b].sum())
        row, pos = rollout.tokens[b, :n].tolist(), 0
        for k, (prefixes, out) in enumerate(cont.calls):
            assert prefixes[b] == row[:pos]  # turn k continued exactly the episode so far
            ids = out.ids[b]
            assert row[pos: pos + len(ids)] == ids and rollout.action_mask[b, pos: pos + len(ids)].all()
            np.testing.assert_array_equal(rollout.engine_logp[b, pos: pos + len(ids)], out.logp[b])
            assert rollout.rewards[b, pos + len(ids) - 1] >= (k + 1) / 10 - 1e-6  # the turn's reward, on its last id
            pos += len(ids)
            if k < 2:  # the suffix: read, not trained; the words Scored says are Echo's, from the seed
                nxt = pos + next(i for i, m in enumerate(rollout.action_mask[b, pos:n].tolist() + [1]) if m)
                assert not rollout.action_mask[b, pos:nxt].any() and not rollout.engine_logp[b, pos:nxt].any()
                word = Echo.WORDS[(int(seed) + k + 1) % 3]
                assert tok.decode(row[pos:nxt]).endswith(f"<|user|> say {word}<|assistant|> ")
                pos = nxt
        assert pos == n
        first = Echo.WORDS[int(seed) % 3]  # the row's prompt: the first observation, rendered
        assert f"say {first}" in tok.decode(rollout.src[b, : rollout.src_len[b]].tolist())
    behaviour_logprobs(learner.state, rollout, cfg.rollout.logp_correction, cfg.rollout.tis_cap)
    src, src_len, tokens = (torch.from_numpy(a) for a in (rollout.src, rollout.src_len, rollout.tokens))
    with torch.no_grad():
        want = learner.state.generator.eval().logprobs(src, src_len, tokens).logp * torch.from_numpy(
            rollout.action_mask)
    np.testing.assert_allclose(rollout.logp, want.numpy(), rtol=0, atol=1e-6)
    sampled = rollout.action_mask > 0
    assert np.abs(rollout.logp - rollout.engine_logp)[sampled].max() < 1e-3
    assert np.abs(rollout.is_weights[sampled] - 1).max() < 1e-3


def test_a_val_evaluation_of_an_environment_is_played_on_the_vllm_engine(chat_dir, tmp_path):
    """val's episodes (one chunk of 4) played by a worker whose engine is vLLM and holds the only weights
    (:func:`decode_held_out`: the worker's sampler, its continuation through vLLM, turn by turn), the learner adding up
    the figures from what came back, playing no episode of its own."""
    from rayseq.distributed.actors.learner import Learner
    from rayseq.distributed.actors.worker import RolloutWorker, decode_held_out

    cfg = build_config(None, [*TINY, f"model.path={chat_dir}", f"env.name={ENVS}:Echo", "env.max_action_tokens=4",
                              "rollout.num_workers=0", "env.transcripts=2", f"run_dir={tmp_path / 'run'}"])
    learner = Learner(cfg)
    worker = RolloutWorker(cfg)
    assert worker.generator is None and worker.engine.name == "vllm"
    assert worker.sampler.continuation.engine is worker.engine
    worker.set_weights(learner.get_weights(), 1)
    worker.sampler.continuation = cont = Recorded(worker.sampler.continuation)
    decodes = learner.task.eval_decodes("val")
    played = [decode_held_out(worker, d) for d in decodes]
    assert len(decodes) == 1 and played[0][1]["rows"] == 4 and played[0][1]["version"] == 1
    assert 1 <= len(cont.calls) <= 3  # every turn of the four episodes sampled by vLLM
    metrics, details = learner.evaluate("val", [result for result, _ in played])
    assert 1 <= metrics["val/turns"] <= 3 and metrics["val/failures"] == 0
    assert metrics["val/reward"] == metrics["val/return"]
    seeds = learner.task.split_seeds("val")[0]
    assert details["viewer"].startswith(f"seed {seeds[0]}: ") and f"seed {seeds[1]}: " in details["viewer"]


def train_rows(run) -> list[dict]:
    return [r for r in pq.read_table(run / "metrics.parquet").to_pylist() if r["stage"] == "train"]


def check_episode_run(rows, iters: int, max_turns: int) -> None:
    assert len(rows) == iters
    for r in rows:  # episodes ran on vLLM with the learner's weights, their log-probs corrected
        assert 1 <= r["episode/turns"] <= max_turns and r["episode/failures"] == 0
        assert np.isfinite(r["loss/policy"])
        assert r["sync/engine_checksum_diff"] == 0.0
        assert r["rollout/logp_diff_mean"] < 1e-3 and 0 <= r["rollout/engine_kl"] < 1e-4
        assert r["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-3)


def run_cli(args, run, capsys) -> list[dict]:
    code = train_main([*TINY, f"run_dir={run}", *args])
    assert code == 0, capsys.readouterr().err
    return train_rows(run)


@pytest.mark.e2e
@pytest.mark.parametrize("case", ["guess_number", "user_class"])
def test_grpo_trains_on_vllm_episodes_from_the_cli(case, chat_dir, tmp_path, capsys):
    """A built-in game and a user's class (by import path), GRPO with rollout.engine=vllm in-process."""
    env = (["env.name=guess_number", "env.kwargs.hi=15", "env.kwargs.max_guesses=3"] if case == "guess_number"
           else [f"env.name={ENVS}:Echo"])
    rows = run_cli([*env, f"model.path={chat_dir}", "rollout.num_workers=0", "env.max_action_tokens=4"],
                   tmp_path / "run", capsys)
    check_episode_run(rows, 2, 3)


@pytest.mark.e2e
def test_grpo_trains_on_a_trl_environment_factory_class_with_vllm(vllm_hf_dir, tmp_path, capsys):
    """A class written for TRL's ``environment_factory`` (``env.name=trl``), its tools rendered by the template, its
    rows' columns given to ``reset``."""
    model = with_chat_template(vllm_hf_dir, tmp_path / "tiny-tools", TOOLS_TEMPLATE)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": "Count."}], "target": t}) + "\n"
                            for t in (2, 3, 4)))
    rows = run_cli(["env.name=trl", f"env.kwargs.factory={FACTORY}", "env.kwargs.max_calls=2", "env.max_turns=3",
                    f"env.rows={data}", "env.max_action_tokens=24", f"model.path={model}", "rollout.num_workers=0"],
                   tmp_path / "run", capsys)
    check_episode_run(rows, 2, 3)


ADAPTERS = {  # env.name -> (its package, the run's env keys, turns at most)
    "reasoning_gym": ("reasoning_gym", ["env.kwargs.task=basic_arithmetic", "env.kwargs.prompt=none",
                                        "env.max_action_tokens=8"], 1),
    "textarena": ("textarena", ["env.kwargs.game=TicTacToe-v0", "env.kwargs.opponent=first", "env.max_turns=3",
                                "env.max_action_tokens=4"], 3),
    "gem": ("gem", ["env.kwargs.env_id=game:GuessTheNumber-v0-easy", "env.max_turns=3", "env.max_action_tokens=6"],
            3),
    "openenv": ("openenv", ["env.kwargs.app=tests.envpkgs.openenv_guess:app", "env.max_turns=3",
                            "env.max_action_tokens=4"], 3),
}


@pytest.fixture(scope="module")
def wide_chat_dir(tmp_path_factory):
    """``chat_dir``'s model reading 512 positions: TextArena's and GEM's first observations (their rules) are longer
    than the 128 the tests' tiny model reads."""
    from tests.conftest import GREETINGS, REPLIES, TOPICS
    from tests.hf_fixtures import make_tiny_hf

    model = make_tiny_hf(tmp_path_factory.mktemp("hf") / "tiny-gpt2-512",
                         extra_lines=tuple(GREETINGS + REPLIES + TOPICS) * 5, n_head=1, positions=512)
    return with_chat_template(model, tmp_path_factory.mktemp("episodes") / "tiny-chat-512", ENDS_REPLIES)


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_grpo_trains_on_an_adapters_package_with_vllm(name, wide_chat_dir, tmp_path, capsys):
    """Each adapter's package on vLLM: reasoning-gym's basic arithmetic (one turn, the task's own scorer), TextArena's
    tic-tac-toe against the fixed opponent, GEM's guess-the-number, an OpenEnv app through its own server."""
    package, keys, turns = ADAPTERS[name]
    pytest.importorskip(package, reason="the adapters' packages beside vLLM: pip install -e .[vllm,envpkgs]")
    rows = run_cli([f"env.name={name}", *keys, f"model.path={wide_chat_dir}", "rollout.num_workers=0"],
                   tmp_path / "run", capsys)
    check_episode_run(rows, 2, turns)


@pytest.mark.e2e
def test_a_first_observation_longer_than_the_model_reads_ends_its_episode_not_the_run(chat_dir, tmp_path, capsys):
    """TextArena's rules (its first observation) are longer than the 128 positions the tiny model reads: each
    episode ends before its first action (``episode/truncated``, no turn), its row cut to the model's positions, and
    the run goes on."""
    pytest.importorskip("textarena", reason="the adapters' packages beside vLLM: pip install -e .[vllm,envpkgs]")
    rows = run_cli(["env.name=textarena", *ADAPTERS["textarena"][1], f"model.path={chat_dir}",
                    "rollout.num_workers=0"], tmp_path / "run", capsys)
    assert len(rows) == 2 and all(r["episode/turns"] == 0 and r["episode/truncated"] == 1.0 for r in rows)
    assert all(np.isfinite(r["loss/policy"]) for r in rows)  # nothing sampled: nothing learnt, and no NaN


@pytest.mark.ray
def test_grpo_trains_on_vllm_episodes_on_a_ray_worker(ray_session, chat_dir, tmp_path, capsys):
    """The same on a Ray rollout worker (vLLM and the environments inside the actor), the environments in an actor
    of their own (env.num_actors=1)."""
    rows = run_cli([f"env.name={ENVS}:Echo", f"model.path={chat_dir}", "env.max_action_tokens=4",
                    "rollout.num_workers=1", "rollout.num_cpus_per_worker=1", "scorer.num_scorers=0",
                    "learner.num_cpus=1", "env.num_actors=1"], tmp_path / "run", capsys)
    check_episode_run(rows, 2, 3)
    assert all(r["rollout/staleness"] == 0 for r in rows)
