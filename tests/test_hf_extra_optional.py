"""The hf and peers extras are optional: without transformers, tokenizers, safetensors and peft (hf), trl and datasets
(peers) every module of rayseq imports and a default run's config builds; model.arch=hf says which extra to install.
(Runs with the packages hidden, so it checks this on an install that has them too.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import importlib, pkgutil, sys

class Hidden:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("transformers", "tokenizers", "safetensors", "peft", "trl", "datasets"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Hidden())
import rayseq
for m in pkgutil.walk_packages(rayseq.__path__, "rayseq."):
    importlib.import_module(m.name)
from rayseq.config import ConfigError, build_config
build_config(None, ["task.name=pairs", "rollout.num_workers=0"])
try:
    build_config(None, ["task.name=pairs", "model.arch=hf", "model.path=."])
except ConfigError as e:
    print("ERROR", e)
print("LOADED", sorted(k for k in sys.modules if k.split(".")[0] in ("transformers", "peft", "safetensors", "trl",
                                                                   "datasets")))
"""


@pytest.mark.e2e
def test_rayseq_imports_and_validates_without_the_hf_extra():
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "pip install 'rayseq[hf]'" in r.stdout and "LOADED []" in r.stdout, r.stdout
