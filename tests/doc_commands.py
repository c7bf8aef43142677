"""The documentation's shell commands as a test runs them: every ``bash`` block of a page carries, in an HTML comment
right above it (invisible on the site and on GitHub), how it is tested, and :func:`run_page` runs the page's blocks in
order, in a scratch folder that looks like a clone of the repository, as a reader would type them.

The comment's lines (``<!-- docs-test`` ... ``-->``, or one line ``<!-- docs-test: LINE -->``)::

    python -m rayseq.train += train.iters=2 task.test_size=100     # appended to each command that starts so
    python -m rayseq.serve skip: a server (tests/serving run one)     # such commands are not run, for this reason
    * skip: installs packages (.ci/run does)                          # no command of the block is run
    timeout: 300                                                      # seconds per command (default 600)
    python -m rayseq.serve background: http://127.0.0.1:8000/healthz  # started, not waited for: the next commands
                                                                      # run once the URL answers 200; it is stopped
                                                                      # (SIGINT, as Ctrl-C) when the page ends
    as written                                                        # run as it is (a block already small)
    save as math_rewards.py                                           # (a block of another language) a file the
                                                                      # page shows whole, written for the commands

A prefix is matched against the command's words (``python -m rayseq.train`` matches ``python -m rayseq.train --config
X``); ``*`` matches every command; a line ``A && B`` is two commands, each matched on its own. Every command that is
not skipped must exit with status 0. ``python`` is the interpreter running the tests, and ``$PWD`` the scratch folder;
the repository's code is imported from the checkout the tests run in.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.doc_examples import ROOT

MARKER = re.compile(r"<!--\s*docs-test(?::\s*(?P<one>.*?)\s*-->|\s*\n(?P<body>.*?)-->)", re.S)
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
DEFAULT_TIMEOUT = 600


@dataclass
class Block:
    """A ``bash`` block of a page and how it is tested."""

    page: str
    line: int  # of its opening fence, 1-based
    code: str
    append: list[tuple[list[str], list[str]]] = field(default_factory=list)  # (prefix words, args appended)
    skip: list[tuple[list[str], str]] = field(default_factory=list)  # (prefix words, reason)
    background: list[tuple[list[str], str]] = field(default_factory=list)  # (prefix words, URL that says it is up)
    timeout: int = DEFAULT_TIMEOUT
    declared: bool = False  # a docs-test comment is right above it
    language: str = "bash"
    save_as: str | None = None  # a block of another language: the file it is, written before the next commands

    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _parse(block: Block, text: str) -> None:
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line == "as written":
            continue
        if m := re.fullmatch(r"save as\s+(\S+)", line):
            block.save_as = m.group(1)
        elif m := re.fullmatch(r"timeout:\s*(\d+)", line):
            block.timeout = int(m.group(1))
        elif m := re.fullmatch(r"(.+?)\s+\+=\s+(.+)", line):
            block.append.append((_prefix(m.group(1)), shlex.split(m.group(2))))
        elif m := re.fullmatch(r"(.+?)\s+background:\s*(https?://\S+)", line):
            block.background.append((_prefix(m.group(1)), m.group(2)))
        elif m := re.fullmatch(r"(.+?)\s+skip:\s*(.+)", line):
            block.skip.append((_prefix(m.group(1)), m.group(2)))
        else:
            raise ValueError(f"{block.where()}: a docs-test line that says nothing known: {line!r}")


def _prefix(text: str) -> list[str]:
    return [] if text.strip() == "*" else shlex.split(text)


def bash_blocks(relpath: str) -> list[Block]:
    """The ``bash`` blocks of README.md or docs/<relpath>, each with the docs-test comment right above it."""
    return [b for b in page_blocks(relpath) if b.language == "bash"]


def page_blocks(relpath: str) -> list[Block]:
    """Every fenced block of README.md or docs/<relpath>, each with the docs-test comment right above it."""
    text = (ROOT / relpath).read_text(encoding="utf-8")
    out = []
    for m in BLOCK.finditer(text):
        block = Block(relpath, text.count("\n", 0, m.start()) + 1, m.group(2), language=m.group(1))
        before = text[: m.start()].rstrip()
        marker = ([None, *MARKER.finditer(before)])[-1]  # the last comment above it, if it ends right there
        if marker is not None and marker.end() == len(before):
            block.declared = True
            _parse(block, marker.group("one") if marker.group("one") is not None else marker.group("body"))
        out.append(block)
    return out


def command_lines(code: str) -> list[list[str]]:
    """A block's commands as argument lists: continuation lines joined, comments dropped, and a line ``A && B`` two
    commands (the second runs when the first exits with 0, as in a shell; each declared on its own)."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        args = shlex.split(line, comments=True)
        while "&&" in args:
            out.append(args[: args.index("&&")])
            args = args[args.index("&&") + 1:]
        if args:
            out.append(args)
    return [args for args in out if args]


def _starts(args: list[str], prefix: list[str]) -> bool:
    return args[: len(prefix)] == prefix


def planned(block: Block) -> list[tuple[list[str], str | None]]:
    """(the command as it is run, or as written when skipped; the reason it is skipped or None) per command."""
    out = []
    for args in command_lines(block.code):
        reason = next((r for p, r in block.skip if _starts(args, p)), None)
        if reason is None:
            for prefix, extra in block.append:
                if _starts(args, prefix):
                    args = [*args, *extra]
        out.append((args, reason))
    return out


def scratch_clone(where: Path) -> Path:
    """A folder whose entries are links to the repository's tracked top-level files and folders: a command that
    reads ``tune_configs/...`` or ``examples/...`` finds them, and what it writes (``runs/``, ``data/``, ``models/``)
    stays in the folder."""
    where.mkdir(parents=True, exist_ok=True)
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for top in sorted({line.split("/", 1)[0] for line in tracked.splitlines() if line}):
        if (ROOT / top).exists() and not (where / top).exists():
            (where / top).symlink_to(ROOT / top)
    return where


@dataclass
class Ran:
    block: Block
    args: list[str]
    returncode: int
    output: str
    seconds: float


def background_url(block: Block, args: list[str]) -> str | None:
    """The URL that says ``args`` is up, when the block runs that command in the background."""
    return next((url for prefix, url in block.background if _starts(args, prefix)), None)


def _answers(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_background(argv: list[str], url: str, cwd: Path, env: dict, timeout: float) -> tuple[subprocess.Popen, str]:
    """Start ``argv`` in a session of its own, its output to a file; wait until ``url`` answers 200. Returns the
    process and "" when it is up, else why not (it exited, or the time ran out)."""
    import tempfile

    out = tempfile.TemporaryFile("w+")  # noqa: SIM115 (read and closed by stop_background)
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = out
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc, f"exited with {proc.returncode} before {url} answered"
        if _answers(url):
            return proc, ""
        time.sleep(1)
    return proc, f"{url} did not answer within {timeout:.0f} s"


def stop_background(proc: subprocess.Popen, grace: float = 60) -> str:
    """Stop a background command as Ctrl-C does (SIGINT to its session), then harder; its output."""
    import signal

    for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    proc.log.seek(0)
    text = proc.log.read()
    proc.log.close()
    return text


def run_block(block: Block, cwd: Path, log=print, background: list | None = None) -> list[Ran]:
    """Run a block's commands (those not skipped) in ``cwd``, in order; stops at the first that fails. A command the
    block runs in the background is appended to ``background`` once it is up (the caller stops it)."""
    env = {**os.environ, "PWD": str(cwd), "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    out = []
    for args, reason in planned(block):
        shown = shlex.join(args)
        if reason is not None:
            log(f"{block.where()}: skipped ({reason}): {shown}")
            continue
        if any(a in ("&&", "||", "|", ";") for a in args):
            raise ValueError(f"{block.where()}: one command a line in a block that is run: {shown}")
        argv = [os.path.expandvars(a.replace("$PWD", str(cwd))) for a in args]
        if argv[0] == "python":
            argv[0] = sys.executable
        t0 = time.perf_counter()
        if url := background_url(block, args):
            proc, why = start_background(argv, url, cwd, env, block.timeout)
            if why:
                ran = Ran(block, args, -1, stop_background(proc, grace=10) + f"\n({why})", time.perf_counter() - t0)
            else:
                ran = Ran(block, args, 0, f"(up: {url})", time.perf_counter() - t0)
                if background is not None:
                    background.append(proc)
            log(f"{block.where()}: {'up' if not why else why} in {ran.seconds:.1f} s: {shown}")
            out.append(ran)
            if ran.returncode != 0:
                break
            continue
        try:
            r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=block.timeout)
            ran = Ran(block, args, r.returncode, r.stdout + r.stderr, time.perf_counter() - t0)
        except subprocess.TimeoutExpired as e:
            text = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
            ran = Ran(block, args, -1, text + f"\n(timed out after {block.timeout} s)", time.perf_counter() - t0)
        log(f"{block.where()}: rc {ran.returncode} in {ran.seconds:.1f} s: {shown}")
        out.append(ran)
        if ran.returncode != 0:
            break
    return out


def run_page(relpath: str, cwd: Path, log=print) -> list[Ran]:
    """Every bash block of a page, in order, in one scratch clone (a later block uses what an earlier one made); a
    block that says ``save as FILE`` is written to FILE there when the page reaches it."""
    scratch_clone(cwd)
    out, background = [], []
    try:
        for block in page_blocks(relpath):
            if block.save_as:
                if (cwd / block.save_as).is_symlink():
                    raise ValueError(f"{block.where()}: save as {block.save_as}: a file of the repository")
                (cwd / block.save_as).write_text(block.code, encoding="utf-8")
                log(f"{block.where()}: saved as {block.save_as}")
                continue
            if block.language != "bash":
                continue
            ran = run_block(block, cwd, log, background)
            out += ran
            if ran and ran[-1].returncode != 0:
                break
    finally:
        for proc in background:
            text = stop_background(proc)
            log(f"stopped a background command (exit {proc.returncode}); its last lines:\n{text[-1500:]}")
    return out
