"""The documentation's examples as the tests run them: a page's text (README.md or a file under docs/), one of its
sections, its fenced code blocks, and the own-data example's files and commands. Tests read the examples from the
pages themselves, so that what a reader copies is what was run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def page(relpath: str) -> str:
    """README.md or docs/<relpath>, as text."""
    return (ROOT / relpath).read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The body of the section ``heading`` (a whole heading line, e.g. ``"## Resume a run"``) up to the next heading
    of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    body = text.split(heading + "\n", 1)[1]
    stop = re.search(rf"^#{{1,{level}}} ", body, flags=re.M)
    return body[: stop.start()] if stop else body


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def commands(code: str) -> list[list[str]]:
    """The shell commands of a bash block as argument lists: continuation lines joined, comments dropped."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        args = shlex.split(line, comments=True)
        if args:
            out.append(args)
    return out


def listed_files(text: str, heading: str) -> list[str]:
    """The file names the table of section ``heading`` lists: every backticked name in its first column (its header
    row left out)."""
    rows = [line for line in section(text, heading).splitlines() if line.startswith("|")]
    return [name for row in rows[2:] for name in re.findall(r"`([^`]+)`", row.split("|")[1])]


def names_file(name: str, rel: str) -> bool:
    """Whether a listed name stands for the file ``rel`` (a path relative to the listing's folder): ``N`` and
    ``<iteration>`` stand for a checkpoint's 8-digit iteration, and a name ending in ``/`` for every file under it."""
    pattern = re.escape(name.replace("<iteration>", "N")).replace("ckpt_N", r"ckpt_\d{8}")
    return re.fullmatch(pattern + (".+" if name.endswith("/") else ""), rel) is not None


def table_rows(output: str) -> list[str]:
    """The row labels of the figures table a run prints (or a page shows): the first column of the lines between
    its ``---`` rule and the ``run dir:`` line."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---"))
    stop = next(i for i, line in enumerate(lines) if line.startswith("run dir:") and i > start)
    return [re.split(r"\s{2,}", line)[0] for line in lines[start + 1 : stop]]


def own_data_example(root: Path = ROOT) -> dict:
    """docs/guides/own-data.md: its files (``examples/polite/``: ``pairs.jsonl``, whose first lines the page shows,
    and ``my_reward.py``, shown whole) and its two commands as argument lists (``local``: python -m rayseq.train ...;
    ``job``: ray job submit ...), so that the tests run what the guide says."""
    blocks = code_blocks((root / "docs" / "guides" / "own-data.md").read_text(encoding="utf-8"))
    example = root / "examples" / "polite"  # the files the guide shows (the data file's first lines)
    files = {name: (example / name).read_text(encoding="utf-8") for name in ("pairs.jsonl", "my_reward.py")}
    shown = next(b for lang, b in blocks if lang == "json")
    assert files["pairs.jsonl"].startswith(shown), "the guide shows other data than examples/polite/pairs.jsonl"
    assert next(b for lang, b in blocks if lang == "python") == files["my_reward.py"], "the guide's my_reward.py"
    cmds = [c for lang, b in blocks if lang == "bash" for c in commands(b)]
    local = next(c for c in cmds if c[:3] == ["python", "-m", "rayseq.train"])
    job = next(c for c in cmds if c[:3] == ["ray", "job", "submit"])
    return {"files": files, "local": local, "job": job}
