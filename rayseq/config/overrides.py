"""The command line's side of the config: ``key=value`` overrides (parsed as YAML scalars), experiment files,
merging them, and ``--print-config``'s listing (every key with its value and its description)."""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from rayseq.config.base import ConfigError


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["algo.eps=0.2", "seed=3"]`` -> nested dict; values parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} has an empty key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{key}: cannot parse value {raw!r}: {exc}") from None
        if isinstance(value, str) and value.lower() in ("inf", "+inf", "-inf"):
            value = float(value)
        elif isinstance(value, str) and value.lower() == "none":  # Python's spelling of YAML's null
            value = None
        set_path(out, key, value)
    return out


def set_path(d: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        nxt = d.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{dotted}: {p} is not a section")
        d = nxt
    d[parts[-1]] = value


def deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_yaml(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict:
    """A config file as a dict. ``base: OTHER.yaml`` (a path relative to the file) makes it an overlay: OTHER is
    loaded first (its own ``base:`` too) and this file's keys are merged into it, section by section (a list or a
    value replaces the base's)."""
    path = Path(path)
    if not path.is_file():
        where = f" (the base: of {_chain[-1]})" if _chain else ""
        raise ConfigError(f"config file not found: {path}{where}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    if "base" not in data:
        return data
    base = data.pop("base")
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{path}: base: is the path of the config file this one extends, got {base!r}")
    chain = (*_chain, path.resolve())
    base_path = (path.parent / base).resolve()
    if base_path in chain:
        raise ConfigError(f"{path}: base: {base} extends itself ({' -> '.join(str(p) for p in (*chain, base_path))})")
    return deep_merge(load_yaml(base_path, chain), data)


def value_range(field) -> str:
    """The bounds a field's value must keep (pydantic's ``ge``, ``gt``, ``le``, ``lt``), as ``≥ 100`` or
    ``≥ 0, < 1``; empty when it has none. What ``--print-config`` and the configuration reference show beside the
    description, so that a refused value's limit is found before it is refused."""
    signs = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    out = []
    for item in getattr(field, "metadata", ()):
        for name, sign in signs.items():
            bound = getattr(item, name, None)
            if isinstance(bound, (int, float)) and not isinstance(bound, bool):
                out.append(f"{sign} {bound:g}" if isinstance(bound, float) else f"{sign} {bound}")
    return ", ".join(out)


def described_yaml(data: dict, cfg: BaseModel, width: int = 118) -> str:
    """``data`` (the config dict of ``cfg``, e.g. :func:`rayseq.config.config_to_dict`) as YAML with every key's
    description as a comment above it (``--print-config``); still a valid ``--config``."""
    out: list[str] = []

    def emit(key: str, value: Any, model: BaseModel, indent: str) -> None:
        field = type(model).model_fields.get(key)
        section = getattr(model, key, None)
        if isinstance(value, dict) and isinstance(section, BaseModel):
            out.extend(["", f"{indent}{key}:"] if not indent else [f"{indent}{key}:"])
            for sub, v in value.items():
                emit(sub, v, section, indent + "  ")
            return
        if field is not None and field.description:
            text = " ".join(field.description.split())
            lines = textwrap.wrap(text, width - len(indent) - 2, initial_indent=f"{indent}# ",
                                  subsequent_indent=f"{indent}# ")
            if bounds := value_range(field):  # kept whole: on the last line where it fits, else a line of its own
                last = f"{lines[-1]} ({bounds})"
                lines[-1:] = [last] if len(last) <= width else [lines[-1], f"{indent}# ({bounds})"]
            out.extend(lines)
        flow = yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True)
        out.append(f"{indent}{key}: {flow.removesuffix(chr(10) + '...' + chr(10)).strip()}")

    for key, value in data.items():
        emit(key, value, cfg, "")
    return "\n".join(out).lstrip("\n") + "\n"
