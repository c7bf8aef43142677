"""What every part of the configuration shares: the error type, the strict section base, key-name helpers."""

from __future__ import annotations

import difflib

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A bad config key or value; the message names the key."""


def blame(key: str, exc: BaseException) -> BaseException:
    """Record on ``exc`` the config key whose value it is about, as ``exc.config_key`` (an attribute, so it survives
    the pickling that carries an actor's exception to the driver): what the start-up report names as the key to
    change. A key recorded already is kept (the code nearest the failure knows best). Returns ``exc``."""
    if getattr(exc, "config_key", None) is None:
        exc.config_key = key
    return exc


class Section(BaseModel):
    """A config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def did_you_mean(key, known, section: str = "") -> str:
    """`` (did you mean algo.eps?)`` for a mistyped key close to a known one, else ""."""
    close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
    return f" (did you mean {section + '.' if section else ''}{close[0]}?)" if close else ""


def rename_aliases(section: dict, aliases: dict[str, str], where: str) -> dict:
    """``section`` with old key names replaced by the current ones (an error if both are given)."""
    if not any(old in section for old in aliases):
        return section
    out = dict(section)
    for old, new in aliases.items():
        if old in out:
            if new in out:
                raise ValueError(f"{where}.{old} is the old name of {where}.{new}; give one of them")
            out[new] = out.pop(old)
    return out
