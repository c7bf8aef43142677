"""The Hugging Face tests need the hf extra; their tiny model directories are tests/conftest.py's ``hf_dir`` and
``classifier_dir`` (made once per session by tests/hf_fixtures.py; the GPU suite uses them too)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the hf extra: pip install -e .[hf]")
