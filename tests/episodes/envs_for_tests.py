"""Environments the episode tests name by import path (``env.name=tests.episodes.envs_for_tests:Class``)."""

from __future__ import annotations

import time


class Echo:
    """A user's environment: says a word, rewards 1 when the reply repeats it; three turns."""

    vocabulary = ["say", "red", "green", "blue", "yes", "no"]
    WORDS = ("red", "green", "blue")

    def reset(self, seed, **row):
        self.seed, self.t = int(seed), 0
        self.word = self.WORDS[self.seed % 3]
        return f"say {self.word}"

    def step(self, action):
        self.t += 1
        reward = 1.0 if action.strip() == self.word else 0.0
        self.word = self.WORDS[(self.seed + self.t) % 3]
        return f"say {self.word}", reward, self.t >= 3, {"hit": reward}


class Faulty(Echo):
    """Echo whose odd seeds raise on the second step, and whose seeds 2 mod 4 hang there (for the timeout)."""

    def step(self, action):
        if self.t == 1 and self.seed % 2 == 1:
            raise RuntimeError("the environment broke")
        if self.t == 1 and self.seed % 4 == 2:
            time.sleep(3.0)
        return super().step(action)


class Unbuildable(Echo):
    """An environment whose class raises when made (a missing file, a bad keyword)."""

    def __init__(self, path: str = "missing.txt"):
        raise FileNotFoundError(f"no such file: {path}")


class NoStart(Echo):
    """An environment whose reset raises."""

    def reset(self, seed, **row):
        raise KeyError("level")


NOT_AN_ENV = 3  # env.name pointing at something that is no environment


class Scored(Echo):
    """Echo whose every turn has a reward of its own (the hit plus turn/10), and that keeps what it said, heard and
    gave: the exact-token test checks each against the trained rollout."""

    def reset(self, seed, **row):
        self.said, self.heard, self.gave = [], [], []
        first = super().reset(seed, **row)
        self.said.append(first)
        return first

    def step(self, action):
        self.heard.append(action)
        obs, reward, done, info = super().step(action)
        reward += self.t / 10
        self.gave.append(reward)
        self.said.append(obs)
        return obs, reward, done, info


class TRLCounter:
    """A class written for TRL's ``GRPOTrainer(environment_factory=...)``: ``reset(**row)`` reads the row's target
    and says it; the policy calls ``add`` to move a counter; ``get_reward`` is 1 when the counter reached the target.
    ``_hidden`` is private and ``total`` a property: neither is a tool."""

    def __init__(self):
        self.count = 0

    def reset(self, **kwargs) -> str:
        self.target = int(kwargs.get("target", 3))
        self.count = 0
        return f" Reach {self.target}."

    def add(self, n: int) -> str:
        """Add n to the counter.

        Args:
            n: how much to add.
        """
        if n > 5:
            raise ValueError("at most 5 at a time")
        self.count += int(n)
        return f"counter: {self.count}"

    def get_reward(self) -> float:
        return 1.0 if self.count == self.target else 0.0

    def _hidden(self):
        return "private"

    @property
    def total(self):
        raise AssertionError("a property is never evaluated for the tools")


class TRLNoReset:
    """Not a TRL environment: no reset."""

    def add(self, n: int) -> int:
        return n


class TRLCounterNoText(TRLCounter):
    """A TRL environment whose reset says nothing: its prompt must come from the row."""

    def reset(self, **kwargs):
        super().reset(**kwargs)


class Logged(Echo):
    """Echo that appends ``<pid> <seed>`` to the file ``log`` at each reset: which process played which episode."""

    def __init__(self, log: str):
        self.log = log

    def reset(self, seed, **row):
        import os

        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {int(seed)}\n")
        return super().reset(seed, **row)
