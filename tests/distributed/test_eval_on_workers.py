"""Evaluation on the rollout side: the held-out decodes sharded over the Ray rollout workers, the figures (and what
needs the policy's likelihood) on the learner; the metrics equal the in-process evaluation of the same checkpoint,
and a worker lost while evaluating leaves its decodes to the others."""

from __future__ import annotations

import os
import signal

import pytest

from rayseq.distributed.actors.learner import evaluate_checkpoint
from rayseq.distributed.driver import Trainer
from rayseq.distributed.groups import ActorGroups
from rayseq.tasks import make_task
from tests.conftest import tiny_config

pytestmark = pytest.mark.ray

COUNTING = ("algo.name=reinforce", "train.pretrain_iters=10", "train.iters=1", "train.eval_every=0",
            "task.val_size=1500")  # val: two chunks of 1024 inputs (greedy and sampled), test: one
PAIRS = ("task.name=pairs", "task.val_size=10", "task.test_size=100", "algo.name=reinforce", "train.pretrain_iters=10",
         "train.iters=1", "train.eval_every=0")


def trained(tmp_path, name: str, *overrides: str) -> str:
    """A short in-process run's directory (its final checkpoint is the one both evaluations read)."""
    run = tmp_path / name
    Trainer(tiny_config("rollout.num_workers=0", *overrides, run_dir=run)).run()
    return str(run)


def evaluated_on_workers(run: str, *overrides: str, kill: int | None = None,
                         published: str | None = None) -> tuple[dict, list]:
    """val and test of the checkpoint in ``run`` evaluated the Ray way (2 rollout workers decode, the learner scores);
    ``kill``: that worker is killed (kill -9) first; ``published``: the checkpoint of that run (the same version) is
    loaded and published to the workers first. Returns ({split: (metrics, details)}, each decode's worker)."""
    cfg = tiny_config("rollout.num_workers=2", "rollout.num_cpus_per_worker=0.5", "learner.num_cpus=1", *overrides)
    task = make_task(cfg.task, cfg.reward)
    groups = ActorGroups(cfg)
    try:
        if published is not None:
            groups.learner.restore(published)
            groups.rollout.sync_weights()
            assert {s["version"] for s in groups.rollout.stats()} == {groups.learner.version()}
        groups.learner.restore(run)
        if kill is not None:
            os.kill(groups.rollout.stats()[kill]["pid"], signal.SIGKILL)
        out, workers = {}, []
        for split in ("val", "test"):
            refs, infos = groups.rollout.decode_held_out(
                task.eval_decodes(split), *groups.learner.eval_weights_handle(groups.learner.version()))
            workers += [i["worker"] for i in infos]
            assert all(i["pid"] != os.getpid() for i in infos)
            out[split] = groups.learner.evaluate(split, refs)
            assert groups.evaluate(split, task.eval_decodes(split)) == out[split]  # the driver's path
        return out, workers
    finally:
        groups.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("task", ["counting", "pairs"])
def test_two_workers_evaluate_a_checkpoint_as_the_in_process_evaluation(ray_session, tmp_path, corpus, task):
    """counting: greedy precision, sampled precision (two chunks on val), first-digit distribution (the policy's
    likelihood, on the learner); pairs: BLEU-2 and the rest of greedy replies, the reward of sampled ones, the
    test details: every figure bit-identical to evaluating the same checkpoint in one process."""
    overrides = COUNTING if task == "counting" else (*PAIRS, f"task.data={corpus}")
    run = trained(tmp_path, task, *overrides)
    remote, workers = evaluated_on_workers(run, *overrides)
    assert set(workers) == {0, 1}  # sharded: each worker decoded its share
    for split in ("val", "test"):
        local = evaluate_checkpoint(run, split)
        assert remote[split][0] == local[0], split
        assert remote[split][1] == local[1], split


@pytest.mark.slow
def test_a_worker_killed_before_its_decodes_leaves_them_to_the_other(ray_session, tmp_path):
    """Worker 1 killed with no restart left (rollout.max_restarts=0, as a worker whose node is lost): after
    rollout.worker_grace_s its decodes go to worker 0, and the metrics are the same."""
    run = trained(tmp_path, "k", *COUNTING)
    remote, workers = evaluated_on_workers(run, *COUNTING, "rollout.max_restarts=0", "rollout.worker_grace_s=1",
                                           kill=1)
    assert set(workers) == {0}
    for split in ("val", "test"):
        assert remote[split][0] == evaluate_checkpoint(run, split)[0]


@pytest.mark.slow
def test_weights_changed_without_a_new_version_are_the_ones_evaluated(ray_session, tmp_path):
    """The workers hold another run's weights under the same version (as after ERPO interpolation's validation
    undid an interval's updates, or a checkpoint was loaded): the evaluation decodes with the learner's weights now,
    not those the version was published with."""
    run, other = (trained(tmp_path, name, *COUNTING, f"seed={seed}") for name, seed in (("a", 3), ("b", 4)))
    remote, _ = evaluated_on_workers(run, *COUNTING, published=other)
    for split in ("val", "test"):
        assert remote[split][0] == evaluate_checkpoint(run, split)[0]
    assert evaluate_checkpoint(run, "val")[0] != evaluate_checkpoint(other, "val")[0]
