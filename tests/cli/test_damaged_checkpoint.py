"""A damaged newest checkpoint does not strand a run: its SHA-256 (recorded when it was written) is checked before it
is unpickled, and `--resume`, `rayseq.serve --checkpoint RUN` and a Tune trial's restore fall back to the previous
good one with a warning naming the file; when none loads, one line names every file tried."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rayseq import checkpoint as ckpt
from rayseq.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, load_latest, save_checkpoint
from rayseq.distributed.driver import Trainer
from rayseq.train import main
from tests.conftest import tiny_config


def damage(path: str | Path, keep: int = 2000) -> None:
    """What a truncated copy between machines leaves: the file's first ``keep`` bytes."""
    path = Path(path)
    path.write_bytes(path.read_bytes()[:keep])


def flip_a_byte(path: str | Path) -> None:
    """Bit rot in the tensor data: the zip archive still reads, the values are wrong."""
    path = Path(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_checkpoint_records_its_sha256_and_damage_is_refused_before_unpickling(tmp_path, capsys):
    for it in (1, 2):
        save_checkpoint(tmp_path, it, {"config": {"seed": it}, "x": __import__("torch").arange(4000) * it}, keep=3)
    first, second = list_checkpoints(tmp_path)
    record = Path(second).with_suffix(".sha256").read_text()
    assert record == f"{hashlib.sha256(Path(second).read_bytes()).hexdigest()}  ckpt_00000002.pt\n"  # sha256sum -c
    flip_a_byte(second)
    with pytest.raises(CheckpointError, match=r"ckpt_00000002.pt is damaged: its SHA-256 differs"):
        load_checkpoint(second)  # the file asked for: no fallback
    path, ck = load_latest(tmp_path)  # the run: the previous one, with a warning naming the damaged file
    assert path == first and ck["config"] == {"seed": 1}
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "ckpt_00000002.pt is damaged" in err and "ckpt_00000001.pt" in err
    assert ckpt.latest_good_checkpoint(tmp_path) == first
    damage(first)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path)
    msg = str(info.value)
    assert msg.startswith(f"no checkpoint of {tmp_path} loads; tried: ") and len(msg.splitlines()) == 1
    assert "ckpt_00000002.pt is damaged" in msg and "ckpt_00000001.pt is damaged" in msg


def test_a_checkpoint_without_a_record_is_still_loaded_and_its_damage_named(tmp_path):
    """Checkpoints written before records existed load as before; a damaged one is torch's error, in one line."""
    for it in (1, 2):
        save_checkpoint(tmp_path, it, {"config": {"seed": it}}, keep=3)
    for p in tmp_path.glob("checkpoints/*.sha256"):
        p.unlink()
    damage(list_checkpoints(tmp_path)[-1], keep=100)
    path, ck = load_latest(tmp_path)
    assert ck["config"] == {"seed": 1}
    with pytest.raises(CheckpointError, match=r"ckpt_00000002.pt does not load: "):
        load_checkpoint(list_checkpoints(tmp_path)[-1])


def test_resume_falls_back_past_a_damaged_checkpoint_without_duplicating_iterations(tmp_path, capsys):
    run_dir = tmp_path / "a"
    Trainer(tiny_config("rollout.num_workers=0", "train.checkpoint_every=2", run_dir=run_dir)).run()
    *_, good, newest = list_checkpoints(run_dir)
    assert (good[-11:-3], newest[-11:-3]) == ("00000024", "00000026")
    damage(newest)  # head -c 2000 ckpt_N.pt > x && cp x ckpt_N.pt
    assert main([f"run_dir={run_dir}", "--resume", "train.iters=8"]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "ckpt_00000026.pt is damaged" in warnings[0] and "ckpt_00000024.pt" in warnings[0]
    assert "resuming" in err and "after iteration 24" in err
    iterations = pq.read_table(run_dir / "metrics.parquet").column("iteration").to_pylist()
    assert iterations == list(range(1, 29))  # 25 and 26 once each: the rows past the good checkpoint were redone
    assert [c[-11:-3] for c in list_checkpoints(run_dir)] == ["00000026", "00000028"]
    assert (run_dir / "checkpoints" / "ckpt_00000026.pt.damaged").read_bytes()[:4] == b"PK\x03\x04"  # kept aside
    load_checkpoint(run_dir / "checkpoints" / "ckpt_00000026.pt")  # the rewritten one loads


def test_resume_and_serve_say_in_one_line_which_files_were_tried_when_none_loads(tmp_path, capsys):
    from rayseq.serve import main as serve_main

    run_dir = tmp_path / "b"
    Trainer(tiny_config("rollout.num_workers=0", "train.iters=2", "train.checkpoint_every=11",
                        run_dir=run_dir)).run()
    files = list_checkpoints(run_dir)
    assert len(files) == 2
    for f in files:
        damage(f)
    assert main([f"run_dir={run_dir}", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: --resume: no checkpoint of {run_dir} loads; tried")
    assert all(Path(f).name in err for f in files)
    assert serve_main(["--checkpoint", str(run_dir)]) == 2  # before Ray starts
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: no checkpoint of {run_dir} loads; tried")


def test_serving_a_run_uses_its_newest_good_checkpoint(tmp_path, capsys):
    from rayseq.serving.model import ChatModel

    run_dir = tmp_path / "c"
    Trainer(tiny_config("rollout.num_workers=0", "train.iters=2", "train.checkpoint_every=11",
                        run_dir=run_dir)).run()
    good, newest = list_checkpoints(run_dir)
    flip_a_byte(newest)
    model = ChatModel(run_dir)
    assert model.checkpoint == good
    assert "ckpt_00000022.pt is damaged" in capsys.readouterr().err


def test_a_tune_trial_restores_from_its_previous_good_checkpoint(tmp_path, capsys):
    from ray import tune

    from rayseq.checkpoint import checkpoint_files
    from rayseq.storage import RunStore
    from rayseq.tuning.trainable import install_checkpoint

    run = tmp_path / "run"
    for it in (5, 10):
        save_checkpoint(run, it, {"config": {"seed": it}}, keep=3)
    trial = tmp_path / "trial"
    store = RunStore(run / "checkpoints")
    for i, loc in enumerate(list_checkpoints(run)):  # the files TuneReporter.report hands to Tune
        folder = trial / f"checkpoint_{i:06d}"
        folder.mkdir(parents=True)
        files = checkpoint_files(store, Path(loc).name)
        assert len(files) == 2  # the .pt and its .sha256 (no learner files: a head written with its state inline)
        for file in files:
            (folder / file).write_bytes(store.read_bytes(file))
    flip_a_byte(trial / "checkpoint_000001" / "ckpt_00000010.pt")
    dest = RunStore(tmp_path / "restored")
    assert install_checkpoint(tune.Checkpoint(str(trial / "checkpoint_000001")), dest) == 5
    assert "checkpoint_000001" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "restored")["config"] == {"seed": 5}
    flip_a_byte(trial / "checkpoint_000000" / "ckpt_00000005.pt")
    with pytest.raises(CheckpointError, match=r"^no Tune checkpoint of this trial loads; tried: .*checkpoint_000001"
                                                r".*checkpoint_000000"):
        install_checkpoint(tune.Checkpoint(str(trial / "checkpoint_000001")), dest)
