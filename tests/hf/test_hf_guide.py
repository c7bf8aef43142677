"""docs/guides/hf-policies.md's commands are valid configs (the model directories replaced by the tests' tiny
ones): every `python -m rayseq.train` line of its example builds."""

from __future__ import annotations

import re

import pytest

from rayseq.config import ConfigError
from rayseq.train import load_config
from tests.doc_examples import code_blocks, commands, page


def guide_train_commands() -> list[list[str]]:
    block = next(b for lang, b in code_blocks(page("docs/guides/hf-policies.md")) if lang == "bash")
    return [args[args.index("rayseq.train") + 1 :] for args in commands(block) if "rayseq.train" in args]


def test_guide_commands_build(hf_dir, classifier_dir, tmp_path):
    commands = guide_train_commands()
    assert len(commands) == 3
    for args in commands:
        args = [re.sub(r"/?models/my-gpt2", str(hf_dir), a).replace("models/my-sentiment", str(classifier_dir))
                .replace("$PWD", str(tmp_path)) for a in args]
        args = [a.replace("POSITIVE", "lively") for a in args]  # the tiny classifier's label names
        cfg = load_config(None, args)
        assert cfg.model.arch == "hf" and cfg.task.hf_tokenizer == str(hf_dir)


def test_vllm_commands_build(hf_dir):
    """docs/guides/vllm.md's training command, and the README's copy of it, are valid configs (vLLM itself is needed
    only to run them)."""
    found = []
    for rel in ("docs/guides/vllm.md", "README.md"):
        for lang, block in code_blocks(page(rel)):
            if lang == "bash" and "rollout.engine=vllm" in block:
                found += [args[args.index("rayseq.train") + 1 :] for args in commands(block) if "rayseq.train" in args]
    assert len(found) == 2 and found[0] == found[1]
    cfg = load_config(None, [re.sub(r"models/my-gpt2", str(hf_dir), a) for a in found[0]])
    assert cfg.rollout.engine == "vllm" and cfg.rollout.engine_kwargs == {"kv_cache_memory_bytes": 1073741824}
    assert cfg.rollout.logp_correction == "tis"


def test_vllm_refuses_the_collective_weight_sync(hf_dir):
    """Weights over the gloo group reach the built-in sampler's workers (tests/distributed/test_weight_sync.py), not
    yet a vLLM engine: the config says so before anything starts."""
    with pytest.raises(ConfigError, match=r"rollout.weight_sync=collective with rollout.engine=vllm: not supported "
                                          r"yet .* use rollout.weight_sync=object_store"):
        load_config(None, ["model.arch=hf", f"model.path={hf_dir}", "rollout.engine=vllm",
                           "rollout.weight_sync=collective"])
