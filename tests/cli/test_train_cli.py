"""The training CLI and the run outputs, driven for real with tiny budgets."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from rayseq.checkpoint import list_checkpoints, load_checkpoint
from rayseq.config import build_config
from rayseq.distributed.driver import Interrupted, Trainer
from rayseq.distributed.driver.progress import Progress
from rayseq.train import main as train_main
from rayseq.train import relative_run_dir_warning
from tests.conftest import TINY, tiny_config

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rayseq.train", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    ("override", "named"),
    [("algo.epsx=1", "algo.epsx"), ("algo.eps=-1", "algo.eps"), ("algo.name=sarsa", "algo.name"),
     ("rollout.num_workers=two", "rollout.num_workers"), ("nonsense", "nonsense")],
)
def test_bad_override_fails_at_once_naming_the_key(override, named, capsys):
    if override == "nonsense":  # one through a real process: exit status 2, one line, no traceback
        r = run_cli(override, "--print-config", timeout=60)
        code, err = r.returncode, r.stderr
    else:
        code, err = train_main([override, "--print-config"]), capsys.readouterr().err
    assert code == 2
    assert named in err and "error" in err
    assert "Traceback" not in err


def test_missing_config_file_is_a_clear_error():
    r = run_cli("--config", "does/not/exist.yaml", timeout=60)
    assert r.returncode == 2 and "does/not/exist.yaml" in r.stderr


def test_experiment_files_parse(capsys):
    """Every experiment file opens with a header and resolves through the CLI's own entry point (in this
    process: the subprocess path of --print-config is the bad-override test's)."""
    files = sorted((ROOT / "tune_configs").glob("*.yaml"))
    assert files, "tune_configs/ holds the experiment files"
    for f in files:
        text = f.read_text()
        assert text.startswith("#"), f"{f.name} must open with a header comment"
        assert train_main(["--config", str(f), "--print-config"]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert yaml.safe_load(out)["algo"]["name"], f"{f.name}: --print-config printed no algorithm"


@pytest.mark.e2e
def test_in_process_run_writes_every_output(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(*TINY, "rollout.num_workers=0", "algo.name=ppo", f"run_dir={run_dir}")
    assert r.returncode == 0, r.stderr
    assert "precision" in r.stdout and "MLE" in r.stdout  # the final table

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert build_config(cfg) == build_config(None, [*TINY, "rollout.num_workers=0", "algo.name=ppo",
                                                    f"run_dir={run_dir}"])

    table = pq.read_table(run_dir / "metrics.parquet")
    assert table.column_names[:2] == ["stage", "iteration"]
    rows = table.to_pylist()
    assert [r["iteration"] for r in rows] == list(range(1, 20 + 6 + 1))
    assert [r["stage"] for r in rows] == ["mle"] * 20 + ["train"] * 6
    for key in ("loss/nll", "loss/policy", "policy/clipfrac", "policy/approx_kl", "rollout/reward_mean",
                "time/rollout_s", "time/learn_s", "time/sync_s", "val/precision"):
        assert key in table.column_names, key
    # the test set is evaluated once, at the end, into summary.json: never a metric row anything could select on
    assert not [c for c in table.column_names if c.startswith(("test/", "eval/"))]

    assert list((run_dir / "tb").glob("events.out.tfevents.*"))

    summary = json.loads((run_dir / "summary.json").read_text())
    assert {"task", "algo", "seed", "metrics", "pretrain_metrics", "wall_s", "run_dir"} <= set(summary)
    assert summary["algo"] == "ppo" and summary["task"] == "counting"
    assert summary["metrics"]["val/precision"] == rows[-1]["val/precision"]  # the last validation
    assert {"test/precision", "val/precision"} <= set(summary["pretrain_metrics"])
    # test/* is the final generator's, recomputed here from the final checkpoint
    from rayseq.distributed.actors.learner import evaluate_checkpoint

    test, _ = evaluate_checkpoint(str(run_dir), "test")
    assert summary["metrics"]["test/precision"] == test["test/precision"]
    assert {k for k in summary["metrics"] if k.startswith("test/")} == set(test)

    ckpts = list_checkpoints(run_dir)
    assert len(ckpts) == 1
    ck = torch.load(ckpts[0], weights_only=True)  # the head, written by the driver: plain containers only
    assert {"config", "task", "learner", "driver"} <= set(ck) and ck["format"] == "rayseq-checkpoint-v2"
    assert ck["learner"] == {"generator": "ckpt_00000026.learner/generator.pt",
                             "state": "ckpt_00000026.learner/state.pt"}
    assert {"numpy_rng", "python_rng", "iteration", "stage"} <= set(ck["driver"])
    # the learner's files, written by the learner, beside it (recorded in the .sha256), assembled on loading
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "ckpt_00000026.learner", "ckpt_00000026.pt", "ckpt_00000026.sha256"]
    assert sorted(p.name for p in (run_dir / "checkpoints" / "ckpt_00000026.learner").iterdir()) == [
        "generator.pt", "state.pt"]
    learner = load_checkpoint(ckpts[0])["learner"]
    assert {"generator", "gen_opt", "torch_rng", "version"} <= set(learner)
    assert {"baseline", "base_opt"} <= set(learner["algo"])  # PPO's value baseline is the algorithm's
    weights_only = load_checkpoint(ckpts[0], training_state=False)["learner"]  # serving's, export's: no optimizer
    assert set(weights_only) == {"generator"}
    assert ck["driver"]["iteration"] == 26
    assert ck["task"]["vocab"]["itos"][:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]


@pytest.mark.e2e
def test_training_changes_the_parameters_and_learns(tmp_path):
    cfg = tiny_config("rollout.num_workers=0", "train.pretrain_iters=150", "train.iters=0",
                      "train.pretrain_lr=1e-2", run_dir=tmp_path / "r")
    summary = Trainer(cfg).run()
    rows = pq.read_table(tmp_path / "r" / "metrics.parquet").to_pylist()
    assert rows[-1]["loss/nll"] < 0.8 * rows[0]["loss/nll"]
    assert summary["metrics"]["test/precision"] > 0.05  # an untrained model is almost never right


def test_interrupted_run_resumes_to_the_same_weights(tmp_path):
    """SIGINT-style stop after a checkpoint, then --resume: no iteration repeated or skipped, and the
    final weights equal an uninterrupted run's (in-process, fixed seed)."""
    common = ["rollout.num_workers=0", "algo.name=ppo_dynamic", "algo.minibatch_size=16",
              "train.checkpoint_every=5"]
    full = Trainer(tiny_config(*common, run_dir=tmp_path / "full")).run()

    def stop_at_12(row, trainer):
        if row["iteration"] == 12:
            trainer._stop = True

    cfg = tiny_config(*common, run_dir=tmp_path / "cut")
    with pytest.raises(Interrupted):
        Trainer(cfg, report=stop_at_12).run()
    assert list_checkpoints(tmp_path / "cut")[-1].endswith("/checkpoints/ckpt_00000012.pt")
    with pytest.raises(FileExistsError):
        Trainer(cfg).run()  # never overwrite a run by accident
    resumed = Trainer(cfg, resume=True).run()

    rows = pq.read_table(tmp_path / "cut" / "metrics.parquet").to_pylist()
    assert [r["iteration"] for r in rows] == list(range(1, 27))
    a = load_checkpoint(full["checkpoint"])["learner"]["generator"]
    b = load_checkpoint(resumed["checkpoint"])["learner"]["generator"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    assert resumed["metrics"] == full["metrics"]


@pytest.mark.ray
def test_default_cli_path_runs_on_embedded_ray(tmp_path):
    """`python -m rayseq.train` with 2 rollout workers on an embedded Ray (tiny budget), its output in a file:
    progress as plain lines (a line per step of the start, then per stage), no notice about the token authentication
    of the cluster it starts itself."""
    r = run_cli(*TINY, "rollout.num_workers=2", "progress=true", f"run_dir={tmp_path / 'ray'}", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert summary["rollout_workers"] == 2 and summary["algo"] == "ppo_dynamic"
    assert "Token authentication" not in r.stderr and "\r" not in r.stderr
    assert r.stderr.splitlines()[0] == f"run dir: {tmp_path / 'ray'}"
    lines = r.stderr.splitlines()
    # (a start slower than 30 s also names the actors still starting, every 30 s)
    waits = [line for line in lines if line.startswith("start-up: still starting after ")]
    start = [line for line in lines if line.startswith("start-up: ") and line not in waits]
    assert start[:2] == ["start-up: reserving 3 bundles (PACK) for the run's actors",
                         "start-up: starting 1 learner, 2 rollout workers and 0 scorers"], lines
    assert len(start) == 3 and start[2].startswith("start-up: started in ")
    assert len(lines) - len(waits) <= 9, r.stderr  # run dir, Ray started, the start's 3 steps, one line per stage


@pytest.mark.e2e
def test_progress_lines_when_output_is_not_a_terminal(tmp_path):
    """The default `progress` with stderr in a file (ray job logs, CI): a readable line per stage end (and every
    progress_every seconds), never a bar's carriage-return redraws; the run directory first."""
    r = run_cli(*TINY, "progress=true", "rollout.num_workers=0", f"run_dir={tmp_path / 'r'}")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stderr.splitlines()
    assert "\r" not in r.stderr and lines[0] == f"run dir: {tmp_path / 'r'}"
    assert lines[1].startswith("MLE pretraining 20/20 100%  elapsed 0:") and " nll=" in lines[1], lines
    assert lines[2].startswith("ppo_dynamic 6/6 100%  elapsed 0:") and " val_precision=" in lines[2], lines
    assert len(lines) == 3


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_progress_lines_every_interval_with_time_left():
    """A line every `progress_every` seconds and one at the stage's end; the time left is measured after the
    first (warm-up) iterations, so one slow start-up iteration does not inflate it."""
    out, clock = io.StringIO(), FakeClock()
    p = Progress("lines", every=30, stream=out, clock=clock)
    p.start("MLE pretraining", 1000, 0)
    clock.t += 20  # a slow first iteration (start-up), then 8 per second
    p.update({"nll": "2.500"})
    for i in range(1, 1000):
        clock.t += 0.125
        p.update({"nll": f"{2.5 - i / 1000:.3f}"} | ({"val_prec": "0.500"} if i == 500 else {}))
    p.close()
    p.start("ppo", 200, 0)
    p.close()  # no iteration yet: no line
    lines = out.getvalue().splitlines()
    assert len(lines) == 5, lines  # at 30, 60, 90, 120 s (20 s + 0.125 s per iteration) and the end (144.875 s)
    # 81 done at 30 s; 8 per second since the 3rd (20.25 s): 919 left take 115 s, not 919 * 30 s / 81
    assert lines[0] == "MLE pretraining 81/1000   8%  elapsed 0:30, ~1:55 left  nll=2.420"
    assert lines[2] == "MLE pretraining 561/1000  56%  elapsed 1:30, ~0:55 left  nll=1.940 val_prec=0.500"
    assert lines[4] == "MLE pretraining 1000/1000 100%  elapsed 2:25  nll=1.501 val_prec=0.500"


def test_progress_bar_has_a_label_no_early_eta_and_keeps_each_stage_on_screen():
    out = io.StringIO()
    p = Progress("bar", stream=out)
    p.start("MLE pretraining", 100, 0)
    first = out.getvalue()
    assert first.strip("\r").startswith("MLE pretraining:   0%") and "?" not in first and "<" not in first
    for i in range(100):
        p.update({"nll": f"{3 - i / 100:.3f}"})
        if i < 2:  # no rate or time left from the first iterations alone
            assert "<" not in out.getvalue() and "it/s" not in out.getvalue()
    p.start("ppo_dynamic", 10, 0)  # the next stage: the MLE bar stays, with its last NLL
    p.update({"reward": "0.500"})
    p.close()
    lines = out.getvalue().split("\n")
    assert "MLE pretraining: 100%" in lines[0] and "nll=2.010" in lines[0].rsplit("\r", 1)[-1]
    assert lines[1].rsplit("\r", 1)[-1].startswith("ppo_dynamic:  10%")


def test_start_up_steps_are_shown_before_the_first_stage():
    """What the run is starting (its placement group, its actors, what vLLM's engines took) is a line each, in either
    mode; nothing with progress=false."""
    for mode in ("lines", "bar"):
        out = io.StringIO()
        p = Progress(mode, stream=out)
        p.note("starting 1 learner, 2 rollout workers and 0 scorers")
        p.start("MLE pretraining", 10, 0)
        p.close()
        assert out.getvalue().splitlines()[0] == "start-up: starting 1 learner, 2 rollout workers and 0 scorers"
    out = io.StringIO()
    Progress(False, stream=out).note("starting")
    assert out.getvalue() == ""


def test_progress_mode_is_checked():
    assert build_config(None, ["progress=lines"]).progress == "lines"
    assert build_config(None, ["progress=false"]).progress is False
    with pytest.raises(ValueError, match="progress: expected true, false, bar or lines"):
        build_config(None, ["progress=verbose"])


def test_relative_run_dir_inside_a_ray_job_is_named(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert relative_run_dir_warning("runs/x") is None  # not a Ray job
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "gcs://pkg.zip"}}))
    warning = relative_run_dir_warning("runs/x")
    assert warning.startswith(f"warning: run_dir=runs/x is relative: in this Ray job it is {tmp_path}/runs/x, in "
                              "Ray's temporary copy of --working-dir")
    assert f"{tmp_path}/runs" in relative_run_dir_warning(None)  # the default runs/<name> too
    assert relative_run_dir_warning("/shared/runs/x") is None and relative_run_dir_warning("s3://b/x") is None


@pytest.mark.e2e
def test_sigkilled_run_resumes_without_repeating_or_skipping(tmp_path):
    """kill -9 the training process after a checkpoint; `--resume` continues from it and appends to
    metrics.parquet so that every iteration appears exactly once."""
    run_dir = tmp_path / "killed"
    args = [*TINY, "rollout.num_workers=0", "algo.name=reinforce", "train.checkpoint_every=10",
            "train.keep_checkpoints=3", f"run_dir={run_dir}"]
    proc = subprocess.Popen([sys.executable, "-m", "rayseq.train", *args, "train.iters=5000"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while not any(c.endswith("ckpt_00000040.pt") for c in list_checkpoints(run_dir)):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    killed_at = max(int(c[-11:-3]) for c in list_checkpoints(run_dir))
    assert killed_at >= 40
    r = run_cli(*args, "train.iters=60", "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    assert [row["iteration"] for row in rows] == list(range(1, 20 + 60 + 1))
    assert len(list_checkpoints(run_dir)) == 3  # keep_checkpoints
    assert any(row.get("time/checkpoint_s") for row in rows)
    # in-process with a fixed seed, the resumed run ends with the weights of a run never interrupted
    full = Trainer(build_config(None, [*args[:-1], f"run_dir={tmp_path / 'whole'}", "train.iters=60"])).run()
    a = load_checkpoint(full["checkpoint"])["learner"]["generator"]
    b = load_checkpoint(run_dir)["learner"]["generator"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def test_run_directory_as_a_uri(tmp_path):
    """Run outputs and resume through pyarrow.fs (file:// here; s3://, gs:// take the same path)."""
    uri = f"file://{tmp_path}/uri-run"
    cfg = tiny_config("rollout.num_workers=0", "train.checkpoint_every=10", run_dir=uri)
    summary = Trainer(cfg).run()
    assert summary["run_dir"] == uri and summary["checkpoint"].startswith(uri + "/checkpoints/")
    for name in ("config.yaml", "metrics.parquet", "summary.json"):
        assert (tmp_path / "uri-run" / name).is_file()
    assert load_checkpoint(uri)["driver"]["iteration"] == 26
    assert load_checkpoint(summary["checkpoint"])["driver"]["iteration"] == 26
    resumed = Trainer(cfg, resume=True).run()  # nothing left to do: same final evaluation
    assert resumed["metrics"] == summary["metrics"]


def test_a_run_without_pretraining_reports_its_start(tmp_path, capsys):
    """``train.pretrain_iters=0``: the final table's first column is the starting model's test figures (scored before
    the algorithm's first iteration), labelled as not pretrained, instead of dashes."""
    code = train_main([*TINY, "train.pretrain_iters=0", "rollout.num_workers=0", "progress=false",
                       f"run_dir={tmp_path / 'r'}"])
    assert code == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["pretrained"] is False
    assert {"val/precision", "test/precision", "test/y1_tv"} <= set(summary["pretrain_metrics"])
    table = capsys.readouterr().out
    header, _, precision = table.splitlines()[:3]
    assert "start (not pretrained)" in header and "MLE" not in header
    assert precision.startswith("precision (greedy)") and "-" not in precision.split()[2:]
    pre = summary["pretrain_metrics"]["test/precision"]
    assert precision.split()[2] == f"{pre:.4f}"  # the start's own figure, beside the final one


def test_the_table_says_why_a_figure_is_not_available():
    """Prompt-only data has no references: its BLEU-2 is NaN in the metrics, and the table says why on the row."""
    from rayseq.train import format_table

    nan = float("nan")
    summary = {"pretrain_metrics": {"test/bleu2": nan, "test/distinct1": 0.25},
               "metrics": {"test/bleu2": nan, "test/distinct1": 0.5, "test/reward": 1.0}, "algo": "grpo",
               "pretrained": False, "run_dir": "runs/x", "wall_s": 3.0}
    rows = {line.split("  ")[0]: line.split() for line in format_table(summary).splitlines()}
    assert rows["BLEU-2 (n/a: the data has no reference replies)"][-2:] == ["n/a", "n/a"]
    assert rows["distinct-1"][-2:] == ["0.2500", "0.5000"] and rows["reward (sampled replies)"][-2:] == ["-", "1.0000"]
    assert "nan" not in format_table(summary)
