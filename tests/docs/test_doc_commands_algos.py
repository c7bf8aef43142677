"""The algorithm pages' commands run as written (tests/docs/test_doc_commands.py has the rest and the rules): each
page's training commands with one RL iteration and no pretraining, in one process; the pages on the chitchat data run
in test_doc_commands_chitchat.py."""

from __future__ import annotations

import pytest

from tests.docs.test_doc_commands import ALGO_PAGES, CHITCHAT_PAGES, run_and_check

pytestmark = [pytest.mark.e2e, pytest.mark.ray]


@pytest.mark.parametrize("rel", [rel for rel in ALGO_PAGES if rel not in CHITCHAT_PAGES])
def test_the_algorithm_page_commands_run_as_written(rel, tmp_path):
    run_and_check(rel, tmp_path)
