"""A rayseq task as a token-level Gymnasium environment (:class:`SeqEnv`), and how a task is named for it.

One episode is one reply to one prompt. The observation is the prompt and the reply so far, each as token ids
right-padded with ``<pad>`` to a fixed width, with their lengths; the action is the next token (``Discrete(V)``,
the task's vocabulary); the reward is 0 until the reply ends and then the task's reward of the whole reply,
computed by the task itself (``task.rewards``, the path rayseq's own rollouts are scored by, including a configured
``reward.*``). The reply ends at ``<eos>`` or at ``task.max_tgt_len`` tokens, the cap rayseq's rollouts use; both
are ``terminated``: the task scores the reply there and nothing follows, so an agent must not bootstrap a value
past it (rayseq's own returns do not).

Shapes: S = max(task.max_src_len, 1) prompt width (unconditional tasks: one pad column and length 0),
T = task.max_tgt_len reply width, V = len(task.vocab).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rayseq.config import RewardConfig, RunConfig, TaskConfig, build_config, declared_task_keys


def task_config(
    task: str | dict | TaskConfig | RunConfig, reward: dict | RewardConfig | None = None, **task_keys
) -> tuple[TaskConfig, RewardConfig | None]:
    """(task config, reward config) from a task's name or import path, a ``task:`` mapping, a TaskConfig or a
    RunConfig, with ``task_keys`` (``task.*`` keys, e.g. ``max_len=5`` or ``data=DIR``) over it; validated as a
    run's config is, so a wrong name or key raises a ConfigError naming it."""
    if isinstance(task, RunConfig):
        if reward is None:
            reward = task.reward
        task = task.task
    if isinstance(task, TaskConfig):
        if not task_keys and (reward is None or isinstance(reward, RewardConfig)):
            return task, reward
        task = task_section(task)
    if isinstance(task, str):
        task = {"name": task}
    if not isinstance(task, dict):
        raise TypeError(f"task: expected a name, a task.* mapping, a TaskConfig or a RunConfig, got {task!r}")
    if isinstance(reward, RewardConfig):
        reward = reward.model_dump(exclude_defaults=True)
    data = {"task": {**task, **task_keys}, "algo": {"name": "mle"}}  # mle reads no reward: any task validates
    if reward:
        data["reward"] = dict(reward)
    cfg = build_config(data)
    return cfg.task, (cfg.reward if reward else None)


def task_section(task_cfg: TaskConfig) -> dict:
    """The ``task:`` mapping of a TaskConfig: the keys its task reads (``build_config`` refuses the others)."""
    reads = set(declared_task_keys(task_cfg.name))
    return {k: v for k, v in task_cfg.model_dump().items() if k in reads}


def build_task(task, reward=None, **task_keys):
    """The task object of :func:`task_config`'s arguments (its data prepared first when ``task.prepare`` asks), or
    ``task`` itself when it already is one (an object with ``sample_prompts`` and ``rewards``)."""
    if hasattr(task, "sample_prompts") and hasattr(task, "rewards"):
        if task_keys or reward is not None:
            raise ValueError("task is already built: pass its config (or name) to set task.* or reward.* keys")
        return task
    from rayseq.tasks import prepared_task  # torch: imported when a task is built

    return prepared_task(*task_config(task, reward, **task_keys))


class SeqEnv(gym.Env):
    """One reply of a rayseq task per episode, a token per step (module docstring).

    Observation (a Dict): ``prompt`` (S,) int64 ids, ``prompt_len`` its length, ``prefix`` (T,) int64 the reply so
    far, ``prefix_len`` its length; padding is ``<pad>``. ``reset(seed=...)`` draws the prompt from the task's
    training inputs (``task.sample_prompts``) with the environment's seeded generator. ``info`` carries ``key``
    (the input's id for the task's reward, e.g. chit-chat's reference group; -1 when the task has none) and, on
    the last step, ``score``: the task's sequence score.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, task, render_mode: str | None = None):
        self.task = task
        self.vocab_size = len(task.vocab)
        self.specials = task.specials
        self.max_src_len = max(int(task.max_src_len), 1)
        self.max_tgt_len = int(task.max_tgt_len)
        if self.max_tgt_len < 1:
            raise ValueError(f"task {task.name}: max_tgt_len must be >= 1, got {self.max_tgt_len}")
        V, S, T = self.vocab_size, self.max_src_len, self.max_tgt_len
        self.observation_space = spaces.Dict(
            {
                "prompt": spaces.Box(0, V - 1, (S,), np.int64),
                "prompt_len": spaces.Discrete(int(task.max_src_len) + 1),
                "prefix": spaces.Box(0, V - 1, (T,), np.int64),
                "prefix_len": spaces.Discrete(T + 1),
            }
        )
        self.action_space = spaces.Discrete(V)
        self.render_mode = render_mode
        self._src = np.full((1, S), self.specials.pad, dtype=np.int64)  # (1, S)
        self._src_len = np.zeros(1, dtype=np.int64)  # (1,)
        self._key = None  # (1,) int64 or None
        self._tokens = np.full((1, T), self.specials.pad, dtype=np.int64)  # (1, T) the reply so far
        self._t = 0
        self._done = True

    def _obs(self) -> dict[str, Any]:
        return {
            "prompt": self._src[0].copy(),
            "prompt_len": int(self._src_len[0]),
            "prefix": self._tokens[0].copy(),
            "prefix_len": self._t,
        }

    def _info(self) -> dict[str, Any]:
        return {"key": -1 if self._key is None else int(self._key[0])}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        batch = self.task.sample_prompts(self.np_random, 1)
        src = np.asarray(batch.src, dtype=np.int64)
        self._src = np.full((1, self.max_src_len), self.specials.pad, dtype=np.int64)
        self._src[:, : src.shape[1]] = src
        self._src_len = np.asarray(batch.src_len, dtype=np.int64)
        self._key = None if batch.key is None else np.asarray(batch.key, dtype=np.int64)
        self._tokens[:] = self.specials.pad
        self._t = 0
        self._done = False
        return self._obs(), self._info()

    def step(self, action):
        if self._done:
            raise RuntimeError("the episode has ended: call reset()")
        if not self.action_space.contains(action):
            raise ValueError(f"action must be a token id in [0, {self.vocab_size}), got {action!r}")
        token = int(action)
        self._tokens[0, self._t] = token
        self._t += 1
        ended = token == self.specials.eos or self._t == self.max_tgt_len
        reward, info = 0.0, self._info()
        if ended:
            self._done = True
            mask = (np.arange(self.max_tgt_len) < self._t).astype(np.float32)[None]  # (1, T)
            rewards, score = self.task.rewards(
                self._src[:, : self.task.max_src_len], self._src_len, self._tokens, mask, key=self._key
            )
            reward = float(np.sum(rewards))  # terminal for the built-in tasks: = score; a per-token one: its return
            info["score"] = float(score[0])
        return self._obs(), reward, ended, False, info

    def render(self):
        if self.render_mode != "ansi":
            return None
        words = self.task.vocab.decode
        prompt = " ".join(words(self._src[0, : self._src_len[0]]))
        reply = " ".join(words(self._tokens[0, : self._t], stop_at_eos=False))
        return f"{prompt} -> {reply}"
