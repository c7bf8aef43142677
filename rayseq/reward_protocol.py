"""The two ways a reward function may be written, told apart by its signature.

rayseq's positional protocol (:mod:`rayseq.rewards.library`)::

    f(prompts, replies, references, **kwargs) -> B floats

Hugging Face TRL's keyword protocol (``GRPOTrainer``'s ``reward_funcs``, unchanged: a function written for TRL runs
here as it is)::

    f(prompts=..., completions=..., completion_ids=..., **columns) -> B floats (or None)

``prompts`` are the dataset's prompts as written (a string, or a list of ``{role, content}`` messages for a
conversational dataset), ``completions`` the generated replies (a string, or ``[{"role": "assistant", "content":
text}]`` when the prompt is conversational, as TRL gives them), ``completion_ids`` each reply's token ids (its end
token left out), and every other column of the dataset arrives as a keyword, a list aligned with the completions.
A function is called with the keywords it takes: all of them when it has ``**kwargs``, else those it names.

What either protocol may return (checked in :mod:`rayseq.rewards.reward`): one value per reply; ``None`` means
"not judged" (TRL's convention: the reply is left out of that term's mean and the term adds nothing to its
reward); an ``async def`` function is awaited.

A function is on TRL's protocol when it names ``completions`` or ``completion_ids``, or takes ``**kwargs`` without
naming ``replies`` or ``references``; otherwise it is positional.

Foundation layer (the registry checks signatures with it): the standard library only; never Ray.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Sequence
from typing import Protocol


class RewardFunction(Protocol):
    """rayseq's positional protocol (TRL's keyword one is the module docstring's second form)."""

    def __call__(self, prompts: Sequence[str], replies: Sequence[str], references: Sequence[Sequence[str]],
                 **kwargs) -> Sequence[float | None]:
        """Score a batch of replies.

        Args:
            prompts: the inputs, as text.
            replies: the generated replies, as text (one per prompt).
            references: each input's reference replies (empty for a task without references).
            **kwargs: the reward's configured keyword arguments (``reward.kwargs``, a term's ``kwargs``).

        Returns:
            One float per reply; ``None`` for a reply it does not judge (left out of that term's mean).
        """


POSITIONAL_ARGS = ("prompts", "replies", "references")  # rayseq's protocol, in this order
KEYWORD_ARGS = ("prompts", "completions", "completion_ids")  # TRL's protocol: what rayseq passes besides columns
TRL_ONLY = ("trainer_state", "log_extra", "log_metric")  # TRL passes these; rayseq has no TRL trainer to pass


def _signature(fn) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature
        return None


def is_keyword(fn) -> bool:
    """Whether ``fn`` is written to TRL's keyword protocol (module docstring)."""
    sig = _signature(fn)
    if sig is None:
        return False
    names = set(sig.parameters)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    return bool(names & {"completions", "completion_ids"}) or (var_kw and not names & {"replies", "references"})


def required_columns(fn, kwargs: dict | None = None) -> list[str]:
    """The dataset columns a keyword-protocol ``fn`` needs: its parameters without a default that rayseq does not
    pass itself (``prompts``, ``completions``, ``completion_ids``) nor the term's ``kwargs`` give."""
    sig = _signature(fn)
    if sig is None:
        return []
    given = set(KEYWORD_ARGS) | set(kwargs or {})
    return [n for n, p in sig.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty and n not in given]


def accepted(fn, names) -> list[str]:
    """Which of ``names`` ``fn`` takes as keywords: all of them with ``**kwargs``, else those it names."""
    sig = _signature(fn)
    if sig is None:
        return list(names)
    params = sig.parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return list(names)
    return [n for n in names if n in params and params[n].kind in (params[n].POSITIONAL_OR_KEYWORD,
                                                                   params[n].KEYWORD_ONLY)]


def check_keyword(fn, kwargs: dict | None = None) -> None:
    """TypeError when ``fn`` cannot be called as ``fn(prompts=, completions=, completion_ids=, **kwargs,
    **columns)`` (the columns it needs are checked against the dataset at the first batch)."""
    sig = _signature(fn)
    if sig is None:
        return
    bound = {n: None for n in accepted(fn, KEYWORD_ARGS)}
    sig.bind_partial(**bound, **(kwargs or {}))
    positional_only = [n for n, p in sig.parameters.items() if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional_only:
        raise TypeError(f"positional-only parameter {positional_only[0]!r} (TRL passes everything by keyword)")


def resolve(out):
    """``out``, awaited when it is awaitable (an ``async def`` reward function): in this thread when no event loop
    runs here, else on a thread of its own (an async actor's loop must not be blocked by run_until_complete)."""
    if not inspect.isawaitable(out):
        return out

    async def wait():
        return await out

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wait()).result()
