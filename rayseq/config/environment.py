"""What the installed packages allow, checked when a run is configured: a torchvision that cannot load beside this
torch breaks every import of ``transformers`` (which imports torchvision where it finds one), deep in whichever
process imports it first; the run is refused before it starts instead, with the command that removes it."""

from __future__ import annotations

import functools
import importlib.util

# vLLM's wheels bring torchvision, torchaudio and torchcodec built for another torch; rayseq uses none of them
TORCHVISION_FIX = "pip uninstall -y torchvision torchaudio torchcodec"


@functools.cache
def torchvision_problem() -> str | None:
    """Why the torchvision installed here does not load (the first line of its error, e.g. ``operator
    torchvision::nms does not exist``), or None: none installed, or it loads. Imported once per process, and only
    where one is installed."""
    try:
        if importlib.util.find_spec("torchvision") is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        import torchvision  # noqa: F401
    except Exception as exc:  # RuntimeError (an operator missing), ImportError, OSError (a library missing)
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    return None


def transformers_problem() -> str | None:
    """One line saying why ``transformers`` cannot be imported here and what to do, or None."""
    if problem := torchvision_problem():
        return (f"transformers imports torchvision, and the torchvision installed here does not load beside this "
                f"torch ({problem}); rayseq does not use it: {TORCHVISION_FIX}")
    return None
