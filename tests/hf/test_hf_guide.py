"""docs/guides/hf-policies.md's commands are valid configs (the model directories replaced by the tests' tiny
ones): every `python -m rayseq.train` line of its example builds."""

from __future__ import annotations

import re

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
