"""Every algorithm trains a ``model.arch=transformer`` policy end to end: MLE pretraining, then the
algorithm through the driver (in-process) on the tiny chit-chat corpus (BLEU rewards are rarely all 0, so every
algorithm has a gradient after a few pretraining steps), and SeqGAN on SeqGAN's oracle task with the
decoder-only Transformer, its Monte-Carlo search on a rollout worker actor, through ``python -m rayseq.train`` on
Ray. No algorithm file knows the architecture: they call the policy protocol (rayseq/models/protocol.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from rayseq.checkpoint import load_checkpoint
from rayseq.config import build_config
from rayseq.distributed.driver import Trainer
from rayseq.registry import ALGORITHMS, algorithm_class
from tests.algos.test_seqgan import ORACLE, SMALL_D

ROOT = Path(__file__).resolve().parents[2]
TRANSFORMER = ["model.arch=transformer", "model.hidden_dim=16", "model.n_heads=2", "model.ff_dim=24"]
CHITCHAT = ["task.name=chitchat", "train.pretrain_batch_size=32", "train.pretrain_lr=1e-2", "task.test_size=100",
            "task.val_size=20", "train.pretrain_iters=10", "train.iters=2", "train.batch_size=16", "train.eval_every=2",
            "train.checkpoint_every=10", "train.keep_checkpoints=5", "progress=false"]
OWN = {  # cheap values of an algorithm's own keys
    "raml": ["algo.raml_pool=8", "algo.raml_samples=2"], "scheduled_sampling": ["algo.ss_k=1"],
    "erpo_interpolation": ["algo.interp_val_every=2"], "seqgan": ["algo.mc_rollouts=2"],
    "seqgan_ppo": ["algo.mc_rollouts=2"], "seqgan_ppo_dynamic": ["algo.mc_rollouts=2"],
}


def overrides(name: str, corpus: Path, run_dir: Path) -> list[str]:
    disc = SMALL_D if "disc" in algorithm_class(name).sections else []
    return [*CHITCHAT, f"task.data={corpus}", *TRANSFORMER, *disc, *OWN.get(name, []), f"algo.name={name}",
            "rollout.num_workers=0", f"run_dir={run_dir}"]


@pytest.mark.parametrize("name", [n for n in ALGORITHMS if not algorithm_class(n).own_task])  # test_reward_model
def test_every_algorithm_trains_a_transformer(corpus, tmp_path, name):
    run_dir = tmp_path / name
    summary = Trainer(build_config(None, overrides(name, corpus, run_dir))).run()
    d_pretrain = 2 if "disc" in algorithm_class(name).sections else 0  # SMALL_D: disc.pretrain_steps=2 first
    assert summary["algo"] == name and summary["iterations"] == 10 + d_pretrain + 2
    ck = load_checkpoint(summary["checkpoint"])
    assert ck["config"]["model"]["arch"] == "transformer"
    final = ck["learner"]["generator"]
    assert any(k.startswith("decoder.0.self_attn.") for k in final)  # the Transformer's weights were trained
    if name == "mle":  # serving rebuilds the Transformer from the checkpoint and answers
        from rayseq.serving.model import ChatModel, GenRequest

        chat = ChatModel(summary["checkpoint"])
        assert type(chat.generator).__name__ == "TransformerGenerator"
        (res,) = chat.generate([GenRequest(text="hi there", max_tokens=5)])
        assert len(res.replies) == 1 and 1 <= res.completion_tokens <= 5
    else:  # the algorithm moved the generator away from the one MLE pretraining ended with
        pretrained = load_checkpoint(run_dir / "checkpoints" / f"ckpt_{10:08d}.pt")["learner"]["generator"]
        assert any(not torch.equal(pretrained[k], final[k]) for k in final)
    rows = [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert len(rows) == 2
    if "mc_rollouts" in algorithm_class(name).fields:  # SeqGAN's Q from Monte-Carlo search with the Transformer
        assert all(r["rollout/extra_gen_steps"] > 0 for r in rows)
    assert all(math.isfinite(v) for k, v in summary["metrics"].items() if isinstance(v, float))


@pytest.mark.ray
def test_seqgan_on_the_oracle_with_a_decoder_only_transformer_on_ray(tmp_path):
    out = tmp_path / "run"
    args = [*ORACLE, *SMALL_D, "model.arch=transformer", "model.hidden_dim=16", "model.n_heads=2", "model.ff_dim=24",
            "rollout.num_workers=1", "rollout.num_cpus_per_worker=0.5", "scorer.num_scorers=1",
            "scorer.num_cpus_per_scorer=0.5", "learner.num_cpus=0.5", f"run_dir={out}"]
    r = subprocess.run([sys.executable, "-m", "rayseq.train", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollout_workers"] == 1 and math.isfinite(summary["metrics"]["test/nll_oracle"])
    rows = [r for r in pq.read_table(out / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert len(rows) == 4 and all(r["rollout/extra_gen_steps"] > 0 for r in rows)
    gen = load_checkpoint(summary["checkpoint"])["learner"]["generator"]
    assert not any(k.startswith("encoder.") for k in gen)  # decoder-only: the oracle task is unconditional
