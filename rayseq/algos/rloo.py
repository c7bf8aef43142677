"""RLOO, REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
Optimization for Learning from Human Feedback in LLMs", Sec. 3.3; Kool et al. 2019).

For every prompt the policy samples G replies (``algo.group_size``, consecutive rows: ``prompt_copies``). The
baseline of reply i is the mean reward of the other G − 1 replies of its prompt, so it is unbiased (it does not
depend on y_i) and needs no value network:

    A_i = r_i − (1/(G−1)) Σ_{j≠i} r_j  =  G/(G−1) · (r_i − mean(r_1..r_G))

and every token of reply i gets A_i in one REINFORCE step (Tuan et al. Eq. 1 / :func:`rayseq.losses.reinforce_loss`;
the mean is over the batch's sampled tokens, or as ``algo.loss_type`` averages them: grpo per reply, dr_grpo over the
task's longest reply, luspo the replies' token sums; ``algo.mask_truncated_completions`` and
``algo.top_entropy_quantile`` as for GRPO, :mod:`rayseq.algos.loss_menu`).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from rayseq.algos.common import (
    LearnerState,
    RolloutAlgo,
    apply_gradients,
    grad_micro_batches,
    grad_pass,
    optimizer_step,
    reduce_metrics,
    rollout_metrics,
    rollout_tensors,
    with_entropy,
)
from rayseq.algos.grpo import GROUP_FIELDS, check_groups, group_metrics, group_training_step, token_advantages
from rayseq.algos.loss_menu import LOSS_TYPE_FIELDS, check_loss_menu, own_objective_loss
from rayseq.algos.parallel import DataParallel
from rayseq.algos.ppo import entropy_population
from rayseq.algos.turn_credit import group_turn_advantages
from rayseq.losses import reinforce_loss
from rayseq.types import Rollout, to_torch


def leave_one_out_advantages(score: np.ndarray, group_size: int) -> np.ndarray:
    """(B,) rewards in consecutive groups of G -> (B,) r_i − mean of the other G − 1 rewards of its group."""
    r = np.asarray(score, dtype=np.float64).reshape(-1, group_size)
    others = (r.sum(1, keepdims=True) - r) / (group_size - 1)
    return (r - others).reshape(-1)


class RLOO(RolloutAlgo):
    name = "rloo"
    data_parallel = True  # several learners: each its rows in micro-batches (accumulated_update)
    # the baseline is the group's other replies: no learned one, no discounting; the loss menu's aggregations
    fields = {**GROUP_FIELDS, **LOSS_TYPE_FIELDS}

    training_step = group_training_step  # with algo.dynamic_sampling: DAPO's (rayseq.algos.dynamic_sampling)

    @classmethod
    def check_config(cls, cfg) -> None:
        check_groups(cls, cfg)
        check_loss_menu(cls, cfg, own_objective=True, reply_advantages=cfg.algo.turn_credit == "trajectory")

    def prompt_copies(self) -> int:
        return self.cfg.group_size

    def advantages_and_metrics(self, rollout: Rollout) -> tuple[torch.Tensor, dict]:
        """(B, T): the leave-one-out advantage on every sampled token, or with ``algo.turn_credit`` each turn's on its
        tokens (:mod:`rayseq.algos.turn_credit`) and its ``credit/*`` metrics."""
        if self.cfg.turn_credit != "trajectory":
            return group_turn_advantages(self.cfg, rollout, self.cfg.group_size)
        return token_advantages(leave_one_out_advantages(rollout.score, self.cfg.group_size), rollout), {}

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        dev = state.device
        policy = own_objective_loss(self.cfg, reinforce_loss, state.max_reply_len)
        adv, credit = self.advantages_and_metrics(rollout)
        adv = adv.to(dev)
        pieces = grad_micro_batches(state, len(rollout), rollout.src.shape[1] + rollout.tokens.shape[1])
        if pieces is not None:  # learner.micro_batch_size rows at a time
            m = self.accumulated_update(state, rollout, adv, policy, pieces)
            return {**rollout_metrics(rollout), **group_metrics(rollout, self.cfg.group_size), **m, **credit}
        tokens = to_torch(rollout.tokens, dev)
        out = grad_pass(state.generator, to_torch(rollout.src, dev), to_torch(rollout.src_len, dev), tokens,
                        bool(state.entropy_coef) or policy.top_entropy_quantile < 1.0)
        mask = policy.mask(torch.as_tensor(rollout.action_mask, device=dev), tokens, to_torch(rollout.token_mask, dev),
                           state.generator)
        loss, stats = policy.fn(out.logp, adv, mask, keep=policy.keep(out, mask, None, None))
        extra: dict = {}
        loss = with_entropy(state, loss, out.logits, mask, extra, entropy=out.entropy)
        grad_norm = optimizer_step(state.gen_opt, loss, state.generator.parameters(), self.cfg.max_grad_norm)
        return {**rollout_metrics(rollout), **group_metrics(rollout, self.cfg.group_size), "loss/policy": loss.item(),
                "policy/advantage_mean": float(stats.advantage_mean), "policy/grad_norm": grad_norm, **extra, **credit}

    def accumulated_update(self, state: LearnerState, rollout: Rollout, adv: torch.Tensor, policy,
                           pieces: list) -> dict:
        """:meth:`update`'s step with its gradient accumulated over ``pieces`` (this rank's rows in micro-batches,
        :func:`~rayseq.algos.common.grad_micro_batches`): each micro-batch's loss scaled by its share of the batch's
        denominator (its counted tokens or replies, ``algo.loss_type``), its entropy bonus by its share of the loss's
        tokens; with ``algo.top_entropy_quantile`` < 1 the quantile is taken over the whole batch's entropies (one
        more pass without gradients, :func:`~rayseq.algos.ppo.entropy_population`), as the one pass takes it."""
        share = DataParallel.share
        b = rollout_tensors(rollout, state.device, 1.0)
        whole_mask = policy.mask(b.action_mask, b.tokens, b.token_mask, state.generator)
        population = None
        if policy.top_entropy_quantile < 1.0:
            population = entropy_population(state, b, pieces, state.dp, whole_mask)
        need_entropy = bool(state.entropy_coef) or policy.top_entropy_quantile < 1.0
        state.gen_opt.zero_grad(set_to_none=True)
        sums: dict = defaultdict(float)
        for rows in pieces:
            part, mask = b.index(rows), whole_mask[rows]
            w, w_tok = share(policy.counted(mask), policy.counted(whole_mask)), share(mask, whole_mask)
            out = grad_pass(state.generator, part.src, part.src_len, part.tokens, need_entropy)
            loss, stats = policy.fn(out.logp, adv[rows], mask, keep=policy.keep(out, mask, state.dp, whole_mask,
                                                                               population))
            extra: dict = {}
            loss = with_entropy(state, loss * w, out.logits, mask, extra, w_tok, out.entropy)
            loss.backward()
            sums["loss/policy"] += loss.item()
            sums["policy/advantage_mean"] += float(stats.advantage_mean) * w_tok
            for k, v in extra.items():
                sums[k] += v * w_tok
            del out, loss  # this micro-batch's graph and activations, before the next one's
        grad_norm = apply_gradients(state.gen_opt, state.generator.parameters(), self.cfg.max_grad_norm, state.dp)
        return {**reduce_metrics(state, dict(sums)), "policy/grad_norm": grad_norm}
