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


def _cpu_name() -> str | None:
    """The CPU's model name (Linux), so that CPU timings say what they were taken on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _commit() -> str | None:
    """The repository's commit (with ``+dirty`` for uncommitted changes), or None outside a git checkout."""
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def git(*args: str) -> str:
    """``git ARGS`` in the repository; "unknown" where the tree is a copy without its history (the GPU machine's)."""
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    try:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_report(out: Path, name: str, table: str, payload: dict) -> None:
    """Print ``table``; write ``out/name.md`` and ``out/name.json`` (payload + command, commit, date, machine)."""
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(table + "\n")
    meta = {
        "command": " ".join(sys.argv),
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "cpu": _cpu_name(), "gpu": _gpu_name()},
    }
    (out / f"{name}.json").write_text(json.dumps({**payload, **meta}, indent=2) + "\n")


def before_after_parser(description: str, quick: str):
    """The arguments of a benchmark that measures this tree against an older revision, each in processes of its own:
    ``--out``, ``--quick`` (``quick``: what it shrinks), ``--before`` (a git revision) and the hidden ``--one`` (one
    measurement, in the process the script starts)."""
    import argparse

    repo = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=repo / "benchmarks" / "results")
    ap.add_argument("--quick", action="store_true", help=f"{quick}, this tree only")
    ap.add_argument("--before", help="git revision of the code before (its 'before' rows); none: after only")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    return ap


def extract_revision(revision: str, into: Path) -> Path:
    """The repository's files at ``revision`` (``git archive``), written into the new folder ``into``."""
    import subprocess

    into.mkdir()
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "archive", revision], cwd=repo, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into
