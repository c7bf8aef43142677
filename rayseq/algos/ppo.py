"""PPO for sequence generation (Tuan et al. Eq. 3, Supplement B Algorithm 1).

Sample a batch with π_old (the rollout workers' weights), compute advantages A_t = R_t − b(s_t) once,
then run K epochs of minibatch updates of the clipped surrogate; ρ_t = π_θ(y_t|…) / π_old(y_t|…).
With K = 1 and one minibatch ρ = 1 and the update equals REINFORCE's (the paper code's setting).
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import Literal

import torch
from pydantic import Field

from rayseq.algos.common import (
    BASELINE_FIELDS,
    LearnerState,
    RolloutAlgo,
    advantages,
    apply_gradients,
    grad_pass,
    micro_batch_rows,
    micro_batches,
    policy_pass,
    returns_gamma,
    rollout_metrics,
    rollout_tensors,
    token_entropies,
    value_baseline,
    with_entropy,
    without_grad,
)
from rayseq.algos.loss_menu import (
    DELTA_FIELDS,
    LOSS_TYPE_FIELDS,
    SAPO_FIELDS,
    PolicyLoss,
    check_loss_menu,
    clip_policy_loss,
    ended,
)
from rayseq.algos.parallel import DataParallel
from rayseq.losses import masked_mean, mixer_combine, ppo_clip_loss, value_loss
from rayseq.losses.mismatch import truncated_is_weights
from rayseq.seeding import derive_seed
from rayseq.types import Rollout, to_torch

# algo.* keys of the K-epoch minibatch loop (ppo_update), read by every algorithm that runs it
PPO_FIELDS = {
    "epochs": (int, Field(1, ge=1, description="PPO: K passes over each sampled batch (paper code: 1).")),
    "minibatch_size": (int | None, Field(
        64, ge=1, description="PPO: minibatch size of the K passes; None = the whole batch (then ρ = 1).")),
    "ratio_to": (Literal["behaviour", "proximal"], Field(
        "behaviour", description="PPO-clip algorithms: the policy the ratio ρ is taken against. behaviour = the "
        "weights that sampled the batch (Eq. 3: ρ = π_θ / π_old, π_old = the rollout's log-probs); proximal = the "
        "decoupled objective (Hilton et al. 2022; AReaL, Fu et al. 2025): ρ = π_θ / π_prox with π_prox the "
        "learner's weights before this update (one more pass without gradients), each token's advantage weighted by "
        "min(π_prox / π_behaviour, algo.behaviour_weight_cap). For batches sampled ahead "
        "(rollout.max_staleness >= 1): against stale behaviour weights more of ρ falls outside the clip range the "
        "staler the batch; against π_prox the clip bounds this update's step alone.")),
    "behaviour_weight_cap": (float, Field(
        5.0, gt=0, description="algo.ratio_to=proximal: the cap C of the behaviour weight min(π_prox / π_behaviour, "
        "C) (truncated importance sampling).")),
}
# PPO's clip range (Tuan et al. Eq. 3), with DAPO's decoupled upper bound
CLIP_FIELDS = {
    "eps": (float, Field(
        0.2, gt=0, lt=1, description="PPO: clip range ε of Eq. 3, in (0, 1) (ρ clipped to [1−ε, 1+ε]).")),
    "eps_high": (float | None, Field(
        None, gt=0, description="PPO-clip algorithms: DAPO's decoupled clip (Yu et al. 2025, Sec. 3.1 Clip-Higher): ρ "
        "clipped to [1−eps, 1+eps_high]; None = eps (symmetric, Eq. 3). DAPO uses eps 0.2, eps_high 0.28.")),
}


def ppo_update(cfg, state: LearnerState, rollout: Rollout, policy: PolicyLoss, seed: int, modules: dict | None = None,
               use_baseline: bool = True, mixer: bool = False, given_advantages: torch.Tensor | None = None) -> dict:
    """K epochs × minibatches of the policy loss ``policy.fn(logp, old_logp, adv, mask, keep=) -> (loss,
    PolicyStats)`` (:class:`rayseq.algos.loss_menu.PolicyLoss`: which tokens it counts, which keep their terms, and
    whether its denominator counts tokens or replies); advantages A_t = R_t − b(s_t) once per batch (A_t = R_t
    without the baseline, ``use_baseline=False``; b(s_t) is trained all the same). ``modules``: the algorithm's,
    holding b(s_t) (``baseline``) and its Adam (``base_opt``). ``mixer``: the tokens forced from the reference
    (token_mask − action_mask) add MIXER's cross-entropy (:func:`rayseq.losses.mixer_combine`).
    ``given_advantages`` (B, T): the algorithm's own (e.g. GRPO's group-normalised rewards); then no value baseline
    is used or trained (``modules`` is not read).

    Each minibatch (a learner rank's part of it) goes through the policy :func:`~rayseq.algos.common.micro_batch_rows`
    rows at a time, the gradients accumulated: each micro-batch's losses scaled by its share of the minibatch's
    denominators (as a rank's are, :mod:`rayseq.algos.parallel`), then one clip and one step, so the update is the one
    pass's up to float rounding and its memory is the micro-batch's."""
    b = rollout_tensors(rollout, state.device, returns_gamma(cfg))
    loss_mask = policy.mask(b.action_mask, b.tokens, b.token_mask, state.generator)  # (B, T) the tokens it counts
    proximal = cfg.ratio_to == "proximal"  # the decoupled objective: ρ against the weights before this update
    baseline = given_advantages is None

    def no_grad_pass(src, src_len, tokens, lean):  # one pass: b(s_t) from the states and/or log π_prox (B, T)
        logp, states = policy_pass(state.generator, src, src_len, tokens, lean)
        return ((modules["baseline"](states),) if baseline else ()) + ((logp,) if proximal else ())

    outs = list(without_grad(state, no_grad_pass, b.src, b.src_len, b.tokens)) if baseline or proximal else []
    if baseline:
        values = outs.pop(0)
        if not use_baseline:
            values = torch.zeros_like(values)
        adv_all = advantages(b.returns, values, b.action_mask, cfg.normalize_advantages)
    else:
        adv_all = given_advantages.to(state.device).detach() * b.action_mask
    if rollout.is_weights is not None:  # an engine's sampling corrected for (rayseq.losses.mismatch)
        adv_all = adv_all * to_torch(rollout.is_weights, state.device)
    old_logp = b.old_logp  # π_old of Eq. 3: the weights that sampled the batch
    extra_metrics: dict = {}
    if proximal:
        (old_logp,) = outs  # log π_prox
        behaviour_w = truncated_is_weights(old_logp, b.old_logp, b.action_mask, cfg.behaviour_weight_cap)
        adv_all = adv_all * behaviour_w  # w ≥ 0: w·min(ρA, clip(ρ)A) = min(ρ·wA, clip(ρ)·wA)
        extra_metrics = {"policy/behaviour_weight_mean": float(masked_mean(behaviour_w, b.action_mask)),
                         "policy/behaviour_weight_max": float((behaviour_w * b.action_mask).max())}
    B = len(rollout)
    mb = min(cfg.minibatch_size or B, B)
    perm_rng = torch.Generator().manual_seed(seed)
    dp = state.dp  # N learners: each its rows of every minibatch, its losses scaled by its share (algos/parallel.py)
    # gradient accumulation: a rank's rows of a minibatch go through the policy this many at a time (None: at once)
    rows_per_pass = micro_batch_rows(state, b.src.shape[1] + b.tokens.shape[1])
    need_entropy = bool(state.entropy_coef) or policy.top_entropy_quantile < 1.0
    share = DataParallel.share
    sums = defaultdict(float)
    n = 0
    for _ in range(cfg.epochs):
        perm = torch.randperm(B, generator=perm_rng).to(state.device)
        for start in range(0, B, mb):
            idx = whole_idx = perm[start : start + mb]
            if dp is not None:
                idx = dp.part(whole_idx)
            whole = b.index(whole_idx)
            whole_mask = loss_mask[whole_idx]
            pieces = micro_batches(idx, rows_per_pass)
            # a part of the minibatch (a rank's, a micro-batch's) scales each loss by its share of that loss's
            # denominator, so the parts' gradients sum to the minibatch's (rayseq.algos.parallel)
            split = dp is not None or len(pieces) > 1
            population = None  # the minibatch's entropies, when the high-entropy selection sees a micro-batch at once
            if len(pieces) > 1 and policy.top_entropy_quantile < 1.0:
                population = entropy_population(state, b, pieces, dp, whole_mask)
            state.gen_opt.zero_grad(set_to_none=True)
            if given_advantages is None:
                modules["base_opt"].zero_grad(set_to_none=True)
            for rows in pieces:
                # shares of the denominators: the loss's (its tokens or replies; MIXER's all tokens), the tokens it
                # counts (its entropy bonus, its diagnostics), the sampled tokens (the value regression)
                w = w_tok = w_val = 1.0
                part = b.index(rows)
                mask = loss_mask[rows]
                out = grad_pass(state.generator, part.src, part.src_len, part.tokens, need_entropy)
                keep = policy.keep(out, mask, dp, whole_mask, population)
                loss, stats = policy.fn(out.logp, old_logp[rows], adv_all[rows], mask, keep=keep)
                if split:
                    w = share(policy.counted(mask), policy.counted(whole_mask))
                    w_tok = share(mask, whole_mask)
                    w_val = share(part.action_mask, whole.action_mask)
                if keep is not None:
                    sums["policy/kept_token_frac"] += float(masked_mean(keep, mask)) * w_tok
                if mixer:
                    loss = mixer_combine(loss, mask, out.logp, part.token_mask - part.action_mask)
                    if split:
                        w = share(part.token_mask, whole.token_mask)
                extra: dict = {}
                loss = with_entropy(state, loss * w if split else loss, out.logits, mask, extra,
                                    w_tok if split else None, out.entropy)
                for k, v in extra.items():
                    sums[k] += v * w_tok
                loss.backward()
                if given_advantages is None:
                    v_loss, v_stats = value_loss(modules["baseline"](out.states), part.returns, part.action_mask)
                    if split:
                        v_loss = v_loss * w_val
                    v_loss.backward()
                    sums["loss/value"] += v_loss.item()
                    sums["value/explained_variance"] += float(v_stats.explained_variance) * w_val
                sums["loss/policy"] += loss.item()
                sums["policy/clipfrac"] += float(stats.clipfrac) * w_tok
                sums["policy/approx_kl"] += float(stats.approx_kl) * w_tok
                sums["policy/ratio_mean"] += float(stats.ratio_mean) * w_tok
                del out, loss  # this micro-batch's graph and activations, before the next one's
            sums["policy/grad_norm"] += apply_gradients(state.gen_opt, state.generator.parameters(),
                                                        cfg.max_grad_norm, dp)
            if given_advantages is None:
                apply_gradients(modules["base_opt"], modules["baseline"].parameters(), None, dp)
            n += 1
    if dp is not None:  # the ranks' weighted sums (the gradient norm is the summed gradient's: the same on each)
        sums.update(dp.reduce({k: v for k, v in sums.items() if k != "policy/grad_norm"}))
    out = {k: v / n for k, v in sums.items()}
    out["policy/advantage_mean"] = float(masked_mean(adv_all, b.action_mask))
    out["policy/updates"] = float(n)
    if policy.mask_truncated:  # the replies the length cap cut, left out of the policy loss
        out["rollout/truncated_frac"] = 1.0 - float(ended(b.tokens, b.token_mask, state.generator.eos_id).mean())
    return {**rollout_metrics(rollout), **out, **extra_metrics}


def entropy_population(state: LearnerState, b, pieces: list, dp, whole_mask: torch.Tensor) -> tuple:
    """(entropies, mask) of a whole minibatch, for the high-entropy token selection of an update that sees it a
    micro-batch at a time: one pass without gradients over this rank's ``pieces`` of rows (each rank's gathered)."""
    with torch.no_grad():
        h = torch.cat([token_entropies(grad_pass(state.generator, p.src, p.src_len, p.tokens, True))
                       for p in (b.index(rows) for rows in pieces)])
    return (h if dp is None else dp.gather_rows(h, len(whole_mask))), whole_mask


def clip_surrogate(cfg) -> PolicyLoss:
    """Eq. 3's clipped surrogate with DAPO's ``eps_high``, averaged over the tokens (the algorithms without the loss
    menu's keys: MIXER-PPO, SeqGAN-PPO)."""
    return PolicyLoss(partial(ppo_clip_loss, eps=cfg.eps, eps_high=cfg.eps_high))


def minibatch_seed(algo, iteration: int) -> int:
    """Seed of the minibatch permutations of one PPO update: the run's seed and the iteration."""
    return derive_seed(algo.seed, "ppo_minibatches", iteration)


class PPO(RolloutAlgo):
    name = "ppo"
    data_parallel = True
    off_policy_ratio = True  # ρ = π_θ / π_old with π_old = Rollout.logp, the behaviour policy
    # the loss menu (rayseq.algos.loss_menu) but GSPO's sequence ratio and GMPO, which need one advantage per reply
    fields = {**BASELINE_FIELDS, **PPO_FIELDS, **CLIP_FIELDS, **LOSS_TYPE_FIELDS, **DELTA_FIELDS, **SAPO_FIELDS}

    @classmethod
    def check_config(cls, cfg) -> None:
        check_loss_menu(cls, cfg, reply_advantages=False)

    def build_modules(self, run_cfg, generator, task, device) -> dict:
        """b(s_t) and its Adam (:func:`ppo_update` trains it)."""
        return value_baseline(run_cfg, generator, device)

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        return ppo_update(self.cfg, state, rollout, clip_policy_loss(self.cfg, state.max_reply_len),
                          seed=minibatch_seed(self, iteration), modules=self.modules, use_baseline=self.baseline_on)
