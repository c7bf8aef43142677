"""The GPU suite: ``pytest -m gpu`` on a machine with CUDA.

Every test here takes its device from ``RAYSEQ_TEST_DEVICE`` (default ``cuda``): without CUDA the suite is skipped,
and ``RAYSEQ_TEST_DEVICE=cpu`` runs the very same tests on the CPU — ``benchmarks/gpu/run.sh --device cpu --quick``
does, in the default test run (tests/benchmarks/test_gpu_runner.py), so the suite cannot rot before a GPU comes.
The default run deselects the marker (pyproject's ``-m 'not slow and not gpu'``).

Comparisons against the CPU are exact where the arithmetic allows it (float64 Monte-Carlo search under shared
uniforms), within float32 tolerance otherwise (TF32 off), and in distribution for sampling with the device's own
random stream. ``CUBLAS_WORKSPACE_CONFIG`` is set before CUDA starts, for ``learner.deterministic=true`` runs.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (read when CUDA starts)

DEVICE = os.environ.get("RAYSEQ_TEST_DEVICE", "cuda")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def device_ready() -> tuple[bool, str]:
    if DEVICE not in ("cuda", "cpu"):
        return False, f"RAYSEQ_TEST_DEVICE={DEVICE!r}: cuda or cpu"
    if DEVICE == "cuda" and not _cuda():
        return False, "no CUDA device (RAYSEQ_TEST_DEVICE=cpu runs this suite on the CPU)"
    return True, ""


def pytest_collection_modifyitems(config, items):
    ok, why = device_ready()
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not ok:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def device() -> str:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 comparisons against the CPU
    torch.backends.cudnn.allow_tf32 = False
    return DEVICE


def device_overrides(device: str) -> list[str]:
    """Config keys that put an in-process run's learner, rollout worker and scorer on ``device``."""
    if device == "cpu":
        return ["learner.device=cpu"]
    return ["learner.device=cuda", "rollout.num_gpus_per_worker=1", "scorer.num_gpus_per_scorer=1"]
