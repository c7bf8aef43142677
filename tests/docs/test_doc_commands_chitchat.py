"""The algorithm pages on the chitchat data, their commands run as written (tests/docs/test_doc_commands.py has the
rules): each prepares the word-level corpus, then trains with one RL iteration and no pretraining, in one process."""

from __future__ import annotations

import pytest

from tests.docs.test_doc_commands import CHITCHAT_PAGES, run_and_check

pytestmark = [pytest.mark.e2e, pytest.mark.ray]


@pytest.mark.parametrize("rel", CHITCHAT_PAGES)
def test_the_chitchat_algorithm_page_commands_run_as_written(rel, tmp_path):
    run_and_check(rel, tmp_path)
