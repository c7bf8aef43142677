"""Algorithms: how a batch becomes an update (one file each; math layer, no Ray).

Each algorithm object has
- ``kind``: ``"supervised"`` (updates on reference targets) or ``"rollout"`` (updates on sampled
  rollouts),
- ``needs_targets``: whether prompts carry reference targets (MLE, MIXER),
- ``rollout_request(iteration, max_len, temperature, seed)`` (rollout algorithms),
- ``update(state, batch, iteration) -> dict`` of metrics.
"""

from __future__ import annotations

from rayseq.algos.common import LearnerState
from rayseq.algos.mixer import Mixer
from rayseq.algos.mle import MLE
from rayseq.algos.ppo import PPO
from rayseq.algos.ppo_dynamic import PPODynamic
from rayseq.algos.reinforce import Reinforce
from rayseq.algos.seqgan import SeqGAN, SeqGANPPO, SeqGANPPODynamic

ALGORITHMS = {
    "mle": MLE, "reinforce": Reinforce, "mixer": Mixer, "ppo": PPO, "ppo_dynamic": PPODynamic,
    "seqgan": SeqGAN, "seqgan_ppo": SeqGANPPO, "seqgan_ppo_dynamic": SeqGANPPODynamic,
}


def make_algo(algo_cfg):
    try:
        cls = ALGORITHMS[algo_cfg.name]
    except KeyError:
        raise ValueError(f"algo.name: unknown algorithm {algo_cfg.name!r}; known: {sorted(ALGORITHMS)}") from None
    return cls(algo_cfg)


__all__ = [
    "ALGORITHMS", "LearnerState", "MLE", "Mixer", "PPO", "PPODynamic", "Reinforce", "SeqGAN", "SeqGANPPO",
    "SeqGANPPODynamic", "make_algo",
]
