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
