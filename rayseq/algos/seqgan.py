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
  α2 = β2 = 0.2: the algorithm's ``defaults``, resolved into the run's config (what config.yaml shows is
  what the loss receives); ``algo.alpha1=...`` etc. change them.

After each g-step the learner moves the rollout policy G_β toward G_θ (β ← r·β + (1−r)·θ); the
discriminator's d-steps run on the learner (:meth:`rayseq.distributed.learner.Learner.train_discriminator`).
"""

from __future__ import annotations

from functools import partial

from rayseq.algos.common import (
    CLIP_PARAMS,
    DYNAMIC_PARAMS,
    PPO_PARAMS,
    SEQGAN_PARAMS,
    LearnerState,
    RolloutAlgo,
)
from rayseq.algos.ppo import minibatch_seed, ppo_update
from rayseq.algos.ppo_dynamic import dynamic_surrogate
from rayseq.algos.reinforce import Reinforce
from rayseq.losses import ppo_clip_loss
from rayseq.types import Rollout

# Tuan et al. Supplement C, PPO-dynamic with SeqGAN
SEQGAN_DYNAMIC_BOUNDS = {"alpha1": 10.0, "beta1": 0.5, "alpha2": 0.2, "beta2": 0.2}


# SeqGAN's returns are Q itself (Rollout.returns), so γ is not read; the baseline stays available (off by default)
SEQGAN_BASELINE_PARAMS = ("baseline_lr", "use_baseline", "normalize_advantages")


class SeqGAN(Reinforce):
    monte_carlo = True
    needs_task_reward = False  # D's Q
    name = "seqgan"
    params = (*SEQGAN_BASELINE_PARAMS, *SEQGAN_PARAMS)
    defaults = {"use_baseline": False}
    adversarial = True


class SeqGANPPO(RolloutAlgo):
    monte_carlo = True
    needs_task_reward = False  # D's Q
    name = "seqgan_ppo"
    params = (*SEQGAN_BASELINE_PARAMS, *SEQGAN_PARAMS, *PPO_PARAMS, *CLIP_PARAMS)
    defaults = {"use_baseline": False}
    adversarial = True

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        surrogate = partial(ppo_clip_loss, eps=self.cfg.eps)
        return ppo_update(self.cfg, state, rollout, surrogate, seed=minibatch_seed(self, iteration),
                          use_baseline=self.baseline_on)


class SeqGANPPODynamic(RolloutAlgo):
    monte_carlo = True
    needs_task_reward = False  # D's Q
    name = "seqgan_ppo_dynamic"
    params = (*SEQGAN_BASELINE_PARAMS, *SEQGAN_PARAMS, *PPO_PARAMS, *DYNAMIC_PARAMS)
    defaults = {"use_baseline": False, **SEQGAN_DYNAMIC_BOUNDS}
    adversarial = True

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        surrogate, bounds = dynamic_surrogate(self.cfg)  # Supplement C's SeqGAN values unless given
        m = ppo_update(self.cfg, state, rollout, surrogate, seed=minibatch_seed(self, iteration),
                       use_baseline=self.baseline_on)
        return {**m, **bounds}
