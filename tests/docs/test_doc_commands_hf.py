"""The Hugging Face guides' commands run as written (tests/docs/test_doc_commands.py has the rest and the rules):
the HF policies guide's data, tiny models and training runs, the TRL guide's files, run and export."""

from __future__ import annotations

import pytest

from tests.docs.test_doc_commands import HF_PAGES, run_and_check

pytestmark = [pytest.mark.e2e, pytest.mark.ray]


@pytest.mark.parametrize("rel", list(HF_PAGES))
def test_the_hf_page_commands_run_as_written(rel, tmp_path):
    run_and_check(rel, tmp_path)
