"""The models of a run, from its config and its task: the generator (policy) and SeqGAN's discriminator.

The learner, the rollout workers, the scorers and evaluation all build them here, so every copy of a model has
the same shape. The generator's class is ``model.arch`` looked up in :data:`rayseq.registry.MODELS` (or a user's
``package.module:Class``), built by its ``from_config(cfg, task)``; what such a class provides (the policy protocol:
methods and shapes) is written down once, in :mod:`rayseq.models.protocol`. Serving rebuilds the generator from a
checkpoint the same way (:func:`generator_from_parts`).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

from torch import nn

from rayseq import registry
from rayseq.config import ModelConfig, RunConfig
from rayseq.models.discriminator import CNNDiscriminator, build_discriminator


def make_generator(cfg: RunConfig, task) -> nn.Module:
    """The task's generator (conditional or not, banned ids) of architecture ``cfg.model.arch``."""
    return registry.model_class(cfg.model.arch).from_config(cfg, task)


def generator_from_parts(model_cfg: ModelConfig, vocab, specials, *, conditional: bool = True,
                         banned_ids: tuple[int, ...] = ()) -> nn.Module:
    """The generator of ``model_cfg.arch`` without a task or a full run config (serving a checkpoint): ``from_config``
    gets a config with only ``model`` and a task with only ``vocab``, ``specials``, ``conditional``, ``banned_ids``."""
    task = SimpleNamespace(vocab=vocab, specials=specials, conditional=conditional, banned_ids=tuple(banned_ids))
    return registry.model_class(model_cfg.arch).from_config(SimpleNamespace(model=model_cfg), task)


def reference_policy(generator: nn.Module):
    """π_ref of the KL penalty, frozen: the generator's own ``reference_policy()`` when it has one (a LoRA policy:
    itself with the adapters disabled), else a frozen copy."""
    own = getattr(generator, "reference_policy", None)
    return own() if own is not None else copy.deepcopy(generator).eval().requires_grad_(False)


def make_discriminator(cfg: RunConfig, task) -> CNNDiscriminator:
    """SeqGAN's discriminator for the task's vocabulary from the ``disc.*`` config."""
    disc = cfg.disc
    return build_discriminator(len(task.vocab), disc.emb_dim, disc.filter_sizes, disc.num_filters, disc.dropout,
                               pad_id=task.specials.pad, sep_id=task.specials.bos)
