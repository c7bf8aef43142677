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
    optimizer_step,
    policy_pass,
    returns_gamma,
    rollout_metrics,
    rollout_tensors,
    value_baseline,
    with_entropy,
    without_grad,
)
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


def ppo_update(cfg, state: LearnerState, rollout: Rollout, surrogate, seed: int, modules: dict | None = None,
               use_baseline: bool = True, mixer: bool = False, given_advantages: torch.Tensor | None = None) -> dict:
    """K epochs × minibatches of ``surrogate(logp, old_logp, adv, mask) -> (loss, PolicyStats)``;
    advantages A_t = R_t − b(s_t) once per batch (A_t = R_t without the baseline, ``use_baseline=False``; b(s_t) is
    trained all the same). ``modules``: the algorithm's, holding b(s_t) (``baseline``) and its Adam (``base_opt``).
    ``mixer``: the tokens forced from the reference (token_mask − action_mask) add MIXER's cross-entropy
    (:func:`rayseq.losses.mixer_combine`). ``given_advantages`` (B, T): the algorithm's own (e.g. GRPO's
    group-normalised rewards); then no value baseline is used or trained (``modules`` is not read)."""
    b = rollout_tensors(rollout, state.device, returns_gamma(cfg))
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
    sums = defaultdict(float)
    n = 0
    for _ in range(cfg.epochs):
        perm = torch.randperm(B, generator=perm_rng).to(state.device)
        for start in range(0, B, mb):
            idx = perm[start : start + mb]
            w_tok = w = 1.0  # shares of the sampled tokens' (and MIXER's all tokens') denominators
            if dp is not None:
                whole, idx = b.index(idx), dp.part(idx)
            part = b.index(idx)
            out = state.generator.logprobs(part.src, part.src_len, part.tokens)
            loss, stats = surrogate(out.logp, old_logp[idx], adv_all[idx], part.action_mask)
            if dp is not None:
                w_tok = w = dp.share(part.action_mask, whole.action_mask)
            if mixer:
                loss = mixer_combine(loss, part.action_mask, out.logp, part.token_mask - part.action_mask)
                if dp is not None:
                    w = dp.share(part.token_mask, whole.token_mask)
            extra: dict = {}
            loss = with_entropy(state, loss if dp is None else loss * w, out.logits, part.action_mask, extra,
                                None if dp is None else w_tok)
            for k, v in extra.items():
                sums[k] += v * w_tok
            sums["policy/grad_norm"] += optimizer_step(state.gen_opt, loss, state.generator.parameters(),
                                                       cfg.max_grad_norm, dp)
            if given_advantages is None:
                v_loss, v_stats = value_loss(modules["baseline"](out.states), part.returns, part.action_mask)
                if dp is not None:
                    v_loss = v_loss * w_tok
                optimizer_step(modules["base_opt"], v_loss, modules["baseline"].parameters(), None, dp)
                sums["loss/value"] += v_loss.item()
                sums["value/explained_variance"] += float(v_stats.explained_variance) * w_tok
            sums["loss/policy"] += loss.item()
            sums["policy/clipfrac"] += float(stats.clipfrac) * w_tok
            sums["policy/approx_kl"] += float(stats.approx_kl) * w_tok
            sums["policy/ratio_mean"] += float(stats.ratio_mean) * w_tok
            n += 1
    if dp is not None:  # the ranks' weighted sums (the gradient norm is the summed gradient's: the same on each)
        sums.update(dp.reduce({k: v for k, v in sums.items() if k != "policy/grad_norm"}))
    out = {k: v / n for k, v in sums.items()}
    out["policy/advantage_mean"] = float(masked_mean(adv_all, b.action_mask))
    out["policy/updates"] = float(n)
    return {**rollout_metrics(rollout), **out, **extra_metrics}


def minibatch_seed(algo, iteration: int) -> int:
    """Seed of the minibatch permutations of one PPO update: the run's seed and the iteration."""
    return derive_seed(algo.seed, "ppo_minibatches", iteration)


class PPO(RolloutAlgo):
    name = "ppo"
    data_parallel = True
    off_policy_ratio = True  # ρ = π_θ / π_old with π_old = Rollout.logp, the behaviour policy
    fields = {**BASELINE_FIELDS, **PPO_FIELDS, **CLIP_FIELDS}

    def build_modules(self, run_cfg, generator, task, device) -> dict:
        """b(s_t) and its Adam (:func:`ppo_update` trains it)."""
        return value_baseline(run_cfg, generator, device)

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        surrogate = partial(ppo_clip_loss, eps=self.cfg.eps, eps_high=self.cfg.eps_high)
        return ppo_update(self.cfg, state, rollout, surrogate, seed=minibatch_seed(self, iteration),
                          modules=self.modules, use_baseline=self.baseline_on)
