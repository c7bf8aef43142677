"""The environment's evaluation in chunks of episodes (rayseq.episodes.task.EnvTask.eval_decodes / eval_play /
eval_figures), checked against the plain loop that played a split's episodes in one call on the learner: one chunk
is that loop exactly; more chunks are each chunk played alone with its seed, the figures over their episodes
joined. Under Ray the rollout workers play the chunks and the learner's process plays none."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from rayseq.algos.episode_metrics import episode_metrics
from rayseq.engines.base import BuiltinEngine
from rayseq.episodes.decode import make_continuation
from rayseq.episodes.runner import rollout_arrays, run_episodes, transcript_text
from rayseq.models.factory import make_generator
from rayseq.tasks import make_task
from rayseq.tasks.evaluation import chunk_seed, decodes_split
from tests.episodes.test_episodes import ENVS, episode_config

GUESS = ("env.name=guess_number", "env.kwargs.hi=15", "env.kwargs.max_guesses=4", "algo.name=reinforce")


def plain(task, generator, seeds, seed: int) -> list:
    """The split's episodes in one call on ``generator`` (what the evaluation ran before it was chunked)."""
    envs = task.local_envs()
    try:
        cont = make_continuation(generator, BuiltinEngine(generator, torch.device("cpu")), torch.device("cpu"))
        return run_episodes(envs, task.renderer, cont, seeds, [{}] * len(seeds), task.limits_of(generator),
                            temperature=1.0, seed=seed, tools=task.tools)
    finally:
        envs.close()


def plain_figures(task, episodes, split: str) -> tuple[dict, dict]:
    m = episode_metrics(rollout_arrays(episodes, task.specials.pad, task.renderer), prefix=f"{split}/")
    m[f"{split}/reward"] = m[f"{split}/return"]
    m.pop(f"{split}/count")
    return m, {"viewer": "\n\n".join(transcript_text(ep) for ep in episodes[: task.env.transcripts])}


@pytest.fixture(scope="module")
def guess():
    cfg = episode_config(*GUESS, "task.val_size=8", "task.test_size=100")
    task = make_task(cfg.task)
    torch.manual_seed(0)
    return task, make_generator(cfg, task).eval()


def test_the_splits_are_chunks_of_their_seeds(guess):
    task, _ = guess
    assert decodes_split(task)
    val, test = task.eval_decodes("val"), task.eval_decodes("test")
    assert [(d.start, d.stop, d.seed) for d in val] == [(0, 8, 2019)]  # one chunk: the split's seed
    assert [(d.start, d.stop, d.seed) for d in test] == [(0, 64, 2018), (64, 100, chunk_seed(2018, 1))]
    seeds, seed = task.split_seeds("test")
    assert seed == 2018 and (seeds == np.random.default_rng(2018).integers(0, 2**31 - 1, size=100)).all()
    with pytest.raises(ValueError, match="split must be"):
        task.eval_decodes("train")


def test_one_chunk_is_the_plain_loop(guess):
    """val (8 episodes: one chunk) = the split's episodes played in one call with the split's seed, every figure and
    the viewer's text."""
    task, g = guess
    seeds, seed = task.split_seeds("val")
    expected = plain_figures(task, plain(task, g, seeds, seed), "val")
    got = task.evaluate(g, split="val")
    assert got == expected
    assert set(got[0]) >= {"val/success", "val/return", "val/turns", "val/turn_reward/1"}


def test_chunks_are_each_played_alone_with_their_seed(guess):
    """test (100 episodes: chunks 0:64 and 64:100) = each chunk played alone, chunk c with chunk_seed(2018, c), the
    figures over the 100 episodes in seed order (the means as one call's over the same episodes would be)."""
    task, g = guess
    seeds, seed = task.split_seeds("test")
    episodes = plain(task, g, seeds[:64], seed) + plain(task, g, seeds[64:], chunk_seed(seed, 1))
    assert task.evaluate(g, split="test") == plain_figures(task, episodes, "test")


def test_the_figures_check_each_chunk_came_back_whole(guess):
    task, g = guess
    sampler = task.episode_sampler(g, BuiltinEngine(g, torch.device("cpu")), torch.device("cpu"))
    try:
        d = task.eval_decodes("val")[0]
        result = task.eval_play(d, sampler)
    finally:
        sampler.envs.close()
    assert len(result["episode_return"]) == 8 and len(result["transcripts"]) == task.env.transcripts
    with pytest.raises(ValueError, match="1 decodes of val's episodes, 2 results"):
        task.eval_figures("val", [result, result])
    short = {k: v[:5] if k != "transcripts" else v for k, v in result.items()}
    with pytest.raises(ValueError, match="5 episodes for 8"):
        task.eval_figures("val", [short])


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("num_actors", [0, 1])
def test_ray_workers_play_the_evaluation_episodes_and_the_learner_none(ray_session, tmp_path, num_actors):
    """A checkpoint evaluated the Ray way (2 rollout workers play the chunks: test's two on one each; the learner
    adds up the figures) = the in-process evaluation. Every val/test episode was reset (the environment logs its pid)
    in a worker's process (env.num_actors=0) or in a worker's environment actor (1), never in the learner's or the
    driver's."""
    from rayseq.distributed.actors.learner import evaluate_checkpoint
    from rayseq.distributed.driver import Trainer
    from rayseq.distributed.groups import ActorGroups

    log = tmp_path / "resets.txt"
    overrides = (f"env.name={ENVS}:Logged", f"env.kwargs.log={log}", "algo.name=reinforce", "train.batch_size=4",
                 "train.iters=1", "train.eval_every=0", "task.val_size=8", "task.test_size=100")
    run = tmp_path / "run"
    Trainer(episode_config(*overrides, run_dir=run)).run()
    cfg = episode_config(*overrides, "rollout.num_workers=2", "rollout.num_cpus_per_worker=0.5", "learner.num_cpus=1",
                         f"env.num_actors={num_actors}")
    task = make_task(cfg.task)
    groups = ActorGroups(cfg)
    try:
        groups.learner.restore(str(run))
        learner_pids = set(ray_session.get([a.pid.remote() for a in groups.learner.actors]))
        log.write_text("")
        out, pids, workers = {}, set(), []
        for split in ("val", "test"):
            decodes = task.eval_decodes(split)
            refs, infos = groups.rollout.decode_held_out(
                decodes, *groups.learner.eval_weights_handle(groups.learner.version()))
            pids |= {i["pid"] for i in infos}
            workers += [i["worker"] for i in infos]
            out[split] = groups.learner.evaluate(split, refs)
            assert groups.evaluate(split, decodes) == out[split]  # the driver's path
        played = [tuple(map(int, line.split())) for line in Path(log).read_text().splitlines()]
    finally:
        groups.shutdown()
    assert set(workers) == {0, 1} and not pids & (learner_pids | {os.getpid()})
    played = [(p, s) for p, s in played if s != 0]  # a task's probe, reset(0), wherever one is made
    assert {s for _, s in played} == {int(s) for split in ("val", "test") for s in task.split_seeds(split)[0]}
    where = {p for p, _ in played}
    assert not where & (learner_pids | {os.getpid()})
    assert where <= pids if num_actors == 0 else not where & pids  # the workers' processes, or their actors'
    for split in ("val", "test"):
        assert out[split] == evaluate_checkpoint(str(run), split), split
