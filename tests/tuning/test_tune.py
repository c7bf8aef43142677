"""python -m rayseq.tune: the experiment-file language (fast, no Ray), then real Tune searches with tiny
budgets: ASHA through the CLI with Ctrl-C and --resume, PBT with an exploit that must
carry the new learning rate into the restored optimizer, and a trial with Ray rollout workers in its
PlacementGroupFactory."""

from __future__ import annotations

import copy
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from rayseq.config import build_config
from rayseq.tuning.spec import SpecError, load_experiment, val_metrics, validate

ROOT = Path(__file__).resolve().parents[2]

TINY_TRAIN = {  # tests/conftest.py's TINY, in-process
    "task": {"name": "counting", "test_size": 200},
    "model": {"emb_dim": 16, "hidden_dim": 32},
    "rollout": {"num_workers": 0},
    "train": {"pretrain_iters": 20, "pretrain_batch_size": 32, "iters": 12, "batch_size": 32, "eval_every": 3},
}


def experiment(storage, train=None, **search) -> dict:
    s = {
        "param_space": {"algo.lr": {"loguniform": ["1e-4", "1e-2"]},  # PyYAML reads 1e-4 as a string
                        "algo.alpha2": {"choice": [0.5, 1.0, 2.0]},
                        "algo.beta2": {"same_as": "algo.alpha2"}},
        "metric": "val/precision", "mode": "max", "num_samples": 2, "max_concurrent_trials": 2,
        "storage_path": str(storage), "name": "exp", "seed": 0,
    }
    s.update(search)
    return {"train": copy.deepcopy(train or TINY_TRAIN), "search": s}


def run_cli(*args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rayseq.tune", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


# ------------------------------------------------------------------------------- the experiment file


def test_spec_overrides_ties_and_trial_configs(tmp_path):
    f = tmp_path / "exp.yaml"
    data = experiment(tmp_path / "out")
    data["search"]["param_space"] = {"algo": {"lr": {"loguniform": ["1e-4", "1e-2"]},  # nested form works too
                                              "alpha2": {"choice": ["5e-1", 1.0]}},
                                     "algo.beta2": {"same_as": "algo.alpha2"}, "seed": {"grid": [0, 1, 2]}}
    f.write_text(yaml.safe_dump(data))
    exp = load_experiment(f, ["search.num_samples=3", "train.algo.alpha1=3",
                              "search.param_space.algo.lr={uniform: [1.0e-4, 2.0e-4]}",
                              "search.param_space.seed=null"])  # null removes a dimension
    assert exp.search.num_samples == 3 and exp.num_trials() == 3
    assert set(exp.dims) == {"algo.lr", "algo.alpha2"} and exp.ties == {"algo.beta2": "algo.alpha2"}
    assert exp.dims["algo.lr"].kind == "uniform" and exp.dims["algo.alpha2"].args == (0.5, 1.0)
    assert exp.path == f"{tmp_path}/out/exp"
    cfg = exp.trial_config({"algo.lr": 1.5e-4, "algo.alpha2": 2.0}, "abc_00001")
    assert (cfg.algo.lr, cfg.algo.alpha2, cfg.algo.beta2, cfg.algo.alpha1) == (1.5e-4, 2.0, 2.0, 3.0)  # β2 = α2
    assert cfg.run_dir == f"{tmp_path}/out/exp/runs/abc_00001" and cfg.progress is False
    # the resolved experiment round-trips, and the counting grid of the compare file has 15 trials
    assert validate(yaml.safe_load(yaml.safe_dump(exp.to_dict()))).to_dict() == exp.to_dict()
    assert load_experiment(ROOT / "tune_configs/counting_compare_algos.yaml").num_trials() == 15


def test_run_keys_are_taken_as_rayseq_train_takes_them(tmp_path):
    """`python -m rayseq.tune FILE train.iters=10 algo.lr=1e-3` means the run keys a user types for
    `python -m rayseq.train`; the file's own spelling (train. + the run key) means the same."""
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(experiment(tmp_path / "out")))
    typed = load_experiment(f, ["train.iters=10", "algo.lr=1e-3", "seed=4", "rollout.resources_per_worker.a=1"])
    spelled = load_experiment(f, ["train.train.iters=10", "train.algo.lr=1e-3", "train.seed=4",
                                  "train.rollout.resources_per_worker.a=1"])
    assert typed.to_dict() == spelled.to_dict()
    assert (typed.base.train.iters, typed.base.algo.lr, typed.base.seed) == (10, 1e-3, 4)
    assert typed.base.rollout.resources_per_worker == {"a": 1.0}


def test_a_trials_algo_value_beats_the_base_files_per_algorithm_value(tmp_path):
    """A searched algo.kl_coef reaches the trial even where the base config sets algo.grpo.kl_coef."""
    train = copy.deepcopy(TINY_TRAIN)
    train["algo"] = {"name": "grpo", "grpo": {"kl_coef": 0.02}}
    exp = validate(experiment(tmp_path, train=train, param_space={"algo.kl_coef": {"grid": [0.0, 0.2]}}))
    assert exp.trial_config({"algo.kl_coef": 0.2}).algo.kl_coef == 0.2
    assert exp.trial_config({"algo.kl_coef": 0.0}).algo.kl_coef == 0.0
    assert exp.train["algo"]["grpo"] == {"kl_coef": 0.02}  # the base stays as given


@pytest.mark.parametrize("name", ["counting_ppo_dynamic_search", "counting_compare_algos", "counting_pbt",
                                  "seqgan_oracle_search", "chitchat_search", "chitchat_compare_algos"])
def test_experiment_files_validate(name):
    exp = load_experiment(ROOT / "tune_configs" / f"{name}.yaml")
    assert exp.name == name and exp.num_trials() >= 4
    # `python -m rayseq.train --config FILE` runs the train: section alone (it has a task:)
    assert "task" in exp.train


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["search.param_space.algo.lrx={uniform: [1, 2]}"], "search.param_space.algo.lrx: not a run-config key"),
        (["search.param_space.algo.lr={uniformly: [1, 2]}"], "unknown primitive 'uniformly'"),
        (["search.param_space.algo.lr={uniform: [-1, 1]}"], "search.param_space.algo.lr: -1.0 is not a valid"),
        (["search.param_space.algo.lr={loguniform: [1, 1]}"], "lower < upper"),
        (["search.param_space.algo.name={choice: [ppo, sarsa]}"], "algo.name: 'sarsa'"),
        (["search.param_space.algo.beta2={same_as: algo.gamma}"], "search.param_space.algo.beta2: same_as"),
        (["search.param_space.run_dir={choice: [a, b]}"], "search.param_space.run_dir: set per trial"),
        (["search.mode=maximize"], "search.mode"),
        (["search.metric=val/bleu2"], "search.metric: 'val/bleu2' is not a validation metric of the counting task"),
        (["search.metric=test/precision"], "test/* is computed once at the end and reported, never selected on"),
        (["search.nums=3"], "search.nums: unknown key"),
        (["search.scheduler=hyperband"], "search.scheduler"),
        (["search.stop={steps: 3}"], "search.stop.steps"),
        (["train.algo.epsx=1"], "train: invalid config: algo.epsx: unknown key"),
        (["num_samples=3"], "did you mean search.num_samples?"),
        (["algo.epsx=1"], "train: invalid config: algo.epsx: unknown key"),
        (["search.scheduler={name: pbt, perturbation_interval: 4, hyperparam_mutations: "
          "{algo.lr: {grid: [1.0e-3]}}}"], "hyperparam_mutations.algo.lr: grid cannot be a mutation"),
        (["search.scheduler={name: pbt, perturbation_interval: 4, hyperparam_mutations: "
          "{algo.lr: {uniform: [1.0e-4, 1.0e-3]}}}", "search.checkpoint_every=3"], "search.checkpoint_every=3 must"),
        (["search.scheduler={name: asha, grace_period: 50}"], "grace_period=50 > max_t=12"),
    ],
)
def test_bad_specs_name_the_key(tmp_path, overrides, named):
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(experiment(tmp_path)))
    with pytest.raises(SpecError) as err:
        load_experiment(f, overrides)
    assert named in str(err.value)


@pytest.mark.e2e
def test_bad_spec_exits_2_before_ray_starts(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(experiment(tmp_path)))
    for override, named in (("search.param_space.algo.lrx={choice: [1]}", "algo.lrx"),
                            ("search.mode=up", "search.mode")):
        r = run_cli(str(f), override)
        assert r.returncode == 2, r.stderr
        assert named in r.stderr and r.stderr.startswith("error:") and "Traceback" not in r.stderr
        assert "Ray" not in r.stdout + r.stderr  # nothing started
    assert not (tmp_path / "exp").exists()
    r = run_cli("does/not/exist.yaml")
    assert r.returncode == 2 and "does/not/exist.yaml" in r.stderr
    r = run_cli("tune_configs/counting.yaml")  # a run config, not an experiment
    assert r.returncode == 2 and "search: section" in r.stderr


def test_val_metrics_match_the_tasks(corpus):
    """The metric check's per-task lists are what the tasks' evaluate() reports, on both splits."""
    from rayseq.models import make_generator
    from rayseq.tasks import make_task, metric_names

    for cfg in (build_config(TINY_TRAIN, ["task.min_len=2", "task.max_len=4"]),
                build_config({"task": {"name": "oracle", "vocab_size": 30, "oracle_hidden": 8, "seq_len": 6,
                                       "num_train": 20, "eval_samples": 20, "test_size": 100, "val_size": 50},
                              "model": {"cell": "lstm", "emb_dim": 8, "hidden_dim": 8}, "algo": {"name": "mle"}}),
                build_config({"task": {"name": "chitchat", "data": str(corpus), "test_size": 100},
                              "model": {"emb_dim": 8, "hidden_dim": 8}})):
        task = make_task(cfg.task)
        for split in ("val", "test"):
            metrics, _ = task.evaluate(make_generator(cfg, task), split=split)
            assert sorted(metrics) == sorted(metric_names(cfg.task, split)), (cfg.task.name, split)
        assert val_metrics(cfg) == metric_names(cfg.task, "val")


def test_a_resumed_run_uses_its_own_learning_rates(tmp_path):
    """What a PBT exploit relies on: a checkpoint restored under a config with another lr trains at that lr
    (Learner.load_state_dict alone would bring back the saved optimizer's)."""
    from rayseq.distributed.driver import Trainer
    from tests.conftest import tiny_config

    Trainer(tiny_config("rollout.num_workers=0", "train.iters=4", "algo.lr=1e-3", "algo.baseline_lr=1e-2",
                        run_dir=tmp_path / "r")).run()
    seen = []

    def report(row, trainer):
        learner = trainer.groups.learner.local  # in-process groups
        seen.append((row["iteration"], learner.state.gen_opt.param_groups[0]["lr"],
                     learner.algo.modules["base_opt"].param_groups[0]["lr"]))

    cfg = tiny_config("rollout.num_workers=0", "train.iters=6", "algo.lr=5e-4", "algo.baseline_lr=2e-2",
                      run_dir=tmp_path / "r")
    Trainer(cfg, resume=True, report=report).run()
    assert seen == [(25, 5e-4, 2e-2), (26, 5e-4, 2e-2)]


# ------------------------------------------------------------------------------------------- Ray Tune


def _results(path: Path) -> list[dict]:
    """Every trial's reported rows (Tune's result.json), by trial id."""
    out = {}
    for d in sorted(path.glob("trial_*")):
        out[d.name.removeprefix("trial_")] = [json.loads(x) for x in (d / "result.json").read_text().splitlines()]
    return out


@pytest.mark.ray
def test_asha_search_cli_interrupt_resume_and_export(tmp_path):
    """The CLI end to end: Ctrl-C after the first Tune checkpoint (exit 130), --resume to the end; then the
    table, results.csv, best.json, the plot, per-trial checkpoints and run directories, and best/ served."""
    f = tmp_path / "exp.yaml"
    train = copy.deepcopy(TINY_TRAIN)
    train["train"].update(iters=24, eval_every=4)
    f.write_text(yaml.safe_dump(experiment(tmp_path, train=train, num_samples=3, max_concurrent_trials=1,
                                           checkpoint_every=4,
                                           scheduler={"name": "asha", "grace_period": 4, "reduction_factor": 2})))
    exp_dir = tmp_path / "exp"
    p = subprocess.Popen([sys.executable, "-m", "rayseq.tune", str(f)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 150
    while not list(exp_dir.glob("trial_*/checkpoint_*")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-3000:]  # one trial at a time: the others had not run
    assert "--resume" in err and not (exp_dir / "best.json").exists()
    assert "Tuner.restore" not in out + err  # one way to continue: rayseq's command, not Tune's Python call

    r = run_cli(str(f), "--resume", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "best trial" in r.stdout and "rank" in r.stdout
    # quiet: no tensorboardX warning per NaN metric (before a trial's first evaluation), no Tune status tables; a
    # compact progress line per finished trial (and every 30 s), then rayseq's ranked table
    assert "NaN or Inf" not in r.stdout + r.stderr and "Trial status" not in r.stdout, r.stdout[-3000:]
    progress = [line for line in r.stdout.splitlines() if line.startswith("tune: ")]
    assert progress and all(re.fullmatch(r"tune: \d/3 trials done, \d running, \d pending(, \d failed)?; (best "
                                         r"val/precision [\d.e+-]+ \(\w+\)|no val/precision yet); \d+:\d\d elapsed",
                                         line) for line in progress), progress
    assert len(r.stdout.splitlines()) < 40, r.stdout

    rows = list(_csv(exp_dir / "results.csv"))
    assert len(rows) == 3 and {row["status"] for row in rows} <= {"COMPLETED", "STOPPED EARLY"}
    best = json.loads((exp_dir / "best.json").read_text())["best"]
    assert best["trial_id"] == rows[0]["trial_id"] and set(best["params"]) == {"algo.lr", "algo.alpha2", "algo.beta2"}
    assert best["params"]["algo.beta2"] == best["params"]["algo.alpha2"]
    assert best["config"]["algo"]["lr"] == pytest.approx(best["params"]["algo.lr"])
    # chosen on the validation metric; its test figures computed once, on best/, and printed beside the choice
    from rayseq.distributed.actors.learner import evaluate_checkpoint

    assert best["test"] == evaluate_checkpoint(str(exp_dir / "best"), "test")[0]
    assert f"chosen on val/precision = {best['value']:.4g}" in r.stdout and "test/precision = " in r.stdout
    assert all(not any(k.startswith("test/") for k in x) for rep in _results(exp_dir).values() for x in rep)
    assert (exp_dir / "metric_vs_iteration.png").stat().st_size > 1000
    assert (exp_dir / "experiment.yaml").is_file()

    results = _results(exp_dir)
    assert len(results) == 3
    for trial_id, reported in results.items():
        run = exp_dir / "runs" / trial_id
        its = [x["iteration"] for x in pq.read_table(run / "metrics.parquet").to_pylist()]
        assert its == list(range(1, len(its) + 1))  # a resumed trial repeats no iteration, skips none
        assert list((run / "tb").glob("events.out.tfevents.*")) and list(run.glob("checkpoints/ckpt_*.pt"))
        assert list((exp_dir / f"trial_{trial_id}").glob("events.out.tfevents.*"))  # Tune's TensorBoard too
        assert all("val/precision" in x for x in reported)  # the metric in every result (NaN before an eval)
        for x in reported:  # a restored trial continues its checkpoint's clock
            if x["tune/restored_iteration"]:
                assert x["iteration"] >= x["tune/restored_iteration"]
    finished = [t for t, rep in results.items() if rep[-1]["algo_iteration"] == 24]
    assert finished and all((exp_dir / "runs" / t / "summary.json").is_file() for t in finished)

    from rayseq.serving.model import ChatModel, GenRequest

    model = ChatModel(exp_dir / "best")
    assert model.info["iteration"] == best["iteration"]
    assert model.generate([GenRequest("9 2 3")])[0].replies[0]
    exported = torch.load(next((exp_dir / "best" / "checkpoints").glob("ckpt_*.pt")), weights_only=True)
    assert exported["config"]["run_dir"].endswith(f"/runs/{best['trial_id']}")


def _csv(path: Path):
    import csv

    with open(path) as fh:
        yield from csv.DictReader(fh)


@pytest.mark.ray
def test_pbt_exploit_restores_a_checkpoint_with_its_new_learning_rate(ray_session, tmp_path, monkeypatch):
    """Synchronous PBT, 2 trials: at each perturbation the worse trial restores the better one's checkpoint
    and continues with a mutated lr; the restored optimizer must use that new lr, and the run must go on
    from the checkpoint's iteration."""
    from rayseq.tune import run_experiment
    from rayseq.tuning.results import summarize

    monkeypatch.setenv("RAY_CHDIR_TO_TRIAL_DIR", "0")
    train = copy.deepcopy(TINY_TRAIN)
    train["train"].update(iters=10, eval_every=2)
    exp = validate(experiment(
        tmp_path, train=train, num_samples=1,
        param_space={"algo.lr": {"grid": [1e-4, 1e-2]}, "algo.beta2": {"same_as": "algo.alpha2"},
                     "algo.alpha2": {"choice": [1.0]}},
        scheduler={"name": "pbt", "perturbation_interval": 4, "synch": True,
                   "hyperparam_mutations": {"algo.lr": {"loguniform": [1e-5, 1e-1]},
                                            "algo.alpha2": {"choice": [0.5, 1.0, 2.0]}}}))
    grid = run_experiment(exp)
    assert not grid.errors
    exp_dir = tmp_path / "exp"
    exploits = [json.loads(x) for x in (exp_dir / "pbt_global.txt").read_text().splitlines()]
    assert exploits  # at algo_iteration 4 (and 8)
    targets = [p.stem.removeprefix("pbt_policy_") for p in exp_dir.glob("pbt_policy_*.txt")]
    assert targets
    total = 20 + 10
    by_id = {r.metrics["trial_id"]: r for r in grid}
    for trial_id in targets:
        result = by_id[trial_id]
        # the run went on from the restored checkpoint to the end, no iteration repeated or skipped
        rows = pq.read_table(exp_dir / "runs" / trial_id / "metrics.parquet").to_pylist()
        assert [x["iteration"] for x in rows] == list(range(1, total + 1))
        assert result.metrics["iteration"] == total
        reported = _results(exp_dir)[trial_id]
        restored = {x["tune/restored_iteration"] for x in reported} - {0}
        assert restored and restored <= {20 + 4, 20 + 8}  # checkpoints of the perturbations
        # the trial's final config is a mutation, and its optimizer runs at that lr (not the clone's)
        from rayseq.checkpoint import load_checkpoint

        ck = load_checkpoint(str(sorted((exp_dir / "runs" / trial_id / "checkpoints").glob("ckpt_*.pt"))[-1]))
        lr = result.config["algo.lr"]
        assert ck["config"]["algo"]["lr"] == pytest.approx(lr)
        assert ck["learner"]["gen_opt"]["param_groups"][0]["lr"] == pytest.approx(lr)
        assert ck["config"]["algo"]["beta2"] == ck["config"]["algo"]["alpha2"] == result.config["algo.alpha2"]
    assert lr not in (1e-4, 1e-2)
    out = summarize(exp, grid)
    assert out["best"]["export"] and (exp_dir / "best" / "config.yaml").is_file()


@pytest.mark.ray
def test_trial_with_rollout_workers_runs_in_its_placement_group(ray_session, tmp_path, monkeypatch):
    """rollout.num_workers=1: the trial's PlacementGroupFactory reserves [driver (empty), learner, worker];
    the learner and the worker land in the trial's group (the actor groups' bundle 0 and 1)."""
    from rayseq.tune import run_experiment
    from rayseq.tuning.trainable import trial_bundles

    monkeypatch.setenv("RAY_CHDIR_TO_TRIAL_DIR", "0")
    train = copy.deepcopy(TINY_TRAIN)
    train["rollout"] = {"num_workers": 1, "num_cpus_per_worker": 0.5}
    train["train"].update(iters=4, eval_every=2)
    exp = validate(experiment(tmp_path, train=train, num_samples=1, scheduler="fifo",
                              param_space={"algo.lr": {"choice": [1e-3]}}))
    assert trial_bundles(exp.trial_config({})) == [{}, {"CPU": 1.0}, {"CPU": 0.5}]
    grid = run_experiment(exp)
    assert not grid.errors
    m = grid[0].metrics
    pg = m["tune/trial_placement_group"]
    assert pg and m["tune/learner_placement_group"] == pg and m["tune/worker_placement_groups"] == pg
    assert m["iteration"] == 24 and m["time/sync_s"] >= 0 and m["rollout/worker_restarts"] == 0
    assert grid[0].checkpoint is not None
