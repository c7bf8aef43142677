"""The chat page (rayseq/serving/static/index.html) working in headless Chromium against a real Serve.

Chromium comes from the system (tests/browser.py: never ``playwright install``); without it the tests skip, unless
``RAYSEQ_REQUIRE_BROWSER=1`` (set by .ci/run), where a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil

import httpx
import pytest

from tests.browser import chromium
from tests.serving_helpers import start_serve, train_counting_checkpoint

pytestmark = pytest.mark.ray

DIGITS = set("0123456789")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def browser():
    """Headless system Chromium driven by playwright; resolved before the server is built, so that a
    skip costs nothing."""
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    from ray import serve

    # Asked for here, not as an argument: pytest sets session fixtures up before module ones, and Ray
    # must not start for a test that then skips for want of a browser.
    request.getfixturevalue("ray_session")
    checkpoint = str(train_counting_checkpoint(tmp_path_factory.mktemp("browser") / "run"))
    url = start_serve({"/": {"checkpoint": checkpoint},
                       "/unbatched": {"checkpoint": checkpoint, "batching": False}})
    model_id = httpx.get(f"{url}/healthz").json()["model"]
    yield url, model_id
    serve.shutdown()  # Serve is cluster-scoped: the next Ray test module must not find it


def _wait_for_header(page) -> str:
    page.wait_for_function("document.getElementById('model').textContent !== 'connecting…'", timeout=15_000)
    return page.text_content("#model")


def _send(page, message: str) -> None:
    page.fill("#message", message)
    page.click("#send")


def test_chat_page_in_chromium(browser, server, tmp_path):
    url, model_id = server
    page = browser.new_page(viewport={"width": 900, "height": 640})
    failed, page_errors = [], []
    page.on("response", lambda r: failed.append((r.status, r.url)) if r.status >= 400 else None)
    page.on("pageerror", lambda e: page_errors.append(str(e)))  # uncaught JavaScript exceptions
    page.goto(url + "/")
    assert page.title() == "rayseq chat"
    assert _wait_for_header(page) == f"{model_id} · batched"
    # the task is explained so that a visitor can judge the replies
    about = page.text_content("#about")
    assert about == httpx.get(f"{url}/healthz").json()["about"] and "correct" in about and page.is_visible("#about")
    assert page.get_attribute("#message", "placeholder") == "Digits, e.g. 9 2 3"

    # a message and its reply: the user's bubble, then the bot's, made of digit tokens
    _send(page, "9 2 3")
    page.wait_for_selector(".msg.bot", timeout=15_000)
    assert page.text_content(".msg.user") == "9 2 3"
    reply = page.eval_on_selector(".msg.bot", "el => el.firstChild.textContent")  # the text, not the meta line
    assert reply.split() and set(reply.split()) <= DIGITS, reply
    assert reply == httpx.post(f"{url}/v1/chat", json={"message": "9 2 3"}).json()["reply"]  # greedy either way
    assert " tokens · " in page.text_content(".msg.bot .meta")
    assert page.input_value("#message") == "" and page.is_enabled("#send")

    # temperature 9: the number field's max=2 stops the form in the browser, no request is sent ...
    page.fill("#temperature", "9")
    _send(page, "1 2")
    assert page.eval_on_selector("#temperature", "el => el.validity.rangeOverflow")
    page.wait_for_timeout(300)
    assert page.locator(".msg.user").count() == 1 and page.locator(".msg.error").count() == 0

    # ... and a client that skips that check gets the server's 422 message shown as an error
    page.eval_on_selector("#form", "form => { form.noValidate = true; }")
    _send(page, "1 2")
    page.wait_for_selector(".msg.error", timeout=15_000)
    server_message = httpx.post(f"{url}/v1/chat", json={"message": "1 2", "temperature": 9.0}).json()
    expected = f"Error 422: {server_message['error']['message']}"
    assert page.text_content(".msg.error") == expected
    assert "temperature" in expected

    # the page keeps working after the error
    page.fill("#temperature", "0")
    _send(page, "4 4")
    page.wait_for_function("document.querySelectorAll('.msg.bot').length === 2", timeout=15_000)
    assert page_errors == []
    # the one failed request is the 422 (besides the favicon the page does not have)
    assert [f for f in failed if not f[1].endswith("/favicon.ico")] == [(422, f"{url}/v1/chat")], failed

    shot = tmp_path / "chat.png"
    page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5_000
    if os.environ.get("RAYSEQ_SCREENSHOT_DIR"):  # to look at it: RAYSEQ_SCREENSHOT_DIR=/tmp pytest ...
        shutil.copy(shot, os.environ["RAYSEQ_SCREENSHOT_DIR"])
    page.close()


def test_chat_page_under_a_route_prefix_talks_to_its_own_app(browser, server):
    url, model_id = server
    page = browser.new_page()
    fetched = []
    page.on("request", lambda r: fetched.append(r.url) if r.resource_type == "fetch" else None)
    page.goto(url + "/unbatched/")
    header = _wait_for_header(page)
    _send(page, "9 2 3")
    page.wait_for_selector(".msg.bot, .msg.error", timeout=15_000)
    page.close()
    assert fetched and all(u.startswith(f"{url}/unbatched/") for u in fetched), fetched
    assert header == model_id  # this app decodes unbatched: no " · batched"
