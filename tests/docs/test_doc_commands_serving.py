"""The serving guides' commands run as written (tests/docs/test_doc_commands.py has the rules): a run trained and
served, then asked with curl and with the OpenAI client; a small Tune search and its best trial served. Each server
runs in the background until the page ends (tests/doc_commands.py)."""

from __future__ import annotations

import pytest

from tests.docs.test_doc_commands import SERVING_PAGES, run_and_check

pytestmark = [pytest.mark.e2e, pytest.mark.ray]


@pytest.mark.parametrize("rel", list(SERVING_PAGES))
def test_the_serving_page_commands_run_as_written(rel, tmp_path):
    run_and_check(rel, tmp_path)
