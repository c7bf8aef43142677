"""GRPO, group relative policy optimisation (Shao et al. 2024, "DeepSeekMath", Sec. 4.1, Eq. 3 and the
outcome-supervision advantage of Sec. 4.1.2).

For every prompt x the policy samples a group of G replies y_1..y_G (``algo.group_size``; the driver repeats
each prompt G times in consecutive rows: ``prompt_copies``). Each reply's reward r_i is normalised within
its group, and every token of reply i gets that advantage:

    Â_i,t = (r_i − mean(r_1..r_G)) / (std(r_1..r_G) + ε)          (outcome supervision, ε = 1e-8)

The update is PPO's clipped surrogate (Tuan et al. Eq. 3; ε = ``algo.eps``) over ``algo.epochs`` passes of
minibatches, with no value network: the group mean is the baseline. (DeepSeekMath also adds β·KL(π‖π_ref) to
the loss; ``algo.kl_coef`` does that for every rollout algorithm. By default the loss is the mean over the batch's
tokens, DAPO's and TRL's default, not DeepSeekMath's mean over each reply's tokens then over replies, which is
``algo.loss_type=grpo``.) std is the population std of the group; a group whose rewards are all equal has advantage
0; ``algo.dynamic_sampling`` drops such groups and samples fresh prompts in their place (DAPO,
:mod:`rayseq.algos.dynamic_sampling`), and ``algo.eps_high`` decouples the clip range's upper bound (DAPO's
Clip-Higher, :func:`rayseq.losses.ppo_clip_loss`).

The loss menu (:mod:`rayseq.algos.loss_menu`, TRL's names): ``algo.loss_type`` (dapo, grpo, dr_grpo, bnpo, luspo,
cispo, sapo, gmpo), ``algo.importance_sampling_level`` (sequence = GSPO), ``algo.scale_rewards`` (the advantage's
denominator: the group's std, the batch's (Lite PPO), none (Dr.GRPO)), ``algo.delta``,
``algo.mask_truncated_completions``, ``algo.top_entropy_quantile``.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import BeforeValidator, Field

from rayseq.algos.common import LearnerState, RolloutAlgo
from rayseq.algos.dynamic_sampling import DYNAMIC_SAMPLING_FIELDS, check_dynamic_sampling, dynamic_sampling_step
from rayseq.algos.loss_menu import (
    DELTA_FIELDS,
    LOSS_TYPE_FIELDS,
    SAPO_FIELDS,
    SEQUENCE_FIELDS,
    check_loss_menu,
    clip_policy_loss,
)
from rayseq.algos.ppo import CLIP_FIELDS, PPO_FIELDS, minibatch_seed, ppo_update
from rayseq.algos.turn_credit import TURN_CREDIT_FIELDS, check_turn_credit, group_turn_advantages
from rayseq.types import Rollout, to_torch

# the group algorithms' own keys: G, and DAPO's dynamic sampling (rayseq.algos.dynamic_sampling)
GROUP_FIELDS = {"group_size": (int, Field(8, ge=2, description="GRPO / RLOO: samples per prompt, G; "
                                                               "train.batch_size must be a multiple of it.")),
                **DYNAMIC_SAMPLING_FIELDS, **TURN_CREDIT_FIELDS}


def group_normalized_advantages(score: np.ndarray, group_size: int, eps: float = 1e-8) -> np.ndarray:
    """(B,) rewards in consecutive groups of G -> (B,) (r − group mean) / (group std + ε) (DeepSeekMath 4.1.2)."""
    r = np.asarray(score, dtype=np.float64).reshape(-1, group_size)
    return ((r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + eps)).reshape(-1)


def batch_scaled_advantages(score: np.ndarray, group_size: int, eps: float = 1e-8) -> np.ndarray:
    """(B,) rewards in consecutive groups of G -> (B,) (r − group mean) / (std of the batch's rewards + ε): the
    group's baseline, the batch's scale ("Tricks or Traps? A Deep Dive into RL for LLM Reasoning", 2025, Lite PPO;
    TRL's ``scale_rewards="batch"``)."""
    r = np.asarray(score, dtype=np.float64).reshape(-1, group_size)
    return ((r - r.mean(1, keepdims=True)) / (r.std() + eps)).reshape(-1)


def group_centred_advantages(score: np.ndarray, group_size: int) -> np.ndarray:
    """(B,) rewards in consecutive groups of G -> (B,) r − group mean, no scale (Dr.GRPO: dividing by the group's
    std favours the prompts that are too easy or too hard; TRL's ``scale_rewards="none"``)."""
    r = np.asarray(score, dtype=np.float64).reshape(-1, group_size)
    return (r - r.mean(1, keepdims=True)).reshape(-1)


SCALE_REWARDS = {"group": group_normalized_advantages, "batch": batch_scaled_advantages,
                 "none": group_centred_advantages}


def _scale_name(value):
    """TRL's booleans (True = group, False = none), and none as a config override spells it (null)."""
    if isinstance(value, str):
        return value
    return {True: "group", False: "none", None: "none"}.get(value, value)


SCALE_FIELDS = {"scale_rewards": (Annotated[Literal[tuple(SCALE_REWARDS)], BeforeValidator(_scale_name)], Field(
    "group", description="GRPO's advantage r − group mean divided by: group = the group's std (DeepSeekMath); "
    "batch = the std of the batch's rewards (Lite PPO); none = nothing (Dr.GRPO). TRL's scale_rewards; std is the "
    "population std, ε = 1e-8 (TRL: the sample std, ε = 1e-4). true = group, false = none, as TRL reads them."))}


def check_groups(cls, cfg) -> None:
    """The run's batch holds whole groups; dynamic sampling's own limits; credit over turns only on episodes (the
    loss menu's: each algorithm's ``check_config``)."""
    if cfg.train.batch_size % cfg.algo.group_size:
        raise ValueError(f"train.batch_size={cfg.train.batch_size} is not a multiple of "
                         f"algo.group_size={cfg.algo.group_size} ({cls.name} samples whole groups)")
    check_dynamic_sampling(cls, cfg)
    check_turn_credit(cls, cfg)
    credit = cfg.algo.turn_credit
    if credit != "trajectory" and getattr(cfg.algo, "scale_rewards", "none") != "none":
        raise ValueError(f"algo.turn_credit={credit} has its own baseline and is not scaled (dividing by a group's std "
                         f"biases the gradient, and a group of equal returns would divide turn advantages by ε); set "
                         f"algo.scale_rewards=none (it is {cfg.algo.scale_rewards})")
    if credit != "trajectory" and getattr(cfg.algo, "importance_sampling_level", "token") == "sequence":
        raise ValueError(f"algo.importance_sampling_level=sequence (GSPO) weighs each reply by one advantage, and "
                         f"algo.turn_credit={credit} gives one per turn; use importance_sampling_level=token")


def group_training_step(algo, groups, step) -> dict:
    """A group algorithm's iteration: with ``algo.dynamic_sampling`` DAPO's (rayseq.algos.dynamic_sampling), else
    the default one (sample → update, with the batches sampled ahead)."""
    if algo.cfg.dynamic_sampling:
        return dynamic_sampling_step(algo, groups, step)
    return RolloutAlgo.training_step(algo, groups, step)


def token_advantages(per_reply: np.ndarray, rollout: Rollout) -> torch.Tensor:
    """(B,) advantages of whole replies -> (B, T) on every sampled token."""
    # to_torch: a rollout read from the object store is read-only, which torch.from_numpy warns about
    return torch.from_numpy(per_reply.astype(np.float32))[:, None] * to_torch(rollout.action_mask)


class GRPO(RolloutAlgo):
    name = "grpo"
    data_parallel = True
    off_policy_ratio = True  # ρ = π_θ / π_old with π_old = Rollout.logp, the behaviour policy
    # no learned baseline, no discounting; the whole loss menu (rayseq.algos.loss_menu)
    fields = {**PPO_FIELDS, **CLIP_FIELDS, **GROUP_FIELDS, **SCALE_FIELDS, **LOSS_TYPE_FIELDS, **SEQUENCE_FIELDS,
              **DELTA_FIELDS, **SAPO_FIELDS}

    training_step = group_training_step

    @classmethod
    def check_config(cls, cfg) -> None:
        check_groups(cls, cfg)
        check_loss_menu(cls, cfg, reply_advantages=cfg.algo.turn_credit == "trajectory")

    def prompt_copies(self) -> int:
        return self.cfg.group_size

    def advantages(self, rollout: Rollout) -> torch.Tensor:
        """(B, T): the group-normalised reward on every sampled token, or with ``algo.turn_credit`` each turn's
        advantage on its tokens (:mod:`rayseq.algos.turn_credit`)."""
        return self.advantages_and_metrics(rollout)[0]

    def advantages_and_metrics(self, rollout: Rollout) -> tuple[torch.Tensor, dict]:
        """:meth:`advantages` and, with ``algo.turn_credit``, its ``credit/*`` metrics."""
        if self.cfg.turn_credit != "trajectory":
            return group_turn_advantages(self.cfg, rollout, self.cfg.group_size)
        scale = SCALE_REWARDS[self.cfg.scale_rewards]
        return token_advantages(scale(rollout.score, self.cfg.group_size), rollout), {}

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        adv, credit = self.advantages_and_metrics(rollout)
        m = ppo_update(self.cfg, state, rollout, clip_policy_loss(self.cfg, state.max_reply_len),
                       seed=minibatch_seed(self, iteration), given_advantages=adv)
        return {**m, **group_metrics(rollout, self.cfg.group_size), **credit}


def group_metrics(rollout: Rollout, group_size: int) -> dict:
    r = np.asarray(rollout.score, dtype=np.float64).reshape(-1, group_size)
    return {"group/reward_std": float(r.std(1).mean()), "group/all_equal_frac": float((r.std(1) == 0).mean())}
