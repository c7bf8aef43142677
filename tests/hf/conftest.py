"""The Hugging Face tests need the hf extra; their tiny model directories are tests/conftest.py's ``hf_dir`` and
``classifier_dir`` (made once per session by tests/hf_fixtures.py; the GPU suite uses them too), and ``chat_hf_dir``
here (``hf_dir`` with a chat template)."""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import pytest

import rayseq
from tests.hf_fixtures import with_chat_template

pytest.importorskip("transformers", reason="the hf extra: pip install -e .[hf]")


RAYSEQ_DIR = str(Path(rayseq.__file__).resolve().parent) + "/"
# a Jinja chat template in the shape of ChatML's
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|> {% endif %}")


@pytest.fixture(scope="session")
def chat_hf_dir(hf_dir, tmp_path_factory):
    """The tiny GPT-2 whose tokenizer has a chat template (:data:`CHAT_TEMPLATE`)."""
    return with_chat_template(hf_dir, tmp_path_factory.mktemp("chat") / "tiny-chat", CHAT_TEMPLATE)


def _package(filename: str) -> str | None:
    """The installed package a frame's file belongs to (``transformers``), or None (the standard library)."""
    _, sep, rest = filename.partition("-packages/")
    return rest.split("/", 1)[0] if sep else None


def _called_by_rayseq() -> str | None:
    """``file:line`` of the rayseq frame whose own call warns now, else None. The call is rayseq's when the frames
    between the warning and rayseq's innermost frame belong to one package (the one rayseq called, e.g. a decorator
    of transformers deprecating an argument; torch's nn.Module call plumbing and the standard library aside); a
    warning from one library calling another (peft reading a deprecated transformers attribute) is not."""
    frame, packages = sys._getframe(2), set()
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(RAYSEQ_DIR):
            if len(packages - {"torch"}) > 1:
                return None
            return f"{Path(name).relative_to(Path(RAYSEQ_DIR).parent)}:{frame.f_lineno}"
        if (package := _package(name)) is not None:
            packages.add(package)
        frame = frame.f_back
    return None


@pytest.fixture(autouse=True)
def no_deprecated_calls_from_rayseq():
    """Fail an HF test on a DeprecationWarning or FutureWarning (or a transformers log line saying "deprecated")
    raised by rayseq's own call (:func:`_called_by_rayseq`): a library deprecating what rayseq calls is caught here,
    in CI, before the library removes it (transformers 5.24 warns that `past_key_values=` goes in 5.40). Library
    warnings name the library's own file as their origin, so a `filterwarnings` entry by module cannot see them; the
    hook below sees the stack at the moment of the warning."""
    found: list[str] = []
    previous = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        where = _called_by_rayseq()
        if where and issubclass(category, (DeprecationWarning, FutureWarning)):
            found.append(f"{category.__name__} ({filename}:{lineno}) from {where}: {message}")
        return previous(message, category, filename, lineno, file, line)

    class Deprecations(logging.Handler):
        def emit(self, record):
            where = _called_by_rayseq()
            if where and "deprecat" in record.getMessage().lower():
                found.append(f"log {record.name} from {where}: {record.getMessage()}")

    handler = Deprecations(level=logging.WARNING)
    hf_logger = logging.getLogger("transformers")
    hf_logger.addHandler(handler)
    with warnings.catch_warnings():
        warnings.simplefilter("always", DeprecationWarning)
        warnings.simplefilter("always", FutureWarning)
        warnings.showwarning = showwarning
        try:
            yield found
        finally:
            hf_logger.removeHandler(handler)
    assert not found, "deprecated calls from rayseq:\n" + "\n".join(dict.fromkeys(found))
