"""Training on the device: every algorithm family's update through the driver, a checkpoint and
``--resume`` equal to the uninterrupted run (``deterministic=true``: CUDA's RNG state restored, deterministic
kernels), a Ray run with the learner, the rollout workers and the scorer each holding a fraction of one GPU, and a
Hugging Face policy trained with GRPO on the ``hf_classifier`` reward. ``RAYSEQ_TEST_DEVICE=cpu`` runs the same."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from rayseq.checkpoint import load_checkpoint
from rayseq.config import build_config
from rayseq.distributed.driver import Trainer
from rayseq.registry import ALGORITHMS, algorithm_class
from tests.algos.test_seqgan import SMALL_D
from tests.cli.test_resume import cli as run_cli
from tests.gpu.conftest import device_overrides

ROOT = Path(__file__).resolve().parents[2]
QUICK = os.environ.get("RAYSEQ_GPU_QUICK") == "1"  # benchmarks/gpu/run.sh's smoke part: three algorithms, not 21
REST = os.environ.get("RAYSEQ_GPU_REST") == "1"  # its tests part: the others (with QUICK, two of them)
FEW = ["mle", "grpo", "seqgan_ppo_dynamic"]
OTHERS = [a for a in ALGORITHMS if a not in FEW and not algorithm_class(a).own_task]  # (its own task's tests)
CHITCHAT = ["task.name=chitchat", "model.emb_dim=16", "model.hidden_dim=32", "train.pretrain_batch_size=32",
            "train.pretrain_lr=1e-2", "task.test_size=100", "task.val_size=20", "train.pretrain_iters=10",
            "train.iters=2", "train.batch_size=16", "train.eval_every=2", "train.checkpoint_every=10",
            "train.keep_checkpoints=5", "progress=false", "rollout.num_workers=0"]
OWN = {"raml": ["algo.raml_pool=8", "algo.raml_samples=2"], "scheduled_sampling": ["algo.ss_k=1"],
       "erpo_interpolation": ["algo.interp_val_every=2"]}


def cli(*args: str) -> subprocess.CompletedProcess:
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr[-4000:]
    return r


def train_rows(run_dir: Path) -> list[dict]:
    """metrics.parquet without the wall-clock columns (time/*)."""
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "driver/recv_bytes"} for r in rows]


@pytest.mark.parametrize("name", (OTHERS[:2] if QUICK else OTHERS) if REST else FEW if QUICK else list(ALGORITHMS))
def test_every_algorithm_updates_on_the_device(device, corpus, tmp_path, name):
    cls = algorithm_class(name)
    mc = ["algo.mc_rollouts=2"] if "mc_rollouts" in cls.fields else []
    run_dir = tmp_path / name
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    cfg = build_config(None, [*CHITCHAT, f"task.data={corpus}", *(SMALL_D if "disc" in cls.sections else []), *mc,
                              *OWN.get(name, []), f"algo.name={name}", *device_overrides(device),
                              f"run_dir={run_dir}"])
    summary = Trainer(cfg).run()
    if device == "cuda":  # the learner (in this process) held its model on the GPU
        assert torch.cuda.max_memory_allocated() > 0
    d_pretrain = 2 if "disc" in cls.sections else 0
    assert summary["iterations"] == 10 + d_pretrain + 2
    pretrained = load_checkpoint(run_dir / "checkpoints" / f"ckpt_{10:08d}.pt")["learner"]["generator"]
    final = load_checkpoint(summary["checkpoint"])["learner"]["generator"]
    if name != "mle":  # the algorithm's update moved the generator away from where MLE pretraining left it
        assert any(not torch.equal(pretrained[k], final[k]) for k in final)
    assert all(math.isfinite(v) for v in summary["metrics"].values() if isinstance(v, float))
    rows = [r for r in train_rows(run_dir) if r["stage"] == "train"]
    assert len(rows) == 2
    if "mc_rollouts" in cls.fields:
        assert all(r["rollout/extra_gen_steps"] > 0 for r in rows)


def test_resume_on_the_device_equals_the_uninterrupted_run(device, tmp_path):
    """PPO-dynamic on counting, 6 iterations: stopped after 3 (a checkpoint), ``--resume train.iters=6`` ends with
    the uninterrupted run's metrics and weights, bit for bit (the checkpoint holds CUDA's RNG state)."""
    common = ["model.emb_dim=16", "model.hidden_dim=32", "task.test_size=200", "train.pretrain_iters=10",
              "train.pretrain_batch_size=32", "train.batch_size=32", "train.eval_every=3",
              "train.checkpoint_every=3", "rollout.num_workers=0", "deterministic=true", "progress=false",
              *device_overrides(device)]
    cli(*common, "train.iters=6", f"run_dir={tmp_path / 'whole'}")
    cli(*common, "train.iters=3", f"run_dir={tmp_path / 'parts'}")
    r = cli(f"run_dir={tmp_path / 'parts'}", "--resume", "train.iters=6")
    assert "resuming" in r.stderr
    assert train_rows(tmp_path / "parts") == train_rows(tmp_path / "whole")
    whole = json.loads((tmp_path / "whole" / "summary.json").read_text())
    parts = json.loads((tmp_path / "parts" / "summary.json").read_text())
    a, b = load_checkpoint(whole["checkpoint"])["learner"], load_checkpoint(parts["checkpoint"])["learner"]
    assert whole["iterations"] == parts["iterations"] == 16
    for k in a["generator"]:
        assert torch.equal(a["generator"][k], b["generator"][k]), k


@pytest.mark.ray
def test_ray_run_with_fractions_of_one_gpu(device, tmp_path):
    """SeqGAN-PPO-dynamic on counting through ``python -m rayseq.train`` on an embedded Ray: learner, 2 rollout
    workers (sampling, Monte-Carlo search) and a scorer (D) each reserve a quarter of the GPU."""
    gpu = "0.25" if device == "cuda" else "0"
    run_dir = tmp_path / "run"
    cli("algo.name=seqgan_ppo_dynamic", "algo.mc_rollouts=2", *SMALL_D, "model.emb_dim=16", "model.hidden_dim=32",
        "task.test_size=200", "train.pretrain_iters=10", "train.pretrain_batch_size=32", "train.iters=3",
        "train.batch_size=32", "train.eval_every=3", "progress=false", "rollout.num_workers=2",
        "scorer.num_scorers=1", "learner.num_cpus=0.5", "rollout.num_cpus_per_worker=0.5",
        "scorer.num_cpus_per_scorer=0.5", f"learner.num_gpus={gpu}", f"rollout.num_gpus_per_worker={gpu}",
        f"scorer.num_gpus_per_scorer={gpu}", f"learner.device={device}", f"run_dir={run_dir}")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rollout_workers"] == 2 and summary["iterations"] == 10 + 2 + 3
    rows = [r for r in train_rows(run_dir) if r["stage"] == "train"]
    assert len(rows) == 3 and all(r["rollout/extra_gen_steps"] > 0 for r in rows)
    assert math.isfinite(summary["metrics"]["test/precision"])


def test_hf_policy_trains_with_grpo_on_the_classifier_reward(device, corpus, hf_dir, classifier_dir, tmp_path):
    """A local GPT-2 as the policy, GRPO, the reward a local sequence classifier's probability of "lively" (on the
    GPU when there is one: reward.fn=hf_classifier picks CUDA itself)."""
    run_dir = tmp_path / "hf"
    cfg = build_config(None, [
        "task.name=pairs", f"task.data={corpus}", "task.test_size=100", "task.val_size=10", "model.arch=hf",
        f"model.path={hf_dir}", "algo.name=grpo", "algo.group_size=4", "train.pretrain_iters=2",
        "train.pretrain_batch_size=8", "train.iters=3", "train.batch_size=8", "train.eval_every=3",
        "algo.minibatch_size=8", "reward.fn=hf_classifier",
        f"reward.kwargs={{path: '{classifier_dir}', label: lively}}", "rollout.num_workers=0", "progress=false",
        *device_overrides(device), f"run_dir={run_dir}"])
    summary = Trainer(cfg).run()
    rows = [r for r in train_rows(run_dir) if r["stage"] == "train"]
    assert len(rows) == 3 and all(0 < r["rollout/reward_mean"] < 1 for r in rows)
    assert 0 < summary["metrics"]["test/reward"] < 1
