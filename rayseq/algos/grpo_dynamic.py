"""GRPO with PPO-dynamic's bounds: GRPO's group-normalised advantages (Shao et al. 2024, Sec. 4.1.2;
:mod:`rayseq.algos.grpo`) with the per-token clip range of PPO-dynamic (Tuan et al. 2018, Eq. 4):
clip(ρ, 1 − β, 1 + α), β = min(β1, β2·√(1/π_old − 1)), α = min(α1, α2·√(1/π_old − 1)), which widens the
range for low-probability tokens. Neither paper has this combination; bounds default to Supplement C's
REINFORCE-style setting α1 = β1 = ∞, α2 = β2 = 1.
"""

from __future__ import annotations

from rayseq.algos.common import LearnerState
from rayseq.algos.grpo import GROUP_FIELDS, GRPO, SCALE_FIELDS, check_groups, group_metrics
from rayseq.algos.loss_menu import DELTA_FIELDS, LOSS_TYPE_FIELDS, check_loss_menu
from rayseq.algos.ppo import PPO_FIELDS, minibatch_seed, ppo_update
from rayseq.algos.ppo_dynamic import DYNAMIC_FIELDS, dynamic_policy_loss
from rayseq.types import Rollout


class GRPODynamic(GRPO):
    name = "grpo_dynamic"
    # the loss menu's aggregations (rayseq.algos.loss_menu): its objective is PPO-dynamic's
    fields = {**PPO_FIELDS, **DYNAMIC_FIELDS, **GROUP_FIELDS, **SCALE_FIELDS, **LOSS_TYPE_FIELDS, **DELTA_FIELDS}

    @classmethod
    def check_config(cls, cfg) -> None:
        check_groups(cls, cfg)
        check_loss_menu(cls, cfg, own_objective=True)

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        policy, bounds = dynamic_policy_loss(self.cfg, state.max_reply_len)
        m = ppo_update(self.cfg, state, rollout, policy, seed=minibatch_seed(self, iteration),
                       given_advantages=self.advantages(rollout))
        return {**m, **bounds, **group_metrics(rollout, self.cfg.group_size)}
