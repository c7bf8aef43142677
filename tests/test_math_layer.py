"""The math layer never imports Ray (docs/concepts/index.md): researchers read and change
``models/ losses/ rewards/ tasks/ data/ algos/`` with torch and numpy only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MATH_DIRS = ("models", "losses", "rewards", "tasks", "data", "algos")


def test_importing_math_and_foundations_does_not_load_ray():
    code = (
        "import rayseq.models, rayseq.losses, rayseq.tasks, rayseq.rewards, rayseq.algos, "
        "rayseq.config, rayseq.types, rayseq.checkpoint, rayseq.vocab; import sys; "
        "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if m.split('.')[0] == 'ray')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def _ray_imports(source: str) -> list[str]:
    """Module names of every ``import ray...`` / ``from ray... import`` in ``source``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [n for n in names if n == "ray" or n.startswith("ray.")]
    return found


def test_checker_catches_ray_imports():
    src = "import os\ndef f():\n    import ray\n    from ray.util import x\nimport rayseq.losses\n"
    assert _ray_imports(src) == ["ray", "ray.util"]
    assert _ray_imports("from rayseq import losses\nimport raylib\n") == []


def test_no_ray_import_in_math_layer_sources():
    files = [p for d in MATH_DIRS for p in sorted((ROOT / "rayseq" / d).rglob("*.py"))]
    assert len(files) >= 10  # the folders really were scanned
    offenders = {
        str(p.relative_to(ROOT)): hits for p in files if (hits := _ray_imports(p.read_text()))
    }
    assert offenders == {}
