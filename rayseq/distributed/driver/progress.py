"""What a run shows on stderr while it runs: a bar (or a plain line) per stage with a few figures of the last
iteration. Which figures is asked, not known: the iterating algorithm's ``progress_metrics`` and the task's headline
validation metric (the first of its ``metric_names``)."""

from __future__ import annotations

import math
import time


def figures(metrics: dict, keys: dict[str, str]) -> dict[str, str]:
    """``{label: value}`` of the ``keys`` (metric name -> label) that ``metrics`` has, finite, to three decimals."""
    return {label: f"{metrics[key]:.3f}" for key, label in keys.items()
            if key in metrics and math.isfinite(metrics[key])}


def progress_keys(algorithm, task_cls, task_cfg) -> dict[str, str]:
    """The figures a stage shows: ``algorithm``'s ``progress_metrics``, the task's own (``progress_metrics``, where it
    has them: an environment's success and turns) and the task's first validation metric (as ``val_<name>``)."""
    keys = {**algorithm.progress_metrics, **getattr(task_cls, "progress_metrics", {})}  # a task's own (episodes')
    names = task_cls.metric_names(task_cfg, "val")
    if names:
        keys[names[0]] = names[0].replace("/", "_")
    return keys


class Progress:
    """What a run shows on stderr while it runs (``progress``): on a terminal a tqdm bar per stage, left on
    screen with its last figures when the next stage starts; elsewhere (``ray job logs``, CI, a file) a plain
    line every ``progress_every`` seconds and one at the end of each stage; nothing with ``progress=false``.
    Before the first stage, a line per step of the start-up (:meth:`note`).
    No rate or time left is shown before a stage's third iteration (its first ones carry start-up costs)."""

    WARMUP = 3  # iterations of a stage before a rate is shown

    def __init__(self, mode: bool | str, every: float = 30.0, stream=None, clock=time.monotonic):
        import sys

        self.stream, self.clock = stream or sys.stderr, clock
        if mode is True:
            mode = "bar" if _terminal_width(self.stream) else "lines"
        self.mode = mode or "off"
        self.every = every
        self._bar = None
        self._open = False

    def start(self, label: str, total: int, done: int) -> None:
        self.close()
        self.label, self.total, self.n, self.first = label, total, done, done
        self.figures: dict = {}
        self.t0 = self.t_last_line = self.clock()
        self.t_warm = None  # when the warm-up iterations were done: rates are measured from there
        self._open = self.mode != "off"
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=done, desc=label, unit="it", dynamic_ncols=True,
                             file=self.stream, bar_format=self._warmup_format)

    _warmup_format = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

    def note(self, text: str) -> None:
        """A line about what the run does between stages (``start-up: reserving 4 bundles``: its actors starting, what
        vLLM's engines took), in either mode; nothing with ``progress=false``. A failure during start-up comes right
        after the line saying which step it was in."""
        if self.mode == "off":
            return
        if self._bar is not None:
            self._bar.write(f"start-up: {text}", file=self.stream)
        else:
            print(f"start-up: {text}", file=self.stream, flush=True)

    def update(self, figures: dict) -> None:
        """One iteration done; ``figures``: the short metrics it produced (kept until replaced)."""
        if not self._open:
            return
        self.n += 1
        self.figures.update(figures)
        now = self.clock()
        if self.n - self.first == self.WARMUP:
            self.t_warm = now
        if self._bar is not None:
            if self.n - self.first == self.WARMUP:
                self._bar.bar_format = None  # tqdm's own, with rate and time left from here on
            self._bar.set_postfix(self.figures, refresh=False)
            self._bar.update(1)
        elif now - self.t_last_line >= self.every:
            self._line(now)

    def close(self) -> None:
        """End of the stage (or of the run): the bar's final redraw, or the stage's last line."""
        if not self._open:
            return
        self._open = False
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.n > self.first:
            self._line(self.clock())

    def _line(self, now: float) -> None:
        self.t_last_line = now
        pct = f" {100 * self.n / self.total:3.0f}%" if self.total else ""
        text = f"{self.label} {self.n}/{self.total}{pct}  elapsed {_clock(now - self.t0)}"
        if self.t_warm is not None and self.n - self.first > self.WARMUP and self.n < self.total:
            rate = (self.n - self.first - self.WARMUP) / max(now - self.t_warm, 1e-9)
            text += f", ~{_clock((self.total - self.n) / rate)} left"
        shown = " ".join(f"{k}={v}" for k, v in self.figures.items())
        print(f"{text}  {shown}".rstrip(), file=self.stream, flush=True)


def _terminal_width(stream) -> int:
    """Columns of the terminal ``stream`` writes to; 0 when it is not one, or one without a size (a pseudo-
    terminal nobody sized, where tqdm draws nothing)."""
    import os

    try:
        size = os.get_terminal_size(stream.fileno()) if stream.isatty() else None
    except (AttributeError, OSError, ValueError):
        return 0
    return size.columns if size and size.lines else 0


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
