"""python -m rayseq.export for the built-in generators: a safetensors + config + vocabulary folder that serving
loads as it loads the run (the same replies, the same model name); errors in one line. The Hugging Face export is
tested in tests/hf/test_hf_export.py."""

from __future__ import annotations

import json

import pytest
import torch

from rayseq.config import build_config
from rayseq.distributed.driver import Trainer
from rayseq.export import main as export_main
from rayseq.serving.model import ChatModel, GenRequest


@pytest.mark.parametrize("arch", ["rnn", pytest.param("transformer", marks=pytest.mark.slow)])
def test_builtin_export_serves_like_the_run(tmp_path, arch, capsys):
    run = tmp_path / "run"
    Trainer(build_config(None, [f"model.arch={arch}", "model.hidden_dim=16", "model.emb_dim=8", "model.ff_dim=16",
                                "train.pretrain_iters=3", "train.iters=2", "train.batch_size=16",
                                "train.pretrain_batch_size=16", "train.eval_every=0", "task.test_size=100",
                                "rollout.num_workers=0", "progress=false", f"run_dir={run}"])).run()
    assert export_main([str(run), "--out", str(tmp_path / "out")]) == 0
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"model.safetensors", "config.json", "vocab.json"}
    assert json.loads((tmp_path / "out" / "config.json").read_text())["format"] == "rayseq-export-v1"
    a, b = ChatModel(run), ChatModel(tmp_path / "out")
    assert a.model_id == b.model_id
    for k, v in a.generator.state_dict().items():
        assert torch.equal(v, b.generator.state_dict()[k]), k
    requests = [GenRequest(text="9 2 3", temperature=1.0, n=3, seed=7, max_tokens=3), GenRequest(text="4 4")]
    assert [r.replies for r in a.generate(requests)] == [r.replies for r in b.generate(requests)]
    capsys.readouterr()
    assert export_main([str(run), "--out", str(tmp_path / "out")]) == 2  # not empty, no --overwrite
    assert "exists and is not empty (use --overwrite" in capsys.readouterr().err
    assert export_main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "o2")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
