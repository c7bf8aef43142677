"""The models of a run, from its config and its task: the generator (policy) and SeqGAN's discriminator.

The learner, the rollout workers, the scorers and evaluation all build them here, so every copy of a model has
the same shape; serving rebuilds the generator from a checkpoint's config the same way. The generator's class is
``model.arch``'s (:data:`rayseq.registry.MODELS`), built by its ``from_config(cfg, task)``.
"""

from __future__ import annotations

import copy

from torch import nn

from rayseq import registry
from rayseq.config import RunConfig
from rayseq.models.discriminator import CNNDiscriminator, build_discriminator


def make_generator(cfg: RunConfig, task) -> nn.Module:
    """The task's generator: ``model.arch``'s class built by its ``from_config(cfg, task)``."""
    return registry.model_class(cfg.model.arch).from_config(cfg, task)


def reference_policy(generator: nn.Module):
    """π_ref of the KL penalty, frozen: the generator's own ``reference_policy()`` when it has one (a LoRA policy:
    itself with the adapters disabled), else a frozen copy."""
    own = getattr(generator, "reference_policy", None)
    return own() if own is not None else copy.deepcopy(generator).eval().requires_grad_(False)


def make_discriminator(cfg: RunConfig, task) -> CNNDiscriminator:
    """SeqGAN's discriminator for the task's vocabulary from the ``disc.*`` config."""
    d = cfg.disc
    return build_discriminator(len(task.vocab), d.emb_dim, d.filter_sizes, d.num_filters, d.dropout,
                               pad_id=task.specials.pad, sep_id=task.specials.bos)
