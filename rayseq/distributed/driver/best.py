"""``train.best_metric``: a run keeps its algorithm stage's best validated evaluation in ``run_dir/best`` (a run
folder of one checkpoint and best.json, which serving, export and ``train.init_from`` read).

The candidates are the start of the algorithm stage (the pretrained model, as scored before it) and every
evaluation; they are chosen on ``val/*`` figures only (``test/*`` is refused by the config), and with
``train.best_keep_start`` only among evaluations that keep those validation figures at least at the start's. When
nothing beats the start, ``run_dir/best`` is the start. At the end the learner computes the best's test figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rayseq.checkpoint import list_checkpoints
from rayseq.config import ConfigError
from rayseq.runlog import to_json
from rayseq.storage import RunStore

BEST_DIR = "best"  # run_dir/best: the best evaluation's checkpoint and best.json


def check_best_keys(figures: dict, train, *, keep_only: bool = False, whose: str = "this task's") -> None:
    """A ConfigError naming the first of ``train.best_metric`` and ``train.best_keep_start`` (only the latter with
    ``keep_only``) that ``figures`` lacks, and the validation figures it has."""
    for key in [*([] if keep_only else [train.best_metric]), *train.best_keep_start]:
        if key not in figures:
            have = ", ".join(sorted(k for k in figures if k.startswith("val/"))) or "none"
            raise ConfigError(f"train.best_metric / train.best_keep_start: {key} is not among {whose} validation "
                              f"figures ({have})")


def is_best(ev: dict, best: dict | None, start: dict, train) -> bool:
    """Whether the evaluation ``ev`` (val/* figures) is the new best: ``train.best_metric`` better than ``best``'s
    value (``train.best_mode``; the first qualifying evaluation always is) and each of ``train.best_keep_start`` at
    least its value in ``start`` (the pretrained model's figures). A metric the evaluation lacks is a ConfigError."""
    check_best_keys(ev, train)
    check_best_keys(start, train, keep_only=True, whose="the start's")
    if any(ev[k] < start[k] for k in train.best_keep_start):
        return False
    value = ev[train.best_metric]
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value > best["value"] if train.best_mode == "max" else value < best["value"]


class BestKeeper:
    """The best evaluation so far (``best``: its iteration, value and validation figures; the driver checkpoints it)
    and its checkpoint in ``run_dir/best``.

    Args:
        train: the run's ``train:`` section (``best_metric``, ``best_mode``, ``best_keep_start``).
        store: the run directory.
    """

    def __init__(self, train, store: RunStore):
        self.train = train
        self.store = store
        self.best: dict | None = None

    def start(self, start_figures: dict, iteration: int, write: Callable[[RunStore], str]) -> None:
        """The start of the algorithm stage (``start_figures``: the pretrained model's) is the first candidate, so an
        evaluation is the best only if it beats the start; when none does, ``run_dir/best`` is the start."""
        start = {k: v for k, v in start_figures.items() if k.startswith("val/")}
        value = start.get(self.train.best_metric)
        if value is not None and not math.isnan(value):
            self._keep(start, iteration, write)

    def consider(self, ev: dict, start_figures: dict, iteration: int, write: Callable[[RunStore], str]) -> None:
        """When the evaluation ``ev`` beats the best so far (the start included) and keeps ``train.best_keep_start``
        at the start's values, the learner's state now goes to ``run_dir/best`` (``write(store)``: the checkpoint
        written into a run directory, the only one kept there)."""
        if is_best(ev, self.best, start_figures, self.train):
            self._keep(ev, iteration, write)

    def _keep(self, ev: dict, iteration: int, write: Callable[[RunStore], str]) -> None:
        key = self.train.best_metric
        self.best = {"iteration": iteration, "value": ev[key], "val": dict(ev)}
        write(RunStore(self.store.display(BEST_DIR)))
        self.store.write_text(f"{BEST_DIR}/best.json", to_json({**self.best, "metric": key}))

    def summary(self, iteration: int, final_test: tuple[dict, dict], learner,
                evaluate: Callable[[str], tuple[dict, dict]] | None = None) -> dict | None:
        """summary.json's ``best``: the best evaluation's iteration, checkpoint and figures, its test figures computed
        now on the best weights, loaded into ``learner`` (the learner group), by ``evaluate(split)`` (the driver's
        evaluation: the rollout workers decode; None: the learner's own), unless they are the final ones (the run's
        last act: the learner's state is not saved again). None without a best."""
        if self.best is None:
            return None
        path = list_checkpoints(RunStore(self.store.display(BEST_DIR)))[-1]
        if self.best["iteration"] == iteration:
            test, details = final_test
        else:
            learner.restore(path)
            test, details = (evaluate or learner.evaluate)("test")
        best = {"iteration": self.best["iteration"], "metric": self.train.best_metric, "value": self.best["value"],
                "checkpoint": path, "metrics": {**self.best["val"], **test}}
        self.store.write_text(f"{BEST_DIR}/best.json", to_json(best))
        return {**best, "details": details}
