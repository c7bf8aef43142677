"""Tasks = data + reward + evaluation (math layer: numpy + torch only).

A task class (:class:`rayseq.tasks.base.Task`: what it must provide and the defaults; its name registered in
:mod:`rayseq.registry`, or a user's class named by import path) declares ``name`` and ``params`` (the ``task.*``
keys it reads) and provides ``evaluate(generator, device, split=...)`` with its ``val/*`` and ``test/*`` metrics,
listed by the classmethod ``metric_names(task_cfg, split)``.
"""

from __future__ import annotations

from rayseq.registry import task_class
from rayseq.tasks.base import Specials, Task, Vocab
from rayseq.tasks.counting import CountingTask
from rayseq.tasks.oracle import OracleTask


def make_task(task_cfg):
    """Task from a TaskConfig (chitchat's module, which reads pyarrow, is imported only when asked for)."""
    return task_class(task_cfg.name)(task_cfg)


def metric_names(task_cfg, split: str) -> list[str]:
    """The ``<split>/*`` metrics (``split`` = ``val`` or ``test``) a task of this config reports."""
    return task_class(task_cfg.name).metric_names(task_cfg, split)


__all__ = ["CountingTask", "OracleTask", "Specials", "Task", "Vocab", "make_task", "metric_names"]
