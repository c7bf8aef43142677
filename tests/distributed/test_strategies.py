"""The learner's strategies (rayseq.distributed.actors.strategies), in this process: chosen once from
``learner.strategy``; which ranks read the model; FSDP over one rank (nothing to shard) computes as a replicated
learner and writes the sharded checkpoint format; a checkpoint reads back in the format it was written in, into a
learner of either strategy; ``train.init_from`` carries the generator and the value baseline from either format.
Two ranks of each strategy: tests/distributed/test_learner_group.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayseq.checkpoint import FORMAT, checkpoint_stem, load_checkpoint, save_checkpoint
from rayseq.config import config_to_dict
from rayseq.distributed.actors.learner import Learner
from rayseq.distributed.actors.strategies import FSDP, Replicated, ShardedFiles, WholeFiles, files_of
from rayseq.distributed.actors.worker import RolloutWorker
from rayseq.types import RolloutRequest
from tests.conftest import tiny_config

PPO = ("algo.name=ppo", "algo.minibatch_size=8", "algo.kl_coef=0.1", "train.batch_size=16")


def _learner(*overrides) -> Learner:
    return Learner(tiny_config(*overrides))


def _trained(learner: Learner) -> dict:
    """Two MLE updates, the train stage (π_ref taken), one PPO update on a rollout of the learner's own weights;
    the PPO update's metrics."""
    rng = np.random.default_rng(0)
    for i in range(2):
        learner.update(learner.task.sample_prompts(rng, 16, with_targets=True), i)
    learner.start_stage("train")
    worker = RolloutWorker(learner.cfg)
    worker.set_weights(learner.get_weights(), learner.version)
    rollout = worker.sample(learner.task.sample_prompts(rng, 16), RolloutRequest(max_len=6, seed=1))
    return learner.update(rollout, 0)


def _checkpoint(learner: Learner, run_dir) -> str:
    """The learner's state written as a run's checkpoint (its files, then a head as the driver writes it)."""
    written = learner.save(str(run_dir), checkpoint_stem(1))
    head = {"format": FORMAT, "config": config_to_dict(learner.cfg), "task": learner.task.spec(),
            "learner": {"generator": written["generator"], "state": written["state"]},
            "driver": {"iteration": 1, "stage": learner.stage, "stage_iter": 0}}
    return save_checkpoint(str(run_dir), 1, head, files=written["files"])


def assert_equal(a, b, where: str = "") -> None:
    """The same nested state, tensor for tensor (exactly)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def test_the_strategy_is_chosen_once_from_learner_strategy_and_names_the_ranks_that_read():
    replicated, sharded = _learner(*PPO), _learner(*PPO, "learner.strategy=fsdp")
    assert type(replicated.strategy) is Replicated and isinstance(replicated.strategy.files, WholeFiles)
    assert type(sharded.strategy) is FSDP and isinstance(sharded.strategy.files, ShardedFiles)
    ranks = ["rank0", "rank1", "rank2"]
    assert Replicated.reading_ranks(ranks) == ["rank0"]  # the ranks hold the same: rank 0 answers
    assert FSDP.reading_ranks(ranks) == ranks  # reading sharded modules is a collective
    assert files_of({"dcp": "x"}).__class__ is ShardedFiles and files_of({}).__class__ is WholeFiles


def test_fsdp_over_one_rank_learns_as_a_replicated_learner_and_writes_shards(tmp_path):
    """Nothing to shard over one rank: the same update bit for bit (π_ref a frozen copy), the same published weights;
    its checkpoint is DCP shards beside the whole generator, which a replicated learner restores (and the other way
    round) to the same state."""
    replicated, sharded = _learner(*PPO), _learner(*PPO, "learner.strategy=fsdp")
    m1, m2 = _trained(replicated), _trained(sharded)
    assert m1 == m2 and "kl/per_reply" in m1
    assert isinstance(sharded.algo.modules["ref_policy"], torch.nn.Module)
    assert_equal(replicated.get_weights(), sharded.get_weights(), "weights")
    assert_equal(replicated.whole_state(), sharded.whole_state(), "whole_state")
    assert set(replicated.whole_state()) == {"generator", "generator.optim", "baseline", "baseline.optim"}
    assert sharded.shard_sizes() == replicated.shard_sizes()
    held, whole = sharded.shard_sizes()["params"]
    assert held == whole > 0

    paths = {name: _checkpoint(learner, tmp_path / name) for name, learner in
             (("replicated", replicated), ("sharded", sharded))}
    dcp = tmp_path / "sharded" / "checkpoints" / "ckpt_00000001.learner" / "dcp"
    assert (dcp / ".metadata").is_file() and not (tmp_path / "replicated" / "checkpoints" / "ckpt_00000001.learner"
                                                  / "dcp").exists()
    for source, target in (("replicated", "fsdp"), ("sharded", "replicated")):
        fresh = _learner(*PPO, f"learner.strategy={target}")
        fresh.load_state_dict(load_checkpoint(paths[source])["learner"])
        assert_equal({k: v for k, v in replicated.state_dict().items() if k != "torch_rng"},
                     {k: v for k, v in fresh.state_dict().items() if k != "torch_rng"}, f"{source} -> {target}")
        assert fresh.stage == "train" and fresh.version == replicated.version


@pytest.mark.parametrize("strategy", ["replicated", "fsdp"])
def test_init_from_carries_the_generator_and_the_value_baseline_from_either_format(tmp_path, strategy):
    source = _learner(*PPO, f"learner.strategy={strategy}")
    _trained(source)
    assert float(source.algo.modules["baseline"].linear.weight.detach().abs().sum()) > 0  # the update trained it
    path = _checkpoint(source, tmp_path / "source")
    target = _learner(*PPO)
    assert target.init_from(path) == {"generator": True}
    assert_equal(source.state.generator.state_dict(), target.state.generator.state_dict(), "generator")
    assert_equal(source.algo.modules["baseline"].state_dict(), target.algo.modules["baseline"].state_dict(),
                 "baseline")
    assert target.stage == "mle" and target.version == 0  # the stage and the optimizers start fresh


GRPO = ("algo.name=grpo", "algo.group_size=4", "algo.minibatch_size=8", "algo.kl_coef=0.1", "train.batch_size=16")


@pytest.mark.parametrize("strategy", ["replicated", "fsdp"])
@pytest.mark.parametrize("source, target", [(GRPO, PPO), (PPO, GRPO)], ids=["grpo-to-ppo", "ppo-to-grpo"])
def test_init_from_between_runs_with_and_without_a_value_baseline(tmp_path, strategy, source, target):
    """GRPO holds no value baseline: PPO started from a GRPO run keeps its own (zero) one, GRPO started from a PPO run
    takes the generator alone; whole files and shards alike."""
    trained = _learner(*source, f"learner.strategy={strategy}")
    _trained(trained)
    path = _checkpoint(trained, tmp_path / "source")
    fresh, started = _learner(*target), _learner(*target)
    assert started.init_from(path) == {"generator": True}
    assert_equal(trained.state.generator.state_dict(), started.state.generator.state_dict(), "generator")
    assert ("baseline" in started.algo.modules) == (target == PPO)
    if target == PPO:
        assert_equal(fresh.algo.modules["baseline"].state_dict(), started.algo.modules["baseline"].state_dict(),
                     "baseline")


def _gather_on_two_ranks(rank: int, port: int, out_dir: str) -> None:
    import os

    import torch.distributed as dist

    from rayseq.distributed.actors.sharding import full_tensors, shard_modules

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
        shard_modules({"m": model}, 2, torch.device("cpu"), dtype=torch.float32)
        assert all(p.to_local().numel() < p.numel() for p in model.parameters())  # each rank holds a part
        got = dict(full_tensors(model.state_dict(), torch.bfloat16, keep=rank == 0))
        torch.save({"bf16": got, "fp32": dict(full_tensors(model.state_dict(), None, keep=rank == 0))},
                   f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_the_whole_weights_are_gathered_one_tensor_at_a_time_and_kept_by_the_answering_rank_only(tmp_path):
    """:func:`rayseq.distributed.actors.sharding.full_tensors` over two FSDP ranks (gloo): rank 0 gets every tensor
    whole, cast to the publishing dtype (each rank's shard cast before the gather: the same values as the whole model
    cast on the CPU), or as held without a dtype; rank 1 takes part in each gather and keeps nothing."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_gather_on_two_ranks, args=(port, str(tmp_path)), nprocs=2, start_method="spawn")
    torch.manual_seed(0)
    whole = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3)).state_dict()
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert rank1 == {"bf16": {}, "fp32": {}}
    assert list(rank0["bf16"]) == list(whole)
    for k, v in whole.items():
        assert rank0["bf16"][k].dtype == torch.bfloat16 and torch.equal(rank0["bf16"][k], v.to(torch.bfloat16)), k
        assert rank0["fp32"][k].dtype == torch.float32 and torch.equal(rank0["fp32"][k], v), k
