"""REINFORCE with a learned baseline (Tuan et al. Eq. 1; Ranzato et al. 2015; survey Sec. III-A).

One gradient step per sampled batch:
    loss = −mean_t (R_t − b(s_t)) log π_θ(y_t | x, y_<t),   b trained by MSE on the detached state.

With ``learner.micro_batch_size`` below the batch (or several learners) the step's gradient is accumulated over
micro-batches of rows (:func:`accumulated_pg_update`): the same step up to float rounding, its memory a micro-batch's.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from rayseq.algos.common import (
    LearnerState,
    RolloutAlgo,
    RolloutTensors,
    advantages,
    apply_gradients,
    grad_micro_batches,
    grad_pass,
    optimizer_step,
    reduce_metrics,
    returns_gamma,
    rollout_metrics,
    rollout_tensors,
    value_baseline,
    values_without_grad,
    with_entropy,
)
from rayseq.algos.parallel import DataParallel
from rayseq.losses import masked_mean, reinforce_loss, value_loss
from rayseq.types import Rollout


def reinforce_part(logp: torch.Tensor, adv: torch.Tensor, part: RolloutTensors) -> tuple:
    """REINFORCE's loss on a part of the batch, the mean over its sampled tokens (:func:`reinforce_loss`)."""
    return reinforce_loss(logp, adv, part.action_mask)


def accumulated_pg_update(algo: RolloutAlgo, state: LearnerState, rollout: Rollout, b: RolloutTensors,
                          pieces: list[torch.Tensor], loss_fn=reinforce_part, denominator: str = "action_mask") -> dict:
    """One policy step and one step of b(s_t) on the whole batch, their gradients accumulated over ``pieces``
    (:func:`~rayseq.algos.common.grad_micro_batches`: this rank's rows in micro-batches).

    b(s_t) of every row comes first from the generator's pass without gradients
    (:func:`~rayseq.algos.common.values_without_grad`), so A_t = R_t − b(s_t) (whitened over the whole batch with
    ``algo.normalize_advantages``) is the one pass's. Then for each micro-batch m of the rows, with the batch's
    denominators D (its ``denominator`` mask's sum for the policy loss, its sampled tokens for the entropy bonus and
    the regression of b):

        L_m = (D_m / D) · loss_fn(logp_m, A_m, part_m) − entropy_coef · (D^a_m / D^a) · H_m
        V_m = (D^a_m / D^a) · mean_{t∈m} (b(s_t) − R_t)²

    so Σ_m ∇L_m = ∇L and Σ_m ∇V_m = ∇V of the whole batch (:mod:`rayseq.algos.parallel`); each backward frees its
    micro-batch's activations before the next.

    Args:
        algo: the algorithm (its ``cfg``, ``modules["baseline"]``/``["base_opt"]``, ``values_for_advantage``).
        state: the learner's state.
        rollout: the batch (for its metrics).
        b: its tensors (:func:`~rayseq.algos.common.rollout_tensors`).
        pieces: the row micro-batches.
        loss_fn: ``(logp, adv, part) -> (loss, stats)``, a mean over the tokens of ``part``'s ``denominator`` mask.
        denominator: the :class:`~rayseq.algos.common.RolloutTensors` mask whose sum divides ``loss_fn``.

    Returns:
        The metrics of the one-pass update.
    """
    cfg, baseline = algo.cfg, algo.modules["baseline"]
    values = values_without_grad(state, baseline, b)
    adv = advantages(b.returns, algo.values_for_advantage(values), b.action_mask, cfg.normalize_advantages)
    algo.modules["base_opt"].zero_grad(set_to_none=True)
    m = accumulated_policy_step(state, b, pieces, adv, cfg.max_grad_norm, loss_fn, denominator, baseline)
    apply_gradients(algo.modules["base_opt"], baseline.parameters(), None, state.dp)
    _, v_stats = value_loss(values, b.returns, b.action_mask)  # of every row: the one pass's figure
    return {**rollout_metrics(rollout), **m, "value/explained_variance": float(v_stats.explained_variance)}


def accumulated_policy_step(state: LearnerState, b: RolloutTensors, pieces: list[torch.Tensor], adv: torch.Tensor,
                            max_grad_norm: float | None, loss_fn=reinforce_part, denominator: str = "action_mask",
                            baseline: torch.nn.Module | None = None) -> dict:
    """The generator's step on advantages ``adv`` (B, T) given for the whole batch, its gradient accumulated over
    ``pieces`` (L_m of :func:`accumulated_pg_update`), then clipped to ``max_grad_norm`` and stepped; with
    ``baseline``, each micro-batch's regression V_m of b(s_t) on its states is backpropagated beside (the caller
    zeroes and steps b's optimizer). Returns ``loss/policy`` (the entropy bonus in), ``loss/value`` with ``baseline``,
    ``policy/entropy`` with the bonus, ``policy/advantage_mean``, ``policy/grad_norm``: the one pass's figures."""
    share = DataParallel.share
    state.gen_opt.zero_grad(set_to_none=True)
    sums: dict = defaultdict(float)
    for rows in pieces:
        part = b.index(rows)
        w, w_act = share(getattr(part, denominator), getattr(b, denominator)), share(part.action_mask, b.action_mask)
        out = grad_pass(state.generator, part.src, part.src_len, part.tokens, bool(state.entropy_coef))
        loss, _ = loss_fn(out.logp, adv[rows], part)
        extra: dict = {}
        loss = with_entropy(state, loss * w, out.logits, part.action_mask, extra, w_act, out.entropy)
        loss.backward()
        sums["loss/policy"] += loss.item()
        if baseline is not None:
            v_loss = value_loss(baseline(out.states), part.returns, part.action_mask)[0] * w_act
            v_loss.backward()
            sums["loss/value"] += v_loss.item()
        for k, v in extra.items():
            sums[k] += v * w_act
        del out, loss  # this micro-batch's graph and activations, before the next one's
    grad_norm = apply_gradients(state.gen_opt, state.generator.parameters(), max_grad_norm, state.dp)
    return {**reduce_metrics(state, dict(sums)), "policy/advantage_mean": float(masked_mean(adv, b.action_mask)),
            "policy/grad_norm": grad_norm}


class Reinforce(RolloutAlgo):
    name = "reinforce"
    data_parallel = True  # several learners: each its rows in micro-batches (accumulated_pg_update)

    def build_modules(self, run_cfg, generator, task, device) -> dict:
        """b(s_t) and its Adam (trained every update, subtracted with ``algo.use_baseline``)."""
        return value_baseline(run_cfg, generator, device)

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        cfg = self.cfg
        b = rollout_tensors(rollout, state.device, returns_gamma(cfg))  # SeqGAN's update too: Q given
        pieces = grad_micro_batches(state, len(rollout), b.src.shape[1] + b.tokens.shape[1])
        if pieces is not None:  # learner.micro_batch_size rows at a time, or several learners
            return accumulated_pg_update(self, state, rollout, b, pieces)
        out = grad_pass(state.generator, b.src, b.src_len, b.tokens, bool(state.entropy_coef))
        values = self.modules["baseline"](out.states)
        adv = advantages(b.returns, self.values_for_advantage(values), b.action_mask, cfg.normalize_advantages)
        loss, stats = reinforce_loss(out.logp, adv, b.action_mask)
        extra: dict = {}
        loss = with_entropy(state, loss, out.logits, b.action_mask, extra, entropy=out.entropy)
        grad_norm = optimizer_step(state.gen_opt, loss, state.generator.parameters(), cfg.max_grad_norm)
        v_loss, v_stats = value_loss(values, b.returns, b.action_mask)
        optimizer_step(self.modules["base_opt"], v_loss, self.modules["baseline"].parameters(), None)
        return {
            **rollout_metrics(rollout),
            "loss/policy": loss.item(),
            "loss/value": v_loss.item(),
            "policy/advantage_mean": float(stats.advantage_mean),
            "policy/grad_norm": grad_norm,
            "value/explained_variance": float(v_stats.explained_variance),
            **extra,
        }
