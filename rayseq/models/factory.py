"""The models of a run, from its config and its task: the generator (policy) and SeqGAN's discriminator.

The learner, the rollout workers, the scorers and evaluation all build them here, so every copy of a model has
the same shape; serving rebuilds the generator from a checkpoint with :func:`rayseq.models.generator.build_generator`.
"""

from __future__ import annotations

from rayseq.config import RunConfig
from rayseq.models.discriminator import CNNDiscriminator, build_discriminator
from rayseq.models.generator import Seq2SeqGRU, build_generator


def make_generator(cfg: RunConfig, task) -> Seq2SeqGRU:
    """The task's generator (conditional or not, banned ids) from the model config."""
    return build_generator(len(task.vocab), cfg.model, task.specials, conditional=task.conditional,
                           banned_ids=task.banned_ids)


def make_discriminator(cfg: RunConfig, task) -> CNNDiscriminator:
    """SeqGAN's discriminator for the task's vocabulary from the ``disc.*`` config."""
    d = cfg.disc
    return build_discriminator(len(task.vocab), d.emb_dim, d.filter_sizes, d.num_filters, d.dropout,
                               pad_id=task.specials.pad, sep_id=task.specials.bos)
