"""PPO-dynamic (Tuan et al. Eq. 4): PPO whose clip range adapts per token to π_old,
clip(ρ, 1−β, 1+α), β = min(β1, β2·√(1/π_old − 1)), α = min(α1, α2·√(1/π_old − 1)).

Same K-epoch minibatch loop as PPO (:func:`rayseq.algos.ppo.ppo_update`); only the surrogate differs.
Paper settings (Supplement C): α1 = β1 = ∞, α2 = β2 = 1.0 for REINFORCE/MIXER-style training;
α1 = 10, β1 = 0.5, α2 = β2 = 0.2 for SeqGAN. Every update logs the bounds its loss received
(``ppo_dynamic/alpha1`` ...), so a run's metrics show them.
"""

from __future__ import annotations

from functools import partial

from rayseq.algos.common import BASELINE_PARAMS, DYNAMIC_PARAMS, PPO_PARAMS, LearnerState, RolloutAlgo
from rayseq.algos.ppo import minibatch_seed, ppo_update
from rayseq.losses import ppo_dynamic_loss
from rayseq.types import Rollout


def dynamic_surrogate(cfg) -> tuple[partial, dict]:
    """PPO-dynamic's loss with the config's α1, α2, β1, β2, and those bounds as metrics."""
    bounds = {k: float(getattr(cfg, k)) for k in DYNAMIC_PARAMS}
    return partial(ppo_dynamic_loss, **bounds), {f"ppo_dynamic/{k}": v for k, v in bounds.items()}


class PPODynamic(RolloutAlgo):
    name = "ppo_dynamic"
    data_parallel = True
    off_policy_ratio = True  # ρ = π_θ / π_old with π_old = Rollout.logp, the behaviour policy
    params = (*BASELINE_PARAMS, *PPO_PARAMS, *DYNAMIC_PARAMS)

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        surrogate, bounds = dynamic_surrogate(self.cfg)
        m = ppo_update(self.cfg, state, rollout, surrogate, seed=minibatch_seed(self, iteration),
                       use_baseline=self.baseline_on)
        return {**m, **bounds}
