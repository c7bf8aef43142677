"""PPO-dynamic (Tuan et al. Eq. 4): PPO whose clip range adapts per token to π_old,
clip(ρ, 1−β, 1+α), β = min(β1, β2·√(1/π_old − 1)), α = min(α1, α2·√(1/π_old − 1)).

Same K-epoch minibatch loop as PPO (:func:`rayseq.algos.ppo.ppo_update`); only the surrogate differs.
Paper settings (Supplement C): α1 = β1 = ∞, α2 = β2 = 1.0 for REINFORCE/MIXER-style training;
α1 = 10, β1 = 0.5, α2 = β2 = 0.2 for SeqGAN. Every update logs the bounds its loss received
(``ppo_dynamic/alpha1`` ...), so a run's metrics show them.
"""

from __future__ import annotations

import math
from functools import partial

from pydantic import Field

from rayseq.algos.common import BASELINE_FIELDS, LearnerState, RolloutAlgo, value_baseline
from rayseq.algos.loss_menu import DELTA_FIELDS, LOSS_TYPE_FIELDS, PolicyLoss, check_loss_menu, own_objective_loss
from rayseq.algos.ppo import PPO_FIELDS, minibatch_seed, ppo_update
from rayseq.losses import ppo_dynamic_loss
from rayseq.types import Rollout

# PPO-dynamic's bounds (Eq. 4), read by dynamic_surrogate
DYNAMIC_FIELDS = {
    "alpha1": (float, Field(math.inf, gt=0, description="PPO-dynamic: cap of the upper bound α (Eq. 4).")),
    "alpha2": (float, Field(1.0, gt=0, description="PPO-dynamic: scale of the upper bound α (Eq. 4).")),
    "beta1": (float, Field(math.inf, gt=0, description="PPO-dynamic: cap of the lower bound β (Eq. 4).")),
    "beta2": (float, Field(1.0, gt=0, description="PPO-dynamic: scale of the lower bound β (Eq. 4).")),
}


def dynamic_surrogate(cfg) -> tuple[PolicyLoss, dict]:
    """PPO-dynamic's loss with the config's α1, α2, β1, β2, averaged over the tokens, and those bounds as metrics
    (the algorithms without the loss menu's keys: MIXER-PPO-dynamic, SeqGAN-PPO-dynamic)."""
    bounds = dynamic_bounds(cfg)
    return PolicyLoss(partial(ppo_dynamic_loss, **bounds)), bounds_metrics(bounds)


def dynamic_policy_loss(cfg, max_reply_len: int | None) -> tuple[PolicyLoss, dict]:
    """PPO-dynamic's objective with the config's bounds and ``algo.delta``, averaged as ``algo.loss_type`` says
    (:func:`rayseq.algos.loss_menu.own_objective_loss`), and the bounds as metrics."""
    bounds = dynamic_bounds(cfg)
    return (own_objective_loss(cfg, ppo_dynamic_loss, max_reply_len, **bounds, delta=cfg.delta),
            bounds_metrics(bounds))


def dynamic_bounds(cfg) -> dict:
    """α1, α2, β1, β2 of the config."""
    return {k: float(getattr(cfg, k)) for k in DYNAMIC_FIELDS}


def bounds_metrics(bounds: dict) -> dict:
    return {f"ppo_dynamic/{k}": v for k, v in bounds.items()}


class PPODynamic(RolloutAlgo):
    name = "ppo_dynamic"
    data_parallel = True
    off_policy_ratio = True  # ρ = π_θ / π_old with π_old = Rollout.logp, the behaviour policy
    # the loss menu's aggregations (rayseq.algos.loss_menu): its objective is its own
    fields = {**BASELINE_FIELDS, **PPO_FIELDS, **DYNAMIC_FIELDS, **LOSS_TYPE_FIELDS, **DELTA_FIELDS}

    @classmethod
    def check_config(cls, cfg) -> None:
        check_loss_menu(cls, cfg, own_objective=True, reply_advantages=False)

    def build_modules(self, run_cfg, generator, task, device) -> dict:
        """b(s_t) and its Adam (:func:`~rayseq.algos.ppo.ppo_update` trains it)."""
        return value_baseline(run_cfg, generator, device)

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        policy, bounds = dynamic_policy_loss(self.cfg, state.max_reply_len)
        m = ppo_update(self.cfg, state, rollout, policy, seed=minibatch_seed(self, iteration),
                       modules=self.modules, use_baseline=self.baseline_on)
        return {**m, **bounds}
