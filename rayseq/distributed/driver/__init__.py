"""The driver: the run's stages and, around each iteration, evaluation, logs, checkpoints, reports and the progress
line (:mod:`.trainer`); the progress line itself (:mod:`.progress`) and the best evaluation kept (:mod:`.best`)."""

from rayseq.distributed.driver.trainer import Interrupted, Trainer, default_run_dir, run_training

__all__ = ["Interrupted", "Trainer", "default_run_dir", "run_training"]
