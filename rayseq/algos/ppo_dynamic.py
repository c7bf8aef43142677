"""PPO-dynamic (Tuan et al. Eq. 4): PPO whose clip range adapts per token to π_old,
clip(ρ, 1−β, 1+α), β = min(β1, β2·√(1/π_old − 1)), α = min(α1, α2·√(1/π_old − 1)).

Same K-epoch minibatch loop as PPO (:func:`rayseq.algos.ppo.ppo_update`); only the surrogate differs.
Paper settings (Supplement C): α1 = β1 = ∞, α2 = β2 = 1.0 for REINFORCE/MIXER-style training;
α1 = 10, β1 = 0.5, α2 = β2 = 0.2 for SeqGAN.
"""

from __future__ import annotations

from functools import partial

from rayseq.algos.common import LearnerState, RolloutAlgo
from rayseq.algos.ppo import ppo_update
from rayseq.losses import ppo_dynamic_loss
from rayseq.types import Rollout


class PPODynamic(RolloutAlgo):
    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        c = self.cfg
        surrogate = partial(ppo_dynamic_loss, alpha1=c.alpha1, alpha2=c.alpha2, beta1=c.beta1, beta2=c.beta2)
        return ppo_update(c, state, rollout, surrogate, seed=iteration, use_baseline=self.baseline_on)
