"""Algorithms: what one iteration does, what the algorithm trains and how a batch becomes an update (one file each;
math layer, no Ray).

Each algorithm class (:class:`rayseq.algos.common.Algorithm`, whose docstrings say each hook's arguments; its name
registered in :mod:`rayseq.registry`) has
- ``name``, ``fields`` (the ``algo.*`` keys it reads, with types, defaults and descriptions), ``sections`` (config
  sections of its own: SeqGAN's ``disc:``), ``defaults`` (its own values of shared keys),
- ``kind``: ``"supervised"`` (updates on reference targets) or ``"rollout"`` (updates on sampled rollouts),
- ``training_step(groups, step) -> dict`` of metrics: one iteration against the actor groups
  (:mod:`rayseq.algos.iteration`; default: sample → score → update; the supervised family's in ``SupervisedAlgo``;
  SeqGAN's Algorithm 1 in :mod:`rayseq.algos.seqgan`),
- ``update(state, batch, iteration) -> dict`` of metrics (on the learner),
and optionally
- ``build_modules(run_cfg, generator, task, device) -> {name: module or optimizer}`` (what it trains besides the
  generator: the value baseline where its update reads it, a critic, a discriminator; the learner builds and
  checkpoints them), with
  ``config_lrs``, ``start`` (the ``train`` stage begins), ``worker_modules`` / ``worker_weights`` and
  ``scorer_modules`` / ``scorer_weights`` (the copies rollout workers and scorers hold), ``aux_update`` (another
  update on the learner: SeqGAN's d-step), ``own_state_dict`` (counters, schedules), ``init_from``,
- ``assign_scores(rollout, parts)`` (on the learner: the scores its iteration computed on the scorers),
- ``pretrain_steps(cfg)`` / ``pretrain_step(groups, step)`` (a stage of its own before ``train``: SeqGAN's D),
  ``train_iters(cfg)`` (the ``train`` stage's length: a critic's warm-up),
- ``rollout_request(iteration, max_len, temperature, seed)`` (rollout algorithms; a request carries the algorithm's
  own sampler where it draws otherwise than π_θ through the engine: :mod:`rayseq.algos.sampling`),
  ``prompt_copies()``,
- ``augment(task, batch, rng, iteration) -> (batch, metrics)`` (supervised: driver-side data change,
  RAML's reward-weighted samples, data noising),
- ``stateful_request`` (the learner's copy builds the rollout requests: interpolation's λ),
- ``validate_every`` and ``on_validation(state, reward)`` (interpolation's annealing),
- ``evaluate(state, task, split) -> (metrics, details)`` (on the learner, in place of the task's evaluation: what it
  trains is judged by itself, the reward model's held-out accuracy),
- traits the config checks read: ``needs_targets``, ``needs_references``, ``needs_task_reward``, ``own_reward``,
  ``regularized``, ``off_policy_ratio``, ``data_parallel``, ``own_task`` (the only task it trains on).
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
