"""Shared fixtures: tiny configs and one Ray runtime per test session (started only if a test needs it)."""

from __future__ import annotations

import os

import pytest

from rayseq.config import build_config

TINY = [
    "model.emb_dim=16",
    "model.hidden_dim=32",
    "task.test_size=200",
    "train.pretrain_iters=20",
    "train.pretrain_batch_size=32",
    "train.iters=6",
    "train.batch_size=32",
    "train.eval_every=3",
    "progress=false",
]


def tiny_config(*overrides: str, run_dir=None):
    extra = [f"run_dir={run_dir}"] if run_dir is not None else []
    return build_config(None, TINY + extra + list(overrides))


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray with 4 logical CPUs, shared by the Ray tests (starting Ray costs seconds)."""
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
