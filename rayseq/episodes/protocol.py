"""The environment protocol: what a policy acts in for an episode (``env.name``).

The shape the ecosystem converged on (OpenEnv's ``Environment``, GEM's and skyrl-gym's ``Env``, TRL's
``environment_factory`` classes, Gymnasium's text games)::

    env = Cls(**env.kwargs)
    observation = env.reset(seed, **row)            # the first observation: text, or a list of chat messages
    observation, reward, done, info = env.step(action)
    env.close()                                     # optional

The action is what the policy sampled: an :class:`Action`, a ``str`` (the reply's text, decoded from the sampled
ids) that also carries ``token_ids`` (the ids themselves), so a text environment reads it as a string and a
token-level one reads the ids. An observation is text (one user message), a message ``{"role", "content"}``, or a
list of messages (a system prompt and a user message, a tool's result). ``reward`` is the turn's reward (a float);
``done`` ends the episode; ``info`` may say ``success`` (counted in ``episode/success``; default: the episode's
return is positive) and anything else worth logging. ``step`` may also return a :class:`StepResult` or a dict with
those keys (OpenEnv's and skyrl-gym's shape).

Optional attributes: ``tools`` (callables the chat template describes to the model: rendered into the first prompt
as ``apply_chat_template(tools=...)``; calling them is the environment's business), ``vocabulary`` (the words of its
observations and actions: a policy trained from scratch on ``task.vocabulary=env`` gets one token per word),
``downloads`` (a string saying what it fetches at run time: such an environment is refused, nothing may be downloaded
during a run).

A user's environment is named by import path, ``env.name=package.module:Class`` (a class or a factory function), as
every other plug-in; the built-in names are :data:`rayseq.registry.ENVIRONMENTS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

from rayseq import registry


class Action(str):
    """The policy's action: the reply's text (this string) and ``token_ids``, the ids it sampled (the end token
    left out)."""

    token_ids: tuple[int, ...]

    def __new__(cls, text: str, token_ids=()):
        obj = super().__new__(cls, text)
        obj.token_ids = tuple(int(i) for i in token_ids)
        return obj

    def __reduce__(self):  # pickled to environment actors with its ids
        return Action, (str(self), self.token_ids)


class StepResult(NamedTuple):
    """What one step of an environment gives."""

    observation: Any  # text, a message, or a list of messages; None: nothing (the episode is done)
    reward: float
    done: bool
    info: dict = {}


@runtime_checkable
class Environment(Protocol):
    """A text environment (module docstring)."""

    def reset(self, seed: int, **row) -> Any:
        """Start an episode.

        Args:
            seed: the episode's seed: the G episodes of a GRPO group share it, so they start from the same state.
            **row: the episode's data, when the environment is fed rows (a dataset's columns); none otherwise.

        Returns:
            The first observation: text, a ``{"role", "content"}`` message or a list of them.
        """
        ...

    def step(self, action: Action) -> Any:
        """Act.

        Args:
            action: the policy's reply, a ``str`` with its sampled ``token_ids``.

        Returns:
            ``(observation, reward, done, info)`` (a tuple, a :class:`StepResult` or a dict with those keys).
        """
        ...


def as_step_result(out: Any) -> StepResult:
    """A step's result in the protocol's shape: a 4-tuple, Gymnasium's 5-tuple (observation, reward, terminated,
    truncated, info), a :class:`StepResult`, an object or a dict with ``observation``, ``reward``, ``done``."""
    if isinstance(out, StepResult):
        return out
    if isinstance(out, Mapping):
        obs = out.get("observation", out.get("observations"))
        return StepResult(obs, float(out.get("reward") or 0.0), bool(out.get("done")),
                          dict(out.get("info") or out.get("metadata") or {}))
    if isinstance(out, tuple):
        if len(out) == 5:
            obs, reward, terminated, truncated, info = out
            return StepResult(obs, float(reward or 0.0), bool(terminated or truncated), dict(info or {}))
        if len(out) == 4:
            obs, reward, done, info = out
            return StepResult(obs, float(reward or 0.0), bool(done), dict(info or {}))
    if hasattr(out, "done") and hasattr(out, "reward"):
        return StepResult(getattr(out, "observation", None), float(out.reward or 0.0), bool(out.done),
                          dict(getattr(out, "info", None) or getattr(out, "metadata", None) or {}))
    raise TypeError(f"an environment's step returned {type(out).__name__}; expected (observation, reward, done, info)")


class EnvError(RuntimeError):
    """An environment could not be made or started (its class raised, or it is not an environment): the run stops
    before its first episode, with this message."""


class DownloadRefused(EnvError):
    """An environment would download something at run time (a word list, a hub dataset); nothing may be."""


def environment_factory(name: str):
    """The class (or factory) of ``env.name``: a built-in name (:data:`rayseq.registry.ENVIRONMENTS`) or an import
    path ``package.module:Name``. ValueError naming ``env.name`` when it does not resolve."""
    try:
        return registry.environment_factory(name)
    except ValueError as exc:
        raise ValueError(f"env.name={exc}") from None


def make_environment(name: str, kwargs: Mapping | None = None):
    """A new environment of ``env.name`` with ``env.kwargs``. :class:`EnvError` when its class raises or what it
    makes is no environment; :class:`DownloadRefused` when it says it downloads at run time."""
    factory = environment_factory(name)
    kwargs = dict(kwargs or {})
    try:
        env = factory(**kwargs)
    except Exception as exc:  # noqa: BLE001 (a user's class: its error, said in one line with the key)
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise EnvError(f"env.name={name}: {getattr(factory, '__name__', name)}({args}) raised "
                       f"{type(exc).__name__}: {exc} (env.kwargs are its keyword arguments)") from exc
    downloads = getattr(env, "downloads", None)
    if downloads:
        close_environment(env)
        raise DownloadRefused(f"env.name={name}: {downloads}; nothing is downloaded during a run (bring the files "
                              "with the environment, or choose another)")
    for method in ("reset", "step"):
        if not callable(getattr(env, method, None)):
            raise EnvError(f"env.name={name}: {type(env).__name__} has no {method}() (rayseq/episodes/protocol.py)")
    return env


def close_environment(env) -> None:
    """``env.close()`` when it has one."""
    close = getattr(env, "close", None)
    if callable(close):
        close()


__all__ = ["Action", "DownloadRefused", "EnvError", "Environment", "StepResult", "as_step_result",
           "close_environment", "environment_factory", "make_environment"]
