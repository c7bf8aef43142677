"""`--resume` never damages a run: the run's own config is the base, a change a checkpoint cannot take is
refused before a file is written, and a wrong run directory is an error at once (the real CLI)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from rayseq.checkpoint import list_checkpoints
from rayseq.config import ConfigError, config_to_dict, resume_config
from rayseq.distributed.driver import Trainer
from rayseq.train import main
from tests.conftest import TINY, signal_when_ready, tiny_config

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "rayseq.train", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def iteration_of(path: str) -> int:
    return int(path[-11:-3])


def interrupt_after_checkpoint(cmd: list[str], run_dir: Path, after: int, sig=signal.SIGINT, timeout_s: float = 240):
    """Start ``cmd``, wait for a checkpoint past iteration ``after``, send ``sig``; (returncode, stderr)."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = signal_when_ready(proc, sig, lambda: any(iteration_of(c) > after for c in list_checkpoints(run_dir)),
                               timeout_s, f"a checkpoint past {after}")
    return proc.returncode, err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A tiny in-process counting run with its final checkpoint (read-only for the tests that use it)."""
    run_dir = tmp_path_factory.mktemp("resume") / "run"
    Trainer(tiny_config("rollout.num_workers=0", run_dir=run_dir)).run()
    return run_dir


def snapshot(run_dir: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(run_dir)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.e2e
def test_ctrl_c_then_resume_without_config_continues_the_same_run(corpus, tmp_path):
    """The newcomer's sequence: a run started with `--config tune_configs/chitchat_quick.yaml`, Ctrl-C, then the
    command the interrupt message prints (no --config). That command used to overwrite config.yaml with the
    default counting config and crash on a size mismatch; now it continues the chit-chat run."""
    run_dir = tmp_path / "chat"
    start = [sys.executable, "-m", "rayseq.train", "--config", "tune_configs/chitchat_quick.yaml",
             f"task.data={corpus}", "task.tokenizer=words", "task.prepare=false", "task.test_size=100",
             "model.emb_dim=16", "model.hidden_dim=32", "train.pretrain_batch_size=16", "train.checkpoint_every=5",
             "rollout.num_workers=0", "progress=bar", f"run_dir={run_dir}"]
    rc, err = interrupt_after_checkpoint(start, run_dir, after=0)
    assert rc == 130, err[-3000:]
    assert "Traceback" not in err
    lines = err.splitlines()
    assert lines[0] == f"run dir: {run_dir}"  # where the run is, from the start
    # the last line, after the bar's final redraw, is the command that continues the run
    assert lines[-1] == f"python -m rayseq.train run_dir={run_dir} --resume", lines[-3:]
    assert lines[-2].startswith("interrupted after iteration ") and "stage mle" in lines[-2]
    saved = (run_dir / "config.yaml").read_text()
    assert yaml.safe_load(saved)["task"]["name"] == "chitchat"
    first_stop = iteration_of(list_checkpoints(run_dir)[-1])

    again = [sys.executable if a == "python" else a for a in shlex.split(lines[-1])]  # exactly what it said
    rc, err = interrupt_after_checkpoint(again, run_dir, after=first_stop, sig=signal.SIGTERM)
    assert rc == 130, err[-3000:]
    assert "Traceback" not in err and "size mismatch" not in err
    assert err.splitlines()[0].startswith(f"resuming {run_dir} after iteration {first_stop} (stage mle, ")
    assert err.splitlines()[-1] == lines[-1]
    assert (run_dir / "config.yaml").read_text() == saved  # the run's config, untouched
    second_stop = iteration_of(list_checkpoints(run_dir)[-1])
    assert second_stop > first_stop

    # the original command (--config and all) plus --resume works too; and what a resume may change: the length
    # (MLE is still running), the progress output
    r = cli(*start[3:], f"train.pretrain_iters={second_stop + 3}", "train.iters=2", "progress=lines", "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (f"changed: progress bar -> lines; train.pretrain_iters 3000 -> {second_stop + 3}; train.iters 150 -> 2"
            in r.stderr)
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    assert [row["iteration"] for row in rows] == list(range(1, second_stop + 3 + 2 + 1))  # none repeated or lost
    final = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert final["task"] == yaml.safe_load(saved)["task"] and final["train"]["iters"] == 2


@pytest.mark.parametrize("case", ["missing", "empty", "no checkpoint"])
def test_resume_without_a_checkpoint_fails_at_once_and_writes_nothing(tmp_path, case):
    run_dir = tmp_path / "run"
    if case != "missing":
        run_dir.mkdir()
    if case == "no checkpoint":  # stopped before its first checkpoint
        (run_dir / "config.yaml").write_text("seed: 3\n")
    before = snapshot(run_dir) if run_dir.exists() else None
    t0 = time.monotonic()
    r = cli(f"run_dir={run_dir}", "--resume", timeout=60)
    wall = time.monotonic() - t0
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: --resume: ") and str(run_dir) in r.stderr and len(r.stderr.splitlines()) == 1
    assert ("does not exist" if case == "missing" else "holds no checkpoint") in r.stderr
    assert wall < 3.0, wall  # no torch, no Ray: ~0.4 s of Python start-up (measured on the loaded 2-core machine)
    assert (snapshot(run_dir) if run_dir.exists() else None) == before


def test_resume_needs_a_run_dir(capsys):
    assert main(["--resume"]) == 2
    assert "--resume needs run_dir=DIR" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "named"),
    [(["model.hidden_dim=64"], "model.hidden_dim (32 -> 64)"),
     (["algo.name=ppo"], "algo.name ('ppo_dynamic' -> 'ppo')"),
     (["seed=1"], "seed (0 -> 1)"),
     (["train.batch_size=64"], "train.batch_size (32 -> 64)"),
     (["--config", "tune_configs/chitchat_quick.yaml"], "task.name ('counting' -> 'chitchat')")],
)
def test_resume_refuses_what_a_checkpoint_fixes_before_writing_anything(finished_run, capsys, args, named):
    before = snapshot(finished_run)
    assert main([f"run_dir={finished_run}", "--resume", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --resume cannot change ") and named in err and len(err.splitlines()) == 1
    assert snapshot(finished_run) == before


def test_resume_takes_the_original_command_again_and_safe_changes(finished_run, capsys):
    # the original command plus --resume: every repeated key keeps its saved value
    saved = yaml.safe_load((finished_run / "config.yaml").read_text())
    cfg, changed = resume_config(saved, None, [*TINY, "rollout.num_workers=0", f"run_dir={finished_run}"])
    assert changed == [] and config_to_dict(cfg) == saved
    cfg, changed = resume_config(saved, None, ["train.iters=10", "algo.lr=1e-4", "rollout.num_workers=2",
                                               "train.checkpoint_every=5", "progress=lines"])
    assert [k for k, _, _ in changed] == ["progress", "algo.lr", "rollout.num_workers", "train.iters",
                                          "train.checkpoint_every"]
    assert cfg.train.iters == 10 and cfg.model == tiny_config().model
    # where the actors run may change: the placement strategy and custom resources (a lost node's replacement
    # advertises others; 0 drops a saved one)
    cfg, changed = resume_config(saved, None, ["rollout.placement_strategy=SPREAD", "learner.resources={node_b: 1}"])
    assert [k for k, _, _ in changed] == ["rollout.placement_strategy", "learner.resources.node_b"]
    saved_pinned = config_to_dict(cfg)
    cfg, changed = resume_config(saved_pinned, None, ["learner.resources.node_b=0"])
    assert changed == [("learner.resources.node_b", 1.0, 0.0)] and cfg.learner.resources == {"node_b": 0.0}
    # MLE's length may change only while the run is in MLE
    resume_config(saved, None, ["train.pretrain_iters=40"], stage="mle")
    with pytest.raises(ConfigError, match=r"train.pretrain_iters \(20 -> 40\) \(MLE pretraining is over\)"):
        resume_config(saved, None, ["train.pretrain_iters=40"], stage="train")
    # --print-config shows the resumed config without running anything
    assert main([f"run_dir={finished_run}", "--resume", "--print-config", "train.iters=10"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["train"]["iters"] == 10 and shown["model"] == saved["model"]


def test_trainer_refuses_another_model_before_writing(finished_run):
    """The library path (Tune resumes trials through it) checks the checkpoint before writing or starting."""
    before = snapshot(finished_run)
    cfg = tiny_config("rollout.num_workers=0", "model.hidden_dim=64", run_dir=finished_run)
    with pytest.raises(ValueError, match=r"trained with another model.hidden_dim"):
        Trainer(cfg, resume=True).run()
    assert snapshot(finished_run) == before


def test_runs_from_before_model_arch_resume(tmp_path):
    """A checkpoint whose config has no model.arch (written before the key existed) resumes as arch=rnn."""
    from rayseq.checkpoint import load_checkpoint, save_checkpoint

    cfg = tiny_config("rollout.num_workers=0", "train.pretrain_iters=2", "train.iters=1", "train.checkpoint_every=1",
                      run_dir=tmp_path / "old")
    Trainer(cfg).run()
    last = list_checkpoints(tmp_path / "old")[-1]
    ck = load_checkpoint(last)
    for key in ("arch", "path", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"):
        del ck["config"]["model"][key]
    iteration = int(last.rsplit("_", 1)[1].removesuffix(".pt"))
    save_checkpoint(tmp_path / "old", iteration, ck)
    longer = tiny_config("rollout.num_workers=0", "train.pretrain_iters=2", "train.iters=2",
                         "train.checkpoint_every=1", run_dir=tmp_path / "old")
    assert Trainer(longer, resume=True).run()["iterations"] == 4
