"""rayseq's tasks as Gymnasium environments, for RLlib and any other RL library.

``make_env(task)`` turns any rayseq task into a token-level :class:`gymnasium.Env` (:mod:`rayseq.envs.env`): a
built-in name (``counting``, ``oracle``, ``pairs``, ``chitchat``), a user's task class as an import path
``package.module:Class``, a ``task:`` mapping, a TaskConfig or a RunConfig; ``task.*`` keys as keyword
arguments (``make_env("chitchat", data="data/chitchat")``), ``reward=`` a ``reward:`` mapping.

Names it is known by: ``gymnasium.make("rayseq/Seq-v0", task="counting")`` (registered on import) and, after
:func:`register`, ``"rayseq"`` in RLlib / Tune configs: ``.environment("rayseq", env_config={"task": "counting"})``.
:mod:`rayseq.envs.rllib_module` is the RLlib RLModule that runs rayseq's own generator on these observations.

Imports Ray only in :func:`register`; the environment itself needs gymnasium, numpy and the task.
"""

from __future__ import annotations

import gymnasium as gym

from rayseq.envs.env import SeqEnv, build_task, task_config

ENV_NAME = "rayseq"  # the name register() gives it in Ray Tune's registry (RLlib's .environment(ENV_NAME))
GYM_ID = "rayseq/Seq-v0"


def make_env(task="counting", *, reward=None, render_mode: str | None = None, **task_keys) -> SeqEnv:
    """The token-level environment of a rayseq task (module docstring; :class:`rayseq.envs.env.SeqEnv`)."""
    return SeqEnv(build_task(task, reward, **task_keys), render_mode=render_mode)


def _from_env_config(env_config) -> SeqEnv:
    """RLlib's env creator: ``env_config`` (an EnvContext, a dict) holds make_env's keyword arguments."""
    return make_env(**dict(env_config))


def register() -> None:
    """Register the environment as ``"rayseq"`` with Ray Tune (RLlib configs name it; its env runners find it on
    every node). Idempotent."""
    from ray.tune.registry import register_env

    register_env(ENV_NAME, _from_env_config)


if GYM_ID not in gym.registry:
    gym.register(GYM_ID, entry_point="rayseq.envs:make_env")

__all__ = ["ENV_NAME", "GYM_ID", "SeqEnv", "build_task", "make_env", "register", "task_config"]
