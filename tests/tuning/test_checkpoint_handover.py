"""A Tune trial's checkpoint handed to Tune and back (rayseq.tuning.trainable: :func:`stage_checkpoint` into the folder
``tune.Checkpoint.from_directory`` takes, :func:`install_checkpoint` from a restored ``tune.Checkpoint`` into the
trial's run directory) as streams: a sharded learner's shard is never whole in memory."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path

import pytest

from rayseq.checkpoint import CKPT_DIR, FORMAT, list_checkpoints, save_checkpoint, verify_checkpoint
from rayseq.storage import RunStore, copy_file
from rayseq.tuning.trainable import install_checkpoint, stage_checkpoint

SHARD = "ckpt_00000007.learner/dcp/__0_0.distcp"
MIB = 1 << 20


def write_shard(path: Path, size: int) -> str:
    """A file of ``size`` random bytes, written 1 MiB at a time; its SHA-256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with path.open("wb") as f:
        for _ in range(size // MIB):
            block = os.urandom(MIB)
            digest.update(block)
            f.write(block)
    return digest.hexdigest()


def peak_bytes(fn) -> int:
    """The Python heap's peak above its level before, while ``fn()`` runs (tracemalloc)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.fixture
def run(tmp_path):
    """A run directory with one checkpoint (iteration 7) whose learner file is a 48 MiB shard (SHA-256 recorded)."""
    store = RunStore(tmp_path / "run")
    digest = write_shard(tmp_path / "run" / CKPT_DIR / SHARD, 48 * MIB)
    head = {"format": FORMAT, "config": {}, "learner": {}, "driver": {"iteration": 7}}
    save_checkpoint(store, 7, head, files={SHARD: digest})
    return store


def test_reading_a_shard_whole_peaks_at_its_size_the_stream_at_a_chunk(run, tmp_path):
    """The measure can fail: the old hand-over (``read_bytes``) holds the 48 MiB shard; the stream holds one 16 MiB
    chunk at a time (two while the next is read: 32 MiB)."""
    assert peak_bytes(lambda: run.read_bytes(f"{CKPT_DIR}/{SHARD}")) >= 48 * MIB
    out = RunStore(tmp_path / "copy")
    assert peak_bytes(lambda: copy_file(run, f"{CKPT_DIR}/{SHARD}", out, "shard")) < 40 * MIB
    assert (tmp_path / "copy" / "shard").read_bytes() == (Path(run.root) / CKPT_DIR / SHARD).read_bytes()


def test_a_trials_checkpoint_goes_to_tune_and_back_without_a_shard_whole_in_memory(run, tmp_path):
    staged = tmp_path / "tune-checkpoint"
    path = list_checkpoints(run)[-1]
    assert peak_bytes(lambda: stage_checkpoint(path, 7, staged)) < 40 * MIB
    assert sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()) == sorted(
        [SHARD, "ckpt_00000007.pt", "ckpt_00000007.sha256", "rayseq.json"])
    verify_checkpoint(str(staged / "ckpt_00000007.pt"))  # the staged copy checks against the recorded SHA-256

    from ray import tune

    trial = RunStore(tmp_path / "trial")
    peak = peak_bytes(lambda: install_checkpoint(tune.Checkpoint.from_directory(str(staged)), trial))
    assert peak < 40 * MIB  # copied and verified as streams
    assert (Path(trial.root) / CKPT_DIR / SHARD).read_bytes() == (staged / SHARD).read_bytes()
