"""Episodes of a Hugging Face policy (a tiny local GPT-2) whose observations are its chat template's suffix: a
replayed episode is its sampled ids plus the rendered suffixes, the policy's teacher-forced log-probs of the whole row
give back the engine's, and GRPO trains on it through the CLI."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayseq.engines.base import BuiltinEngine
from rayseq.episodes.decode import StreamContinuation, make_continuation
from rayseq.episodes.pool import LocalEnvs
from rayseq.episodes.runner import Limits, rollout_arrays, run_episodes
from rayseq.models.factory import make_generator
from rayseq.tasks import make_task
from rayseq.train import main as train_main
from tests.episodes.envs_for_tests import Echo, Scored
from tests.episodes.test_chat_render import ENDS_REPLIES
from tests.episodes.test_episodes import ENVS, SMALL, Recorded, episode_config
from tests.hf_fixtures import with_chat_template

pytest.importorskip("transformers", reason="the hf extra: pip install -e .[hf]")


@pytest.fixture(scope="module")
def chat_model(hf_dir, tmp_path_factory):
    """The tiny GPT-2 whose tokenizer's chat template closes each reply with its end token."""
    return with_chat_template(hf_dir, tmp_path_factory.mktemp("episodes") / "tiny-chat", ENDS_REPLIES)


def test_a_replayed_hf_episode_is_its_sampled_ids_and_the_templates_suffixes(chat_model):
    cfg = episode_config("model.arch=hf", f"model.path={chat_model}", f"env.name={ENVS}:Scored", "algo.name=grpo",
                         "algo.group_size=2", "train.batch_size=4")
    task = make_task(cfg.task)
    torch.manual_seed(0)
    policy = make_generator(cfg, task).eval()
    cont = make_continuation(policy, BuiltinEngine(policy, torch.device("cpu")), torch.device("cpu"))
    assert isinstance(cont, StreamContinuation)  # the prompt and the episode so far, read as one stream
    cont = Recorded(cont)
    made = []

    def factory():
        made.append(Scored())
        return made[-1]

    episodes = run_episodes(LocalEnvs(factory, None), task.renderer, cont, [3, 3, 4, 5], [{}] * 4,
                            Limits(3, 256, 4), seed=2)
    a = rollout_arrays(episodes, policy.pad_id, task.renderer)
    tok = task.vocab.tokenizer
    assert len(a["tokens"]) == 4 and not a["episode_splits"].any()  # the template extends the prefix: no split
    for b, env in enumerate(made):
        n = int(a["token_mask"][b].sum())
        row = a["tokens"][b, :n].tolist()
        pos = 0
        for k, (prefixes, out) in enumerate(cont.calls):
            assert prefixes[b] == row[:pos]  # turn k continued exactly the episode so far
            ids = out.ids[b]
            assert row[pos: pos + len(ids)] == ids and a["action_mask"][b, pos: pos + len(ids)].all()
            np.testing.assert_array_equal(a["logp"][b, pos: pos + len(ids)], out.logp[b])
            assert a["rewards"][b, pos + len(ids) - 1] == pytest.approx(env.gave[k])
            pos += len(ids)
            if k < 2:  # the suffix: (<eos> if cut), the user's message, the generation prompt; read, not trained
                nxt = pos + next(i for i, m in enumerate(a["action_mask"][b, pos:n].tolist() + [1]) if m)
                assert not a["action_mask"][b, pos:nxt].any()
                text = tok.decode(row[pos:nxt])
                assert text.endswith(f"<|user|> {env.said[k + 1]}<|assistant|> ")
                pos = nxt
        assert pos == n
    with torch.no_grad():
        tf = policy.logprobs(torch.from_numpy(a["src"]), torch.from_numpy(a["src_len"]),
                             torch.from_numpy(a["tokens"])).logp.numpy()
    sampled = a["action_mask"] > 0
    np.testing.assert_allclose(tf[sampled], a["logp"][sampled], rtol=0, atol=1e-4)
    # sampled byte-level pieces do not survive a re-encoding of the conversation's text
    assert a["episode_drift"].sum() > 0


@pytest.mark.e2e
def test_grpo_trains_a_hf_policy_on_an_environment_from_the_cli(chat_model, tmp_path, capsys):
    run = tmp_path / "run"
    code = train_main(["env.name=guess_number", "env.kwargs.hi=15", "env.kwargs.max_guesses=3", "algo.name=grpo",
                       "algo.group_size=4", "model.arch=hf", f"model.path={chat_model}", "train.batch_size=8",
                       "train.iters=2", f"run_dir={run}", *SMALL])
    assert code == 0, capsys.readouterr().err
    rows = [r for r in pq.read_table(run / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert len(rows) == 2 and all(r["episode/splits"] == 0 and 1 <= r["episode/turns"] <= 3 for r in rows)
    assert all(np.isfinite(r["loss/policy"]) for r in rows)
    assert rows[0]["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # the learner's log-probs are the engine's


@pytest.mark.parametrize("grouped", [False, True])
def test_a_template_that_rewrites_turns_splits_the_episode_or_ends_a_groups(chat_model, grouped):
    """A template that keeps only the last two messages cannot be shown to extend the prefix: alone, the episode goes
    on in a new row whose prompt is the conversation rendered again (a row's last sampled token carries the later
    rows' rewards: the first row's return is the episode's); in a group it ends there, one row per episode."""
    from tests.episodes.test_chat_render import FORGETS

    cfg = episode_config("model.arch=hf", f"model.path={chat_model}", f"env.name={ENVS}:Scored", "algo.name=grpo",
                         "algo.group_size=2", "train.batch_size=4")
    task = make_task(cfg.task)
    task.vocab.tokenizer.chat_template = FORGETS
    torch.manual_seed(0)
    policy = make_generator(cfg, task).eval()
    cont = make_continuation(policy, BuiltinEngine(policy, torch.device("cpu")), torch.device("cpu"))
    episodes = run_episodes(LocalEnvs(Scored, None), task.renderer, cont, [3, 4], [{}] * 2, Limits(3, 256, 4),
                            seed=2, split_ends=grouped)
    a = rollout_arrays(episodes, policy.pad_id, task.renderer)
    if grouped:
        assert len(a["tokens"]) == 2 and [ep.truncated for ep in episodes] == ["split", "split"]
        assert all(ep.turns == 1 for ep in episodes)
    else:
        assert len(a["tokens"]) == 6 and a["episode_continues"].tolist() == [0, 1, 1, 0, 1, 1]  # one row per turn
        assert all(ep.turns == 3 and len(ep.splits) == 2 for ep in episodes)
        for b, ep in zip((0, 3), episodes):
            assert a["rewards"][b].sum() == pytest.approx(ep.ret)  # the first row carries the episode's return


def test_episodes_keep_to_the_positions_the_policy_reads(chat_model):
    """A Hugging Face policy reads at most its model's positions (prompt and tokens of a row): a turn is cut to what
    the fullest row has left and an observation that would pass them ends the episode (``tokens``), so no row is
    longer; a prompt that fills them ends its episode before any turn (``prompt``: its row keeps the prompt's last
    positions, so that no pass reads past the model's); a limit that never binds changes nothing (the
    same episodes, id for id, as without one); a step policy has none."""
    from rayseq.episodes.decode import context_length

    cfg = episode_config("model.arch=hf", f"model.path={chat_model}", f"env.name={ENVS}:Scored", "algo.name=grpo",
                         "algo.group_size=2", "train.batch_size=4")
    task = make_task(cfg.task)
    torch.manual_seed(0)
    policy = make_generator(cfg, task).eval()
    assert context_length(policy) == policy.model.config.n_positions == 128
    assert context_length(make_generator(episode_config(f"env.name={ENVS}:Scored"), task)) is None
    cont = make_continuation(policy, BuiltinEngine(policy, torch.device("cpu")), torch.device("cpu"))

    def play(context, seeds=(3, 4, 5)):
        return run_episodes(LocalEnvs(Scored, None), task.renderer, cont, list(seeds), [{}] * len(seeds),
                            Limits(3, 256, 4, context=context), seed=2)

    prompt = max(len(task.renderer.start(f"say {w}")[0]) for w in Echo.WORDS)
    for context in range(prompt + 1, prompt + 25):  # every room an action can meet after an observation
        for ep in play(context):
            (s,) = ep.samples
            assert len(s.src) + len(s.tokens) <= context
            assert ep.truncated == "tokens" or (ep.truncated is None and ep.turns == 3)
    assert all(ep.truncated == "tokens" and ep.turns < 3 for ep in play(prompt + 9))
    free = [[(s.src, s.tokens, s.logp) for s in ep.samples] for ep in play(None)]
    assert [[(s.src, s.tokens, s.logp) for s in ep.samples] for ep in play(10_000)] == free
    assert all(ep.turns == 3 and ep.truncated is None for ep in play(10_000))
    red = task.renderer.start("say red")[0]  # seed 0 says red
    for context in (len(red), len(red) - 7):  # a prompt as long as the positions, or longer: no turn is played
        (ep,) = play(context, seeds=[0])
        assert ep.turns == 0 and ep.truncated == "prompt" and not ep.samples[0].tokens
        assert ep.samples[0].src == list(red[-(context - 1):])  # its row within the positions: its last ones
    # (a first observation longer than the model's 128 positions trains on vLLM: tests/vllm, TextArena's and GEM's)
