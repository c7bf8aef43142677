"""The docs-commands runner itself (tests/doc_commands.py), on small pages of its own: a command run in the
background is waited for until its URL answers, the next commands run against it, and it is stopped when the page
ends; one that exits first, or never answers, fails its page with the reason."""

from __future__ import annotations

import socket

from tests import doc_commands
from tests.doc_commands import Block, _parse, planned, run_block, stop_background


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def block(code: str, comment: str) -> Block:
    b = Block("page.md", 1, code, declared=True)
    _parse(b, comment)
    return b


def test_a_background_command_is_up_before_the_next_one_and_stopped_after(tmp_path):
    port = free_port()
    server = f"python -m http.server {port} --bind 127.0.0.1"
    b = block(f"{server}\npython -c \"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/')\"\n",
              f"python -m http.server background: http://127.0.0.1:{port}/\ntimeout: 60")
    assert b.background == [(["python", "-m", "http.server"], f"http://127.0.0.1:{port}/")]
    assert [reason for _, reason in planned(b)] == [None, None]  # both run: the first is not skipped
    background = []
    ran = run_block(b, tmp_path, log=lambda _: None, background=background)
    assert [r.returncode for r in ran] == [0, 0] and len(background) == 1
    proc = background[0]
    assert proc.poll() is None  # still serving until the page ends
    text = stop_background(proc)
    assert proc.poll() is not None and '"GET / HTTP/1.1" 200' in text


def test_a_background_command_that_exits_or_never_answers_fails_its_page(tmp_path):
    port = free_port()
    exits = block("python -c 'import sys; sys.exit(3)'\necho never\n",
                  f"python -c background: http://127.0.0.1:{port}/\ntimeout: 30")
    ran = run_block(exits, tmp_path, log=lambda _: None, background=[])
    assert len(ran) == 1 and ran[0].returncode == -1 and "exited with 3" in ran[0].output  # and the next not run
    silent = block("python -c 'import time; time.sleep(60)'\n",
                   f"python -c background: http://127.0.0.1:{port}/\ntimeout: 3")
    background = []
    ran = run_block(silent, tmp_path, log=lambda _: None, background=background)
    assert ran[0].returncode == -1 and "did not answer within 3 s" in ran[0].output and not background


def test_run_page_stops_what_it_started_even_when_a_later_command_fails(tmp_path, monkeypatch):
    port = free_port()
    page = tmp_path / "page.md"
    page.write_text(f"<!-- docs-test\npython -m http.server background: http://127.0.0.1:{port}/\ntimeout: 60\n-->\n"
                    f"```bash\npython -m http.server {port} --bind 127.0.0.1\n"
                    "python -c 'import sys; sys.exit(5)'\n```\n")
    monkeypatch.setattr(doc_commands, "ROOT", tmp_path)
    monkeypatch.setattr(doc_commands, "scratch_clone", lambda where: where.mkdir(parents=True, exist_ok=True))
    started = []
    real_start = doc_commands.start_background
    monkeypatch.setattr(doc_commands, "start_background",
                        lambda *a, **k: started.append(real_start(*a, **k)) or started[-1])
    ran = doc_commands.run_page("page.md", tmp_path / "clone", log=lambda _: None)
    assert [r.returncode for r in ran] == [0, 5]
    assert started and started[0][0].poll() is not None  # the server was stopped by the page's end
