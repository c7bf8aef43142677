"""Algorithms: what one iteration does and how a batch becomes an update (one file each; math layer, no Ray).

Each algorithm class (:class:`rayseq.algos.common.Algorithm`; its name registered in :mod:`rayseq.registry`) has
- ``name``, ``fields`` (the ``algo.*`` keys it reads, with types, defaults and descriptions),
  ``defaults`` (its own values of shared keys),
- ``kind``: ``"supervised"`` (updates on reference targets) or ``"rollout"`` (updates on sampled
  rollouts),
- ``needs_targets``: whether prompts carry reference targets (MLE, MIXER),
- ``rollout_request(iteration, max_len, temperature, seed)`` (rollout algorithms),
- ``training_step(groups, step) -> dict`` of metrics: one iteration against the actor groups
  (:mod:`rayseq.algos.iteration`; default: sample → score → update; the supervised family's in ``SupervisedAlgo``;
  SeqGAN's Algorithm 1 in :mod:`rayseq.algos.seqgan`),
- ``update(state, batch, iteration) -> dict`` of metrics (on the learner),
and optionally
- ``assign_scores(rollout, parts)`` (on the learner: the scores its iteration computed on the scorers),
- ``pretrain_steps(cfg)`` / ``pretrain_step(groups, step)`` (a stage of its own before ``train``: SeqGAN's D),
- ``augment(task, batch, rng, iteration) -> (batch, metrics)`` (supervised: driver-side data change,
  RAML's reward-weighted samples, data noising),
- ``stateful_request`` (the learner's copy builds the rollout requests: interpolation's λ),
- ``validate_every`` and ``on_validation(state, reward)`` (interpolation's annealing),
- ``uses_critic`` (the learner keeps a critic V_ψ: actor-critic, SeqGAN-critic),
- ``state_dict()`` / ``load_state_dict()`` (algorithm state in checkpoints).
"""

from __future__ import annotations

from rayseq.algos.actor_critic import ActorCritic
from rayseq.algos.common import LearnerState
from rayseq.algos.data_noising import DataNoising
from rayseq.algos.erpo_interpolation import ERPOInterpolation
from rayseq.algos.mixer import Mixer, MixerPPO, MixerPPODynamic
from rayseq.algos.mle import MLE
from rayseq.algos.ppo import PPO
from rayseq.algos.ppo_dynamic import PPODynamic
from rayseq.algos.raml import RAML
from rayseq.algos.reinforce import Reinforce
from rayseq.algos.scheduled_sampling import ScheduledSampling
from rayseq.algos.scst import SCST
from rayseq.algos.seqgan import SeqGAN, SeqGANPPO, SeqGANPPODynamic
from rayseq.algos.seqgan_critic import SeqGANCritic
from rayseq.algos.spg import SPG
from rayseq.registry import algorithm_class


def make_algo(algo_cfg, seed: int = 0):
    """The algorithm ``algo_cfg.name`` (a name of :data:`rayseq.registry.ALGORITHMS`) for the run seeded ``seed``."""
    return algorithm_class(algo_cfg.name)(algo_cfg, seed)


__all__ = [
    "SCST", "SPG", "ActorCritic", "DataNoising", "ERPOInterpolation", "LearnerState", "MLE", "Mixer", "MixerPPO",
    "MixerPPODynamic", "PPO", "PPODynamic", "RAML", "Reinforce", "ScheduledSampling", "SeqGAN", "SeqGANCritic",
    "SeqGANPPO", "SeqGANPPODynamic", "make_algo",
]
