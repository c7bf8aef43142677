"""Shared by the small benchmark scripts: print a Markdown table and write it with a JSON record."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path


def write_report(out: Path, name: str, table: str, payload: dict) -> None:
    """Print ``table``; write ``out/name.md`` and ``out/name.json`` (payload + command, date, machine)."""
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(table + "\n")
    meta = {
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
    }
    (out / f"{name}.json").write_text(json.dumps({**payload, **meta}, indent=2) + "\n")
