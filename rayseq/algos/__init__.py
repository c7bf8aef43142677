"""Algorithms: how a batch becomes an update (one file each; math layer, no Ray).

Each algorithm object has
- ``kind``: ``"supervised"`` (updates on reference targets) or ``"rollout"`` (updates on sampled
  rollouts),
- ``needs_targets``: whether prompts carry reference targets (MLE, MIXER),
- ``rollout_request(iteration, max_len, temperature, seed)`` (rollout algorithms),
- ``update(state, batch, iteration) -> dict`` of metrics,
and optionally
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
from rayseq.algos.mixer import Mixer
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

ALGORITHMS = {
    "mle": MLE, "reinforce": Reinforce, "mixer": Mixer, "ppo": PPO, "ppo_dynamic": PPODynamic,
    "seqgan": SeqGAN, "seqgan_ppo": SeqGANPPO, "seqgan_ppo_dynamic": SeqGANPPODynamic,
    "scst": SCST, "scheduled_sampling": ScheduledSampling, "raml": RAML, "data_noising": DataNoising,
    "spg": SPG, "erpo_interpolation": ERPOInterpolation, "actor_critic": ActorCritic, "seqgan_critic": SeqGANCritic,
}


def make_algo(algo_cfg):
    try:
        cls = ALGORITHMS[algo_cfg.name]
    except KeyError:
        raise ValueError(f"algo.name: unknown algorithm {algo_cfg.name!r}; known: {sorted(ALGORITHMS)}") from None
    return cls(algo_cfg)


__all__ = [
    "ALGORITHMS", "SCST", "SPG", "ActorCritic", "DataNoising", "ERPOInterpolation", "LearnerState", "MLE", "Mixer",
    "PPO", "PPODynamic", "RAML", "Reinforce", "ScheduledSampling", "SeqGAN", "SeqGANCritic", "SeqGANPPO",
    "SeqGANPPODynamic", "make_algo",
]
