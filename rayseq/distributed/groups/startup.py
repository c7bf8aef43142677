"""Start-up failures, reported as such: an actor whose constructor raised, a placement the cluster cannot meet.

Ray marks an actor whose constructor raised dead for good, whatever its ``max_restarts`` (a restart would raise the
same way), and every call on it fails with an ``ActorDiedError`` whose ``actor_init_failed`` is set; its first
argument is the creation task's ``RayTaskError``, which carries the exception itself (``cause``) and the address of
the node it ran on. Such a failure is not a crash to recover from (a killed process, a lost node: the actor manager
re-creates those and re-sends their work), so it ends the run at once with :class:`StartupFailed`: one line naming
the actor, its node, the exception's type and message and, where the code that raised knew it, the config key to
change (``exc.config_key``, :func:`rayseq.config.blame`). That holds at the start of a run and for an actor Ray
re-created after a crash whose constructor raises then (its model directory gone from its node, say).
"""

from __future__ import annotations

import re

# the actor groups' kinds (``group.kind``) as a member is named in a report
LABELS = {"worker": "rollout worker", "scorer": "scorer", "learner": "learner rank"}


class StartupFailed(RuntimeError):
    """The run's actors could not start (or one could not start again after a crash); the message is one line.

    Attributes:
        cause: the exception the actor's constructor raised (None: a placement the cluster cannot meet).
        config_key: the config key to change, where the code that raised named one.
    """

    def __init__(self, message: str, *, cause: BaseException | None = None, config_key: str | None = None):
        super().__init__(message)
        self.cause = cause
        self.config_key = config_key


def one_line(text: str, limit: int = 1000) -> str:
    """``text`` with its whitespace runs (newlines among them) as single spaces, cut to ``limit`` characters."""
    text = re.sub(r"\s+", " ", str(text)).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def creation_failure(ray, exc: BaseException) -> tuple[BaseException, str | None] | None:
    """(the exception an actor's constructor raised, or the unpickling of its arguments, the address of the node it
    ran on), if ``exc`` (from a call on the actor) says its creation failed; else None. Where the exception itself did
    not cross (it could not be pickled) the creation task's error stands for it."""
    if not (isinstance(exc, ray.exceptions.RayActorError) and exc.actor_init_failed):
        return None
    task_error = next((a for a in exc.args if isinstance(a, ray.exceptions.RayTaskError)), None)
    if task_error is None:
        return exc, None
    cause = task_error.cause
    if isinstance(cause, ray.exceptions.RaySystemError) and isinstance(cause.client_exc, BaseException):
        cause = cause.client_exc  # raised while its arguments were unpickled (the run's config, checked there)
    usable = cause is not None and type(cause) is not ray.exceptions.RayError
    return (cause if usable else task_error), getattr(task_error, "ip", None)


def describe_error(cause: BaseException) -> str:
    """``ValueError: <its message on one line>``; a creation task's error that stands for an exception that could
    not cross is described by its traceback's last line (``ValueError: ...``)."""
    traceback = getattr(cause, "traceback_str", None)
    if traceback:  # the exception's own lines follow the last frame's (indented) ones
        lines = [line for line in str(traceback).splitlines() if line.strip()]
        last_frame = max((i for i, line in enumerate(lines) if line[:1].isspace()), default=-1)
        if lines:
            return one_line(" ".join(lines[last_frame + 1:]) or lines[-1])
    message = one_line(str(cause))
    return f"{type(cause).__name__}: {message}" if message else type(cause).__name__


def startup_failed(member: str, node: str, cause: BaseException, *, again: bool = False) -> StartupFailed:
    """The :class:`StartupFailed` of ``member`` (``rollout worker 1``) on ``node`` whose constructor raised ``cause``;
    ``again``: Ray had re-created it after a crash."""
    key = getattr(cause, "config_key", None)
    what = "was re-created after a failure and could not start" if again else "could not start"
    line = f"{member} on {node} {what}: {describe_error(cause)}"
    if key:
        line += f" (the key to change: {key})"
    return StartupFailed(line, cause=cause, config_key=key)
