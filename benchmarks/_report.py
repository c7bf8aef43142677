"""Shared by the small benchmark scripts: print a Markdown table and write it with a JSON record."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path


def _gpu_name() -> str | None:
    """The CUDA device's name where torch sees one (figures name the GPU they were measured on)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def write_report(out: Path, name: str, table: str, payload: dict) -> None:
    """Print ``table``; write ``out/name.md`` and ``out/name.json`` (payload + command, date, machine)."""
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(table + "\n")
    meta = {
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "gpu": _gpu_name()},
    }
    (out / f"{name}.json").write_text(json.dumps({**payload, **meta}, indent=2) + "\n")
