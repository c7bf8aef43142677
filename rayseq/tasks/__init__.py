"""Tasks = data + reward + evaluation (math layer: numpy + torch only).

A task class (:class:`rayseq.tasks.base.Task`: what it must provide and the defaults; its name registered in
:mod:`rayseq.registry`, or a user's class named by import path) declares ``name`` and ``fields`` (the ``task.*``
keys it reads) and provides ``evaluate(generator, device, split=...)`` with its ``val/*`` and ``test/*`` metrics,
listed by the classmethod ``metric_names(task_cfg, split)``; ``rewards(src, src_len, tokens, token_mask, key)`` ->
(per-token rewards (B, T), sequence reward (B,)); optional hooks: ``defaults`` (its values of ``task.*`` keys),
``prepare_data(task_cfg)`` (a classmethod the driver calls once before any actor builds the task).

Tasks with a reward report ``<split>/reward``: the mean reward (the configured one, ``reward.*``) of temperature-1
sampled replies to the split's inputs, drawn from a seeded generator (the same draws every evaluation). The oracle
task has no reward (SeqGAN's discriminator gives it), hence no ``val/reward``.
"""

from __future__ import annotations

from rayseq.registry import task_class
from rayseq.tasks.base import Task
from rayseq.tasks.counting import CountingTask
from rayseq.tasks.oracle import OracleTask
from rayseq.vocab import Specials, Vocab


def make_task(task_cfg, reward_cfg=None):
    """Task from a TaskConfig (the pairs module, which reads pyarrow, is imported only when asked for), with the
    configured reward (``reward_cfg``, a RewardConfig) installed as its ``rewards`` when it is not the task's own:
    then everything that asks the task for a reward (rollout scoring, SCST's baseline, RAML's weights, the
    validation reward, ``<split>/reward``) gets the configured one, and ``task.reward`` is that
    :class:`rayseq.rewards.reward.Reward` (its terms, for logging)."""
    task = task_class(task_cfg.name)(task_cfg)
    if reward_cfg is not None and getattr(task, "has_reward", True):
        from rayseq.rewards.reward import make_reward

        reward = make_reward(task, reward_cfg)
        if reward is not None:
            task.reward = task.rewards = reward
    return task


def prepared_task(task_cfg, reward_cfg=None):
    """:func:`make_task`, its data prepared first (``prepare_data``: e.g. pairs' ``task.prepare``), as the driver
    builds the run's task once before any actor does (the actors' :func:`make_task` then reads what is there)."""
    task_class(task_cfg.name).prepare_data(task_cfg)
    return make_task(task_cfg, reward_cfg)


def metric_names(task_cfg, split: str) -> list[str]:
    """The ``<split>/*`` metrics (``split`` = ``val`` or ``test``) a task of this config reports."""
    return task_class(task_cfg.name).metric_names(task_cfg, split)


__all__ = ["CountingTask", "OracleTask", "Specials", "Task", "Vocab", "make_task", "metric_names"]
