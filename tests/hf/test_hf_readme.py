"""README's "Hugging Face policies" commands are valid configs (the model directories replaced by the tests' tiny
ones): every `python -m rayseq.train` line of its example builds."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from rayseq.train import load_config

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_train_commands() -> list[list[str]]:
    text = README.read_text(encoding="utf-8")
    section = text.split("### Hugging Face policies", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    commands = []
    for line in block.splitlines():
        args = shlex.split(line, comments=True)
        if "rayseq.train" in args:
            commands.append(args[args.index("rayseq.train") + 1 :])
    return commands


def test_readme_commands_build(hf_dir, classifier_dir, tmp_path):
    commands = readme_train_commands()
    assert len(commands) == 3
    for args in commands:
        args = [re.sub(r"/?models/my-gpt2", str(hf_dir), a).replace("models/my-sentiment", str(classifier_dir))
                .replace("$PWD", str(tmp_path)) for a in args]
        args = [a.replace("POSITIVE", "lively") for a in args]  # the tiny classifier's label names
        cfg = load_config(None, args)
        assert cfg.model.arch == "hf" and cfg.task.hf_tokenizer == str(hf_dir)


def test_readme_vllm_command_builds(hf_dir):
    """README's "Rollouts with vLLM" training command is a valid config (vLLM itself is needed only to run it)."""
    section = README.read_text(encoding="utf-8").split("### Rollouts with vLLM", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    (args,) = [a[a.index("rayseq.train") + 1 :] for a in map(shlex.split, block.splitlines()) if "rayseq.train" in a]
    cfg = load_config(None, [re.sub(r"models/my-gpt2", str(hf_dir), a) for a in args])
    assert cfg.rollout.engine == "vllm" and cfg.rollout.engine_kwargs == {"kv_cache_memory_bytes": 1073741824}
    assert cfg.rollout.logp_correction == "tis"
