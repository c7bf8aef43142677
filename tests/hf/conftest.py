"""The tiny Hugging Face model directory, made once per test session (tests/hf_fixtures.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the hf extra: pip install -e .[hf]")


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory):
    from tests.conftest import GREETINGS, REPLIES, TOPICS
    from tests.hf_fixtures import make_tiny_hf

    # the test corpus's words too, so that its prompts and replies are a few tokens each
    return make_tiny_hf(tmp_path_factory.mktemp("hf") / "tiny-gpt2",
                        extra_lines=tuple(GREETINGS + REPLIES + TOPICS) * 5)


@pytest.fixture(scope="session")
def classifier_dir(hf_dir, tmp_path_factory):
    from tests.hf_fixtures import make_tiny_classifier

    return make_tiny_classifier(tmp_path_factory.mktemp("hf") / "tiny-classifier", hf_dir)
