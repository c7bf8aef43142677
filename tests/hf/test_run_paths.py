"""A run keeps the files it names (model.path, task.data, the tokenizer) as absolute paths, so that it serves, exports
and resumes from any folder; serving and exporting check, before they start, that the base model is still there."""

from __future__ import annotations

import shutil

import pytest
import yaml

from rayseq.checkpoint import check_base_model, load_checkpoint
from rayseq.config import build_config, resume_config
from rayseq.distributed.driver import Trainer
from rayseq.export import main as export_main
from rayseq.serving.app import build_app
from tests.hf.test_hf_training import TINY


def test_a_run_started_with_relative_paths_serves_and_exports_from_elsewhere(corpus, hf_dir, tmp_path, monkeypatch,
                                                                              capsys):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    for d in (work / "models", work / "data", elsewhere):
        d.mkdir(parents=True)
    shutil.copytree(hf_dir, work / "models" / "my-gpt2")
    shutil.copytree(corpus, work / "data" / "pairs")
    monkeypatch.chdir(work)
    given = [*TINY, "task.data=data/pairs", "model.arch=hf", "model.path=models/my-gpt2", "train.pretrain_iters=0",
             "run_dir=runs/hf"]
    cfg = build_config(None, given)
    assert cfg.model.path == "models/my-gpt2"  # --print-config shows what was given
    Trainer(cfg).run()

    model = str(work / "models" / "my-gpt2")
    saved = yaml.safe_load((work / "runs" / "hf" / "config.yaml").read_text())
    assert (saved["model"]["path"], saved["task"]["hf_tokenizer"]) == (model, model)
    assert saved["task"]["data"] == str(work / "data" / "pairs")
    head = load_checkpoint(work / "runs" / "hf", training_state=False)
    assert head["config"]["model"]["path"] == model and head["task"]["vocab"]["hf_tokenizer"] == model
    # the original command with --resume appended, from the same folder: the relative path is the saved one
    resume_config(head["config"], None, given)

    run = str(work / "runs" / "hf")
    monkeypatch.chdir(elsewhere)
    build_app({"checkpoint": run})  # the pre-flight of python -m rayseq.serve passes
    assert export_main([run, "--out", "exported"]) == 0
    assert (elsewhere / "exported" / "rayseq_export.json").read_text().count(model) == 1  # its base_model

    shutil.move(model, tmp_path / "moved")  # the base model gone: one line naming it, before anything starts
    with pytest.raises(FileNotFoundError, match=r"was trained from .*/models/my-gpt2 \(model.path\), which is not "
                                                r"there: the run reads it from there"):
        build_app({"checkpoint": run})
    capsys.readouterr()
    assert export_main([run, "--out", "exported2"]) == 2
    assert "(model.path), which is not there" in capsys.readouterr().err


def test_a_run_that_kept_a_relative_path_says_where_to_run_from(tmp_path, monkeypatch):
    """A checkpoint written by an older rayseq kept model.path as given."""
    monkeypatch.chdir(tmp_path)
    ck = {"config": {"model": {"arch": "hf", "path": "models/my-gpt2"}}, "task": {"vocab": {}}}
    with pytest.raises(FileNotFoundError, match=r"models/my-gpt2 \(model.path\), which is not there from .*: the "
                                                r"run kept the path as it was given; run this from the folder"):
        check_base_model(ck, "runs/old")
