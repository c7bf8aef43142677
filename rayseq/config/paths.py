"""The config keys that name local files and folders (``model.path``, ``task.data``, ``train.init_from``, ...), and
their spelling in what a run keeps: absolute, so that a run directory serves, exports and resumes from any folder.

A key declares it with ``Field(..., json_schema_extra=LOCAL_PATH)``. A relative path means the folder the command
runs in; :func:`absolute_paths` writes it out in full when a run starts (``rayseq.train``, a Tune trial, a resume),
so that its ``config.yaml``, its checkpoints and an export of it name the same files from anywhere. ``--print-config``
prints the paths as given. URIs (``s3://...``) are kept as they are.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

LOCAL_PATH = {"local_path": True}  # json_schema_extra of a key naming a local file or folder


def _is_relative(value) -> bool:
    return isinstance(value, str) and bool(value) and "://" not in value \
        and not os.path.isabs(os.path.expanduser(value))


def is_run(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a rayseq run directory or checkpoint file (not a Hugging Face folder)."""
    p = Path(path).expanduser()
    return p.is_file() or (p / "checkpoints").is_dir() or (p / "summary.json").is_file()


def same_path(a: str | None, b: str | None) -> bool:
    """Whether two values of path keys name the same file or folder (a relative one against the working directory)."""
    if a is None or b is None or "://" in a or "://" in b:
        return a == b
    return os.path.abspath(os.path.expanduser(a)) == os.path.abspath(os.path.expanduser(b))


def absolute_paths(cfg: BaseModel) -> BaseModel:
    """``cfg`` (a run config, or one of its sections) with every :data:`LOCAL_PATH` key that holds a relative path
    made absolute against the working directory (``~`` expanded); other keys and absolute paths as they are.
    Sections are updated in place (their assignments are validated); returns ``cfg``."""
    for name, field in type(cfg).model_fields.items():
        value = getattr(cfg, name)
        if isinstance(value, BaseModel):
            absolute_paths(value)
        elif (field.json_schema_extra or {}).get("local_path") and _is_relative(value):
            setattr(cfg, name, os.path.abspath(os.path.expanduser(value)))
    return cfg
