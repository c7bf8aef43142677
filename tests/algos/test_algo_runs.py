"""The sequence-level algorithms (SCST, actor-critic, the ERPO family, SeqGAN-critic) end to end on a tiny
chit-chat corpus: each through the driver (in-process),
three on Ray actors (ERPO sampling on a rollout worker, the greedy SCST
baseline scored on a ScorerActor, SeqGAN-critic's D scores from a scorer), and all of them as one Ray Tune
grid."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from rayseq.checkpoint import load_checkpoint
from rayseq.config import build_config
from rayseq.distributed.actors.learner import evaluate_checkpoint
from rayseq.distributed.driver import Trainer

NEW = ["scst", "scheduled_sampling", "raml", "data_noising", "spg", "erpo_interpolation", "actor_critic",
       "seqgan_critic"]
TINY = {
    "task": {"name": "chitchat", "test_size": 100, "val_size": 20},
    "model": {"emb_dim": 16, "hidden_dim": 32},
    "algo": {  # keys of one algorithm under its name: used only when it is the chosen one
        "scheduled_sampling": {"ss_k": 2}, "raml": {"raml_pool": 8, "raml_samples": 2},
        "erpo_interpolation": {"interp_val_every": 2, "interp_lambdas": [0.3, 0.3, 0.4]},
    },
    "train": {"pretrain_iters": 20, "pretrain_batch_size": 32, "pretrain_lr": 1e-2, "iters": 4, "batch_size": 16,
              "eval_every": 2},
    "progress": False,
}
SMALL_D = {"emb_dim": 8, "filter_sizes": [1, 2], "num_filters": [4, 4], "pretrain_steps": 1, "d_steps": 1,
           "num_negatives": 32, "batch_size": 32}
SIGNATURE = {  # a metric only that algorithm logs
    "scst": "scst/greedy_reward_mean", "scheduled_sampling": "ss/epsilon", "raml": "raml/reward_mean",
    "data_noising": "noise/replaced_frac", "spg": "loss/nll", "erpo_interpolation": "interp/lambda1",
    "actor_critic": "critic/explained_variance", "seqgan_critic": "critic/explained_variance",
}


def tiny(corpus: Path, name: str, **extra) -> dict:
    import copy

    d = copy.deepcopy(TINY)
    d["task"]["data"] = str(corpus)
    d["algo"]["name"] = name
    if name == "seqgan_critic":
        d["disc"] = dict(SMALL_D)
    for k, v in extra.items():
        d[k] = {**d.get(k, {}), **v}
    return d


def train_rows(run_dir: Path) -> list[dict]:
    return [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r["stage"] == "train"]


@pytest.mark.parametrize("name", NEW)
def test_trains_through_the_driver(corpus, tmp_path, name):
    cfg = build_config(tiny(corpus, name, rollout={"num_workers": 0}, train={"checkpoint_every": 20,
                                                                             "keep_checkpoints": 5}),
                       [f"run_dir={tmp_path / name}"])
    summary = Trainer(cfg).run()
    assert summary["algo"] == name
    # the algorithm moved the generator away from the pretrained one (the checkpoint ending MLE, iteration 20)
    pretrained, final = (load_checkpoint(f"{tmp_path / name}/checkpoints/ckpt_{i:08d}.pt")["learner"]["generator"]
                         for i in (20, summary["iterations"]))
    assert any(not torch.equal(pretrained[k], final[k]) for k in final)
    # and the reported test figures are that final generator's, on the test split (val/* on the valid split)
    test, _ = evaluate_checkpoint(summary["checkpoint"], "test")
    assert {k: v for k, v in summary["metrics"].items() if k.startswith("test/")} == test
    rows = train_rows(tmp_path / name)
    assert rows[-1]["val/bleu2"] == summary["metrics"]["val/bleu2"]
    assert len(rows) == 4
    assert all(r.get(SIGNATURE[name]) is not None for r in rows)
    if name == "erpo_interpolation":  # validations at the start and every 2 iterations
        assert sum(r.get("interp/val_reward") is not None for r in rows) == 3
    if name == "seqgan_critic":  # no Monte-Carlo search: D scores the B sampled replies only
        assert all(r["rollout/extra_gen_steps"] == 0 and r["rollout/d_evals"] == 16 for r in rows)


@pytest.mark.ray
@pytest.mark.parametrize("name", ["erpo_interpolation", "scst", "seqgan_critic"])
def test_runs_on_ray_actors(ray_session, corpus, tmp_path, name):
    """On the tests' shared Ray (the CLI's own embedded Ray is tests/cli's): a rollout worker, a scorer actor and
    the learner actor, each algorithm's signature metric in every iteration, no worker restarted."""
    cfg = build_config(tiny(corpus, name, rollout={"num_workers": 1, "num_cpus_per_worker": 0.5},
                            scorer={"num_scorers": 1, "num_cpus_per_scorer": 0.5}, learner={"num_cpus": 0.5}),
                       [f"run_dir={tmp_path / 'run'}"])
    summary = Trainer(cfg).run()
    assert summary["rollout_workers"] == 1
    rows = train_rows(tmp_path / "run")
    assert len(rows) == 4 and all(r.get(SIGNATURE[name]) is not None for r in rows)
    assert all(r["rollout/worker_restarts"] == 0 for r in rows)


@pytest.mark.ray
def test_every_new_algorithm_as_a_tune_trial(ray_session, corpus, tmp_path, monkeypatch):
    from rayseq.tune import run_experiment
    from rayseq.tuning.spec import validate

    monkeypatch.setenv("RAY_CHDIR_TO_TRIAL_DIR", "0")
    train = tiny(corpus, "scst", rollout={"num_workers": 0})
    trials = [n for n in NEW if n != "seqgan_critic"]  # its disc.* keys would be refused by the others' trials
    exp = validate({"train": train, "search": {
        "param_space": {"algo.name": {"grid": trials}}, "metric": "val/bleu2", "mode": "max", "num_samples": 1,
        "max_concurrent_trials": 2, "scheduler": "fifo", "storage_path": str(tmp_path), "name": "algos", "seed": 0}})
    grid = run_experiment(exp)
    assert not grid.errors
    done = {r.config["algo.name"]: r.metrics for r in grid}
    assert set(done) == set(trials)
    for r in grid:
        m = r.metrics
        assert m["iteration"] == 20 + 4
        # Tune sees the validation metric of the trial's last evaluation, never a test/* figure
        summary = json.loads((tmp_path / "algos" / "runs" / m["trial_id"] / "summary.json").read_text())
        assert m["val/bleu2"] == summary["metrics"]["val/bleu2"]
        assert not [k for k in m if k.startswith("test/")] and "test/bleu2" in summary["metrics"]


def test_critic_warmup_trains_the_critic_first_without_d_steps(corpus, tmp_path):
    """algo.critic_warmup iterations come before train.iters: the generator stays fixed and D does not train."""
    cfg = build_config(tiny(corpus, "seqgan_critic", rollout={"num_workers": 0}, algo={"critic_warmup": 2}),
                       [f"run_dir={tmp_path / 'w'}"])
    Trainer(cfg).run()
    rows = train_rows(tmp_path / "w")
    assert len(rows) == 2 + 4
    assert [r["critic/warmup"] for r in rows] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert all(r.get("disc/loss") is None for r in rows[:2]) and all(r["disc/loss"] is not None for r in rows[2:])
