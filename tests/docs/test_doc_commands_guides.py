"""The README's and the short guides' commands run as written (tests/docs/test_doc_commands.py has the rest and the
rules): the README's training commands, your own data with its reward, the environments and the Transformer policy,
each with the budget its blocks declare."""

from __future__ import annotations

import pytest

from tests.docs.test_doc_commands import GUIDE_PAGES, run_and_check

pytestmark = [pytest.mark.e2e, pytest.mark.ray]


@pytest.mark.parametrize("rel", list(GUIDE_PAGES))
def test_the_guide_page_commands_run_as_written(rel, tmp_path):
    run_and_check(rel, tmp_path)
