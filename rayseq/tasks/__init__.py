"""Tasks = data + reward + evaluation (math layer: numpy + torch only)."""

from __future__ import annotations

from rayseq.tasks.base import Specials, Vocab
from rayseq.tasks.counting import CountingTask
from rayseq.tasks.oracle import OracleTask


def make_task(task_cfg):
    """Task from a TaskConfig."""
    if task_cfg.name == "counting":
        return CountingTask(task_cfg)
    if task_cfg.name == "oracle":
        return OracleTask(task_cfg)
    if task_cfg.name == "chitchat":
        from rayseq.tasks.chitchat import ChitchatTask  # imports pyarrow readers only when needed

        return ChitchatTask(task_cfg)
    raise ValueError(f"task.name: unknown task {task_cfg.name!r}")


__all__ = ["CountingTask", "OracleTask", "Specials", "Vocab", "make_task"]
