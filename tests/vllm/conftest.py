"""The vLLM tests run where vLLM is installed: an environment of its own (``pip install -e ".[vllm]"``; .ci/run makes
``.venv-vllm``), since vLLM pins transformers below the main suite's. Elsewhere they are skipped.

Their model: the tiny GPT-2 of tests/hf_fixtures.py with one attention head of 32 dimensions (vLLM's CPU attention
kernels take no smaller heads)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="the vllm extra, in its own environment: pip install -e .[vllm]")

# vLLM's key/value cache on the CPU: 64 MiB is plenty for the tiny model (its default reserves gigabytes)
ENGINE_KWARGS = {"kv_cache_memory_bytes": 64 << 20}


@pytest.fixture(scope="session")
def vllm_hf_dir(tmp_path_factory):
    from tests.conftest import GREETINGS, REPLIES, TOPICS
    from tests.hf_fixtures import make_tiny_hf

    return make_tiny_hf(tmp_path_factory.mktemp("hf") / "tiny-gpt2-h32",
                        extra_lines=tuple(GREETINGS + REPLIES + TOPICS) * 5, n_head=1)
