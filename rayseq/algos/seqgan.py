"""SeqGAN's generator update (Yu et al. 2017, Eq. 6-8, Algorithm 1) and its PPO / PPO-dynamic variants
(Tuan et al. 2018, Table 1 lower block, Supplement C).

The reward of token y_t is the action value Q(Y_1:t−1, y_t) from Monte-Carlo search scored by the
discriminator (SeqGAN Eq. 4; computed by rollout workers and scorer actors, :mod:`rayseq.rewards.mc_search`),
delivered as ``Rollout.returns``. The generator then follows the policy gradient

    ∇J(θ) ≈ Σ_t Q(Y_1:t−1, y_t) ∇_θ log G_θ(y_t | Y_1:t−1)                  (SeqGAN Eq. 8)

with no baseline, as SeqGAN's code (``algo.use_baseline=true`` subtracts the learned one):

- ``seqgan``: one gradient step on that objective (:func:`rayseq.losses.reinforce_loss`),
- ``seqgan_ppo``: PPO's clipped surrogate (Tuan et al. Eq. 3, ε = 0.2),
- ``seqgan_ppo_dynamic``: PPO-dynamic (Eq. 4) with Supplement C's SeqGAN setting α1 = 10, β1 = 0.5,
  α2 = β2 = 0.2 — used for every bound not set explicitly in the config.

After each g-step the learner moves the rollout policy G_β toward G_θ (β ← r·β + (1−r)·θ); the
discriminator's d-steps run on the learner (:meth:`rayseq.distributed.learner.Learner.train_discriminator`).
"""

from __future__ import annotations

from functools import partial

from rayseq.algos.common import LearnerState, RolloutAlgo
from rayseq.algos.ppo import ppo_update
from rayseq.algos.reinforce import Reinforce
from rayseq.losses import ppo_clip_loss, ppo_dynamic_loss
from rayseq.types import Rollout

# Tuan et al. Supplement C, PPO-dynamic with SeqGAN
SEQGAN_DYNAMIC_BOUNDS = {"alpha1": 10.0, "beta1": 0.5, "alpha2": 0.2, "beta2": 0.2}


class SeqGAN(Reinforce):
    uses_baseline = False
    adversarial = True


class SeqGANPPO(RolloutAlgo):
    uses_baseline = False
    adversarial = True

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        surrogate = partial(ppo_clip_loss, eps=self.cfg.eps)
        return ppo_update(self.cfg, state, rollout, surrogate, seed=iteration, use_baseline=self.baseline_on)


class SeqGANPPODynamic(RolloutAlgo):
    uses_baseline = False
    adversarial = True

    def bounds(self) -> dict:
        """α1, α2, β1, β2: the config's where set explicitly, else Supplement C's SeqGAN values."""
        c = self.cfg
        return {k: getattr(c, k) if k in c.model_fields_set else v for k, v in SEQGAN_DYNAMIC_BOUNDS.items()}

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        surrogate = partial(ppo_dynamic_loss, **self.bounds())
        return ppo_update(self.cfg, state, rollout, surrogate, seed=iteration, use_baseline=self.baseline_on)
