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
    only to run them), with the engine's memory left to rayseq (tests/vllm trains two workers that way)."""
    found = []
    for rel in ("docs/guides/vllm.md", "README.md"):
        for lang, block in code_blocks(page(rel)):
            if lang == "bash" and "rollout.engine=vllm" in block:
                found += [args[args.index("rayseq.train") + 1 :] for args in commands(block) if "rayseq.train" in args]
    assert len(found) == 2 and found[0] == found[1]
    cfg = load_config(None, [re.sub(r"models/my-gpt2", str(hf_dir), a) for a in found[0]])
    assert cfg.rollout.engine == "vllm" and cfg.rollout.engine_kwargs == {}
    assert cfg.rollout.logp_correction == "tis"


def test_vllm_takes_the_collective_weight_sync(hf_dir):
    """The guide's vLLM command with the weights over the gloo group builds (tests/vllm runs it on a Ray worker); the
    in-process run, which has no group, is refused in one line."""
    found = [args[args.index("rayseq.train") + 1 :] for lang, block in code_blocks(page("docs/guides/vllm.md"))
             if lang == "bash" and "rollout.engine=vllm" in block for args in commands(block) if "rayseq.train" in args]
    args = [re.sub(r"models/my-gpt2", str(hf_dir), a) for a in found[0]]
    cfg = load_config(None, [*args, "rollout.num_workers=1", "rollout.weight_sync=collective"])
    assert cfg.rollout.engine == "vllm" and cfg.rollout.weight_sync == "collective"
    with pytest.raises(ConfigError, match=r"rollout.weight_sync=collective: the workers are Ray actors"):
        load_config(None, [*args, "rollout.num_workers=0", "rollout.weight_sync=collective"])
