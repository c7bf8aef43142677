"""GRPO with PPO-dynamic's bounds: GRPO's group-normalised advantages (Shao et al. 2024, Sec. 4.1.2;
:mod:`rayseq.algos.grpo`) with the per-token clip range of PPO-dynamic (Tuan et al. 2018, Eq. 4):
clip(ρ, 1 − β, 1 + α), β = min(β1, β2·√(1/π_old − 1)), α = min(α1, α2·√(1/π_old − 1)), which widens the
range for low-probability tokens. Neither paper has this combination; bounds default to Supplement C's
REINFORCE-style setting α1 = β1 = ∞, α2 = β2 = 1.
"""

from __future__ import annotations

from rayseq.algos.common import LearnerState
from rayseq.algos.grpo import GROUP_FIELDS, GRPO, group_metrics
from rayseq.algos.ppo import PPO_FIELDS, minibatch_seed, ppo_update
from rayseq.algos.ppo_dynamic import DYNAMIC_FIELDS, dynamic_surrogate
from rayseq.types import Rollout


class GRPODynamic(GRPO):
    name = "grpo_dynamic"
    fields = {**PPO_FIELDS, **DYNAMIC_FIELDS, **GROUP_FIELDS}

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        surrogate, bounds = dynamic_surrogate(self.cfg)
        m = ppo_update(self.cfg, state, rollout, surrogate, seed=minibatch_seed(self, iteration),
                       given_advantages=self.advantages(rollout))
        return {**m, **bounds, **group_metrics(rollout, self.cfg.group_size)}
