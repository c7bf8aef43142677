"""The system Chromium driven by playwright, for the browser tests (the chat page, the documentation site).

Chromium comes from the system (Debian: ``apt-get install chromium``); the ``playwright`` package only drives it
(``playwright install`` is never needed). Without Chromium the tests skip, unless ``RAYSEQ_REQUIRE_BROWSER=1`` (set
by .ci/run), where a missing browser is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def unavailable(reason: str):
    if os.environ.get("RAYSEQ_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason}, and RAYSEQ_REQUIRE_BROWSER=1 makes the browser test mandatory")
    pytest.skip(f"{reason}; install it to run the browser test (RAYSEQ_REQUIRE_BROWSER=1 turns this skip "
                "into a failure)")


@contextlib.contextmanager
def chromium():
    """A headless system Chromium (a playwright Browser), or a skip (a failure under RAYSEQ_REQUIRE_BROWSER=1)."""
    exe = os.environ.get("RAYSEQ_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        unavailable("Chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("the playwright package is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
