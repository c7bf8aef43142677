"""What goes wrong with a Hugging Face folder or the hf extra is one `error:` line from the command line, saying
what to do, not a traceback: a tokenizer whose pad token is its end token, a torchvision built for another torch
(vLLM's wheels bring one, and transformers imports it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rayseq.train import main as train_main
from tests.hf.test_hf_training import TINY

ROOT = Path(__file__).resolve().parents[2]


def test_a_pad_token_that_is_the_end_token_is_one_line(corpus, hf_dir, tmp_path, capsys):
    d = tmp_path / "pad-is-eos"
    shutil.copytree(hf_dir, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["pad_token"] = cfg["eos_token"]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    rc = train_main([*TINY, f"task.data={corpus}", "model.arch=hf", f"model.path={d}", "train.pretrain_iters=0",
                     f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert rc == 2, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert "needs a pad token other than its end token" in line and "Traceback" not in err


@pytest.mark.e2e
def test_a_torchvision_that_does_not_load_is_named_before_the_run(corpus, hf_dir, tmp_path):
    fake = tmp_path / "site" / "torchvision"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    r = subprocess.run([sys.executable, "-m", "rayseq.train", *TINY, f"task.data={corpus}", "model.arch=hf",
                        f"model.path={hf_dir}", "--print-config"], capture_output=True, text=True, env=env,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "operator torchvision::nms does not exist" in r.stderr
    assert "pip uninstall -y torchvision torchaudio torchcodec" in r.stderr
