"""Checkpoints the learners write themselves: the learner's state goes from the learner straight to the run
directory (a local path or an object store: here S3 through a local S3 server, moto's), the driver writes the small
head; resume, the damaged-checkpoint fallback and the weights-only reads work on both, and nothing of the learner's
state passes through the driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rayseq.checkpoint import CheckpointError, list_checkpoints, load_checkpoint
from rayseq.distributed.driver import Trainer
from rayseq.storage import RunStore, _s3_endpoint
from tests.cli.test_damaged_checkpoint import flip_a_byte
from tests.conftest import TINY, tiny_config
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_a_damaged_learner_file_falls_back_to_the_previous_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"
    cfg = tiny_config("rollout.num_workers=0", "train.iters=2", "train.checkpoint_every=11", run_dir=run_dir)
    Trainer(cfg).run()
    good, newest = list_checkpoints(run_dir)
    flip_a_byte(run_dir / "checkpoints" / "ckpt_00000022.learner/state.pt")
    # the weights alone (serving, export) do not read the learner's training state: still the newest
    assert load_checkpoint(run_dir, training_state=False)["driver"]["iteration"] == 22
    # what resumes a run reads every file, each checked against its recorded SHA-256
    ck = load_checkpoint(run_dir)
    assert ck["driver"]["iteration"] == 11
    assert "ckpt_00000022.learner/state.pt is damaged" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="ckpt_00000022.learner/state.pt is damaged"):
        load_checkpoint(newest)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A local S3 server (moto's server mode) and a bucket on it; the AWS variables that point boto and pyarrow
    at it (``AWS_ENDPOINT_URL``), as a user of MinIO or another S3-compatible store sets them."""
    pytest.importorskip("moto", reason="the dev extra: pip install -e .[dev]")
    import pyarrow.fs as pafs

    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)], stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        for _ in range(100):  # until it answers
            try:
                pafs.S3FileSystem(allow_bucket_creation=True, **_s3_endpoint()).create_dir("runs")
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise RuntimeError(f"the local S3 server did not start: {log.read_text()[-2000:]}")
        yield env
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_a_run_on_s3_writes_resumes_and_falls_back_past_a_damaged_checkpoint(s3, tmp_path, capsys):
    uri = "s3://runs/counting-a"
    cfg = tiny_config("rollout.num_workers=0", "train.iters=2", "train.checkpoint_every=11",
                      "train.keep_checkpoints=3", run_dir=uri)
    summary = Trainer(cfg).run()
    assert summary["checkpoint"] == f"{uri}/checkpoints/ckpt_00000022.pt"
    store = RunStore(uri)
    assert store.is_object_store
    assert store.listdir("checkpoints") == sorted(
        f"ckpt_000000{i}.{ext}" for i in (11, 22) for ext in ("learner", "pt", "sha256"))
    assert store.listdir("checkpoints/ckpt_00000022.learner") == ["generator.pt", "state.pt"]
    assert not [n for n in store.listdir("checkpoints") if "tmp" in n]  # written in place: no temporary names
    assert {"config.yaml", "metrics.parquet", "summary.json"} <= set(store.listdir())
    # a longer run resumes from its checkpoint on S3
    longer = tiny_config("rollout.num_workers=0", "train.iters=4", "train.checkpoint_every=11",
                         "train.keep_checkpoints=3", run_dir=uri)
    resumed = Trainer(longer, resume=True).run()
    assert resumed["iterations"] == 24
    # its newest checkpoint damaged in the store (bit rot): a resume takes the one before, naming the damaged file
    name = "checkpoints/ckpt_00000024.learner/state.pt"
    data = bytearray(store.read_bytes(name))
    data[len(data) // 2] ^= 0xFF
    store.write_bytes(name, bytes(data))
    ck = load_checkpoint(uri)
    assert ck["driver"]["iteration"] == 22 and "ckpt_00000024.learner/state.pt is damaged" in capsys.readouterr().err
    again = tiny_config("rollout.num_workers=0", "train.iters=5", "train.checkpoint_every=11",
                        "train.keep_checkpoints=3", run_dir=uri)
    assert Trainer(again, resume=True).run()["iterations"] == 25
    assert "ckpt_00000024.pt.damaged" in store.listdir("checkpoints")  # set aside (the head), not chosen again


def test_a_sharded_learners_checkpoint_on_s3_is_read_in_place(s3):
    """A sharded learner (``learner.strategy=fsdp``, one rank in this process) writes its shards to S3; a fresh
    learner restores them straight from the store (ranged reads of the shard file, no local copy) to the same
    weights."""
    from rayseq.distributed.actors.learner import Learner
    from tests.distributed.test_strategies import assert_equal

    uri = "s3://runs/sharded"
    cfg = tiny_config("rollout.num_workers=0", "learner.strategy=fsdp", "train.pretrain_iters=2", "train.iters=1",
                      "train.checkpoint_every=3", "train.eval_every=0", run_dir=uri)
    path = Trainer(cfg).run()["checkpoint"]
    dcp = RunStore(f"{uri}/checkpoints/ckpt_00000003.learner/dcp")
    assert dcp.listdir() == [".metadata", "__0_0.distcp"]
    fresh = Learner(cfg)
    reads = fresh.restore(path)
    assert {f for f, _, _ in reads} == {"__0_0.distcp"}
    assert sum(n for _, _, n in reads) == dcp.fs.get_file_info(dcp.path("__0_0.distcp")).size  # one rank: all of it
    saved = load_checkpoint(path)["learner"]
    assert_equal(saved["generator"], fresh.whole_state()["generator"], "generator")


@pytest.mark.ray
def test_the_cli_on_ray_writes_its_checkpoints_to_s3(s3, tmp_path):
    """The CLI on its own embedded Ray: the learner actor writes the learner's files to S3 itself."""
    uri = "s3://runs/counting-ray"
    r = subprocess.run([sys.executable, "-m", "rayseq.train", *TINY, "rollout.num_workers=1", "learner.num_cpus=0.5",
                        "rollout.num_cpus_per_worker=0.5", "train.checkpoint_every=5", "progress=false",
                        f"run_dir={uri}"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, **s3})
    assert r.returncode == 0, r.stderr[-3000:]
    store = RunStore(uri)
    summary = json.loads(store.read_text("summary.json"))
    assert summary["checkpoint"].startswith(f"{uri}/checkpoints/")
    ck = load_checkpoint(summary["checkpoint"])
    assert ck["driver"]["iteration"] == summary["iterations"] and "gen_opt" in ck["learner"]


@pytest.mark.ray
def test_a_checkpoint_sends_the_driver_names_and_digests_only(ray_session, tmp_path):
    """Learner and workers as Ray actors: what the driver fetches while a checkpoint is written is the learner's
    file names and digests (a few hundred bytes), not its state."""
    fetched = {}

    def report(row, trainer):
        if row["iteration"] == 22:
            before = trainer.groups.recv_bytes
            trainer.save()
            fetched["bytes"] = trainer.groups.recv_bytes - before

    cfg = tiny_config("rollout.num_workers=1", "learner.num_cpus=0.5", "rollout.num_cpus_per_worker=0.5",
                      "train.iters=2", run_dir=tmp_path / "run")
    Trainer(cfg, report=report).run()
    state_bytes = (tmp_path / "run" / "checkpoints" / "ckpt_00000022.learner/state.pt").stat().st_size
    assert state_bytes > 50_000 and 0 < fetched["bytes"] < 2_000, (state_bytes, fetched)
