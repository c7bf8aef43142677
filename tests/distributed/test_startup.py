"""A start-up that fails ends the run at once with one line: an actor whose constructor raises (a rollout worker, a
scorer, a learner; at the start, or when Ray re-creates it after a crash), a missing extra on a worker, a dataset a
node cannot read, a placement the cluster can never meet. Each names the actor, its node, the error and the key to
change where one is known, and arrives within seconds of the actors starting (not after a wait for Ray to re-create an
actor that raises in its constructor, nor with a message that blames a lost node)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rayseq.config import blame
from rayseq.distributed.actors.learner import Learner
from rayseq.distributed.actors.scorer import ScorerActor
from rayseq.distributed.actors.worker import RolloutWorker
from rayseq.distributed.driver import Trainer
from rayseq.distributed.groups.placement import bundle_keys, unmet
from rayseq.distributed.groups.startup import StartupFailed
from tests.conftest import tiny_config
from tests.tasks.test_chitchat import tiny as chitchat_config

ROOT = Path(__file__).resolve().parents[2]
NODE = r"node [0-9a-f]{56} \(\d+\.\d+\.\d+\.\d+\)"  # Placement.describe: the id and the address
CANNOT = "Available memory on node 0 (7.79/10.71 GiB) on startup is less than desired CPU memory utilization (0.92)"


# constructors that raise as vLLM's did when a second engine could not reserve its memory (imported by reference in
# the actors: Ray re-creates the class from this module)
class WorkerThatCannotStart(RolloutWorker):
    def __init__(self, cfg, index=0):
        if index == 1:
            raise blame("rollout.engine_kwargs", ValueError(CANNOT))
        super().__init__(cfg, index)


class ScorerThatCannotStart(ScorerActor):
    def __init__(self, cfg, index=0):
        raise blame("rollout.engine_kwargs", ValueError(CANNOT))


class LearnerThatCannotStart(Learner):
    def __init__(self, cfg, rank: int = 0):
        raise ValueError(CANNOT)


def test_unmet_placements_say_why():
    node = {"CPU": 4.0, "memory": 1e9}
    assert unmet([{"CPU": 1.0}] * 3, "PACK", [node]) is None
    assert unmet([{"CPU": 1.0}, {"CPU": 8.0}], "PACK", [node]) == (
        "no node can hold the bundle {CPU: 8} (the nodes have {CPU: 4})", 1, {"CPU": 8.0})
    assert unmet([{"CPU": 3.0}] * 2, "PACK", [node, node]) is None
    assert unmet([{"CPU": 3.0}] * 3, "SPREAD", [node, node]) == (
        "the bundles want {CPU: 9} in all, the cluster has {CPU: 8}", None, None)
    assert unmet([{"CPU": 1.0, "GPU": 1.0}], "PACK", [node]) == (
        "no node can hold the bundle {CPU: 1, GPU: 1} (the nodes have {CPU: 4, GPU: 0})", 0, {"GPU": 1.0})
    assert unmet([{"CPU": 3.0}] * 2, "STRICT_PACK", [node, node]).why.startswith(
        "STRICT_PACK puts {CPU: 6} on one node")
    assert unmet([{"CPU": 1.0}] * 3, "STRICT_SPREAD", [node, node]).why.startswith(
        "STRICT_SPREAD puts each of the 3")
    # the keys that size what no node has: bundle 0 the learner's, 1..n the workers', then the scorers'
    cfg = tiny_config("rollout.num_workers=2")
    assert bundle_keys(cfg, 0, {"big_node": 1.0}) == "learner.resources"
    assert bundle_keys(cfg, 2, {"CPU": 1.0, "GPU": 1.0}) == ("rollout.num_cpus_per_worker / "
                                                             "rollout.num_gpus_per_worker")


def test_blame_keeps_the_innermost_key():
    exc = blame("model.path", FileNotFoundError("x"))
    assert blame("task.data", exc) is exc and exc.config_key == "model.path"
    import pickle

    assert pickle.loads(pickle.dumps(exc)).config_key == "model.path"  # as an actor's exception crosses


@pytest.mark.ray
@pytest.mark.parametrize(("kind", "patch", "cls", "line"), [
    ("worker", "rayseq.distributed.groups.actor_groups.RolloutWorker", WorkerThatCannotStart,
     rf"rollout worker 1 on {NODE} could not start: ValueError: Available memory on node 0 .* \(the key to change: "
     r"rollout.engine_kwargs\)$"),
    ("scorer", "rayseq.distributed.groups.actor_groups.ScorerActor", ScorerThatCannotStart,
     rf"scorer 0 on {NODE} could not start: ValueError: Available memory"),
    ("learner", "rayseq.distributed.groups.learner.Learner", LearnerThatCannotStart,
     rf"learner rank 0 on {NODE} could not start: ValueError: Available memory on node 0 \(7.79/10.71 GiB\) on "
     r"startup is less than desired CPU memory utilization \(0.92\)$"),
], ids=["worker", "scorer", "learner"])
def test_an_actor_whose_constructor_raises_ends_the_run_at_once(ray_session, corpus, tmp_path, monkeypatch, kind,
                                                                 patch, cls, line):
    """The run stops as the constructor raises, with one line: not a wait for a re-creation that would raise the same
    way (nor a message that blames a lost node), not the other worker taking the shards of one that never started,
    not a learner rebuilt to fail again."""
    monkeypatch.setattr(patch, cls)
    cfg = chitchat_config(corpus, "rollout.num_workers=2", "scorer.num_scorers=1", "rollout.num_cpus_per_worker=0.5",
                          "scorer.num_cpus_per_scorer=0.5", "learner.num_cpus=0.5", f"run_dir={tmp_path / 'run'}")
    assert cfg.num_scorers == 1
    t0 = time.monotonic()
    with pytest.raises(StartupFailed, match=line) as info:
        Trainer(cfg).run()
    assert time.monotonic() - t0 < 60  # the actors' processes start (seconds each), then it ends
    assert "\n" not in str(info.value)
    assert isinstance(info.value.cause, ValueError)
    assert info.value.config_key == (None if kind == "learner" else "rollout.engine_kwargs")
    assert released(ray_session)  # its actors and placement group are gone


def released(ray, timeout: float = 20.0) -> bool:
    """Whether the 4 CPUs of the test session's Ray are all free again within ``timeout`` seconds (a removed
    placement group's resources come back a moment later)."""
    deadline = time.monotonic() + timeout
    while ray.available_resources().get("CPU") != 4:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def copy_of(hf_dir, tmp_path) -> Path:
    return Path(shutil.copytree(hf_dir, tmp_path / "model"))


@pytest.mark.ray
def test_a_worker_without_the_vllm_extra_says_so(ray_session, corpus, hf_dir, tmp_path):
    """rollout.engine=vllm where vLLM is not installed (the extra missing on the workers' nodes): the workers' one
    line says how to install it (the driver needs no vLLM: only the workers sample with it)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed here")
    from tests.hf.test_hf_training import hf_config

    cfg = hf_config(corpus, hf_dir, "rollout.num_workers=1", "rollout.engine=vllm", "algo.name=grpo",
                    "rollout.num_cpus_per_worker=0.5", "learner.num_cpus=0.5", run_dir=tmp_path / "run")
    with pytest.raises(StartupFailed, match=rf"^rollout worker 0 on {NODE} could not start: ImportError: "
                                            r"rollout.engine=vllm needs vLLM: pip install .*\(the key to change: "
                                            r"rollout.engine\)$"):
        Trainer(cfg).run()


@pytest.mark.ray
def test_a_dataset_a_node_cannot_read_is_named(ray_session, corpus, tmp_path):
    """task.data prepared for the driver (its task is built) but not readable where the actors run: the first actor
    to fail names task.data, at once."""
    data = Path(shutil.copytree(corpus, tmp_path / "data"))
    cfg = chitchat_config(data, "rollout.num_workers=1", "scorer.num_scorers=1", "rollout.num_cpus_per_worker=0.5",
                          "scorer.num_cpus_per_scorer=0.5", "learner.num_cpus=0.5", f"run_dir={tmp_path / 'run'}")
    trainer = Trainer(cfg)
    assert trainer.task is not None  # the driver read it
    (data / "manifest.json").unlink()
    with pytest.raises(StartupFailed, match=rf"^(learner rank 0|rollout worker 0|scorer 0) on {NODE} could not "
                                            rf"start: FileNotFoundError: task.data={data}: no prepared dataset there; "
                                            r".*\(the key to change: task.data\)$"):
        trainer.run()


@pytest.mark.ray
def test_a_worker_recreated_after_a_crash_whose_constructor_raises_ends_the_run(ray_session, corpus, hf_dir,
                                                                                 tmp_path):
    """A worker killed mid-run is re-created by Ray; its model directory is gone from the node by then, so its
    creation fails (the config it is sent checks model.path where it is loaded): the run ends at once naming it and
    model.path (the other worker does not take its shards for the rest of the run, and nothing waits for a worker
    that cannot come back)."""
    from tests.hf.test_hf_training import hf_config

    model = copy_of(hf_dir, tmp_path)
    killed: list = []

    def report(row, trainer):
        if row["stage"] == "train" and not killed:
            shutil.rmtree(model)
            pid = trainer.groups.rollout.stats()[1]["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append(time.monotonic())

    cfg = hf_config(corpus, model, "rollout.num_workers=2", "algo.name=grpo", "train.iters=6",
                    "rollout.num_cpus_per_worker=0.5", "learner.num_cpus=0.5", run_dir=tmp_path / "run")
    with pytest.raises(StartupFailed, match=rf"^rollout worker 1 on {NODE} was re-created after a failure and could "
                                            rf"not start: ConfigError: invalid config: model.path={model}: no such "
                                            r"directory \(the key to change: model.path\)$"):
        Trainer(cfg, report=report).run()
    assert killed and time.monotonic() - killed[0] < 60


@pytest.mark.ray
def test_a_learner_rebuilt_after_a_crash_whose_constructor_raises_ends_the_run(ray_session, corpus, hf_dir, tmp_path):
    """A learner killed mid-run is rebuilt by the driver (learner.max_restarts); its model directory is gone from the
    node by then, so the new learner cannot start: the run ends at once naming it and model.path, not a rebuild
    after rebuild that fails the same way."""
    from tests.hf.test_hf_training import hf_config

    model = copy_of(hf_dir, tmp_path)
    killed: list = []

    def report(row, trainer):
        if row["stage"] == "train" and not killed:
            shutil.rmtree(model)
            pid = ray_session.get(trainer.groups.learner.actors[0].placement.remote())["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append(time.monotonic())

    cfg = hf_config(corpus, model, "rollout.num_workers=1", "algo.name=grpo", "train.iters=6",
                    "rollout.num_cpus_per_worker=0.5", "learner.num_cpus=0.5", run_dir=tmp_path / "run")
    assert cfg.learner.max_restarts > 0
    with pytest.raises(StartupFailed, match=rf"^learner rank 0 on {NODE} was re-created after a failure and could "
                                            rf"not start: ConfigError: invalid config: model.path={model}: no such "
                                            r"directory \(the key to change: model.path\)$"):
        Trainer(cfg, report=report).run()
    assert killed and time.monotonic() - killed[0] < 60
    assert released(ray_session)  # the rebuilt learner, the worker and the placement group are gone


@pytest.mark.ray  # starts its own Ray, in a subprocess
def test_a_placement_no_node_can_meet_ends_the_cli_in_seconds(tmp_path):
    """On the Ray the run starts itself (nothing can add a node to it), a learner that asks for a resource no node
    has ends the run within seconds of Ray's start with one line saying why and what to lower (no wait, no traceback),
    exit code 2, the progress lines saying which step was starting."""
    env = {**os.environ, "RAY_ADDRESS": "", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "rayseq.train", "model.emb_dim=16", "model.hidden_dim=32", "train.pretrain_iters=2",
         "train.iters=2", "rollout.num_workers=1", "learner.resources.big_node=1", f"run_dir={tmp_path / 'run'}",
         "progress=lines"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr  # it names the key to change
    assert lines[-1] == ("error: the cluster cannot reserve the run's bundles [{'CPU': 1.0, 'big_node': 1.0}, "
                         "{'CPU': 0.5}]: no node can hold the bundle {CPU: 1, big_node: 1} (the nodes have {CPU: "
                         f"{os.cpu_count()}, big_node: 0}}) (the key to change: learner.resources)")
    assert "start-up: reserving 2 bundles (PACK) for the run's actors" in lines[-2]
    assert "Traceback" not in proc.stderr
    assert took < 90, took  # Ray's start (seconds to tens), then a second
