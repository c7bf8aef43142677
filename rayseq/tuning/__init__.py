"""Tune searches over rayseq runs (``python -m rayseq.tune``): the experiment-file language
(:mod:`rayseq.tuning.spec`), the trial function (:mod:`rayseq.tuning.trainable`) and the results,
plots and export of the best trial (:mod:`rayseq.tuning.results`). The CLI is :mod:`rayseq.tune`.

:mod:`rayseq.tuning.spec` imports neither Ray nor torch, so a bad experiment file fails in a second,
before Ray starts.
"""

from rayseq.tuning.spec import Experiment, SpecError, load_experiment

__all__ = ["Experiment", "SpecError", "load_experiment"]
