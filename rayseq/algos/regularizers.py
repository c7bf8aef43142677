"""KL and entropy control for every rollout algorithm.

KL to the pretrained policy, in the reward (Ziegler et al. 2019, "Fine-Tuning Language Models from Human
Preferences", Sec. 2.2; InstructGPT, Ouyang et al. 2022, Eq. 2): a frozen copy π_ref of the generator as the
algorithm stage starts (the MLE model) and, for each sampled token,

    r'_t = r_t − β · (log π_old(y_t | …) − log π_ref(y_t | …))

(the sampled token's log-ratio, an unbiased estimate of KL(π_old ‖ π_ref) per token). Sequence-level scores
(SCST, GRPO, RLOO use them) get the sum over the reply: s' = s − β · Σ_t kl_t; given returns (SeqGAN's Q) the
reward-to-go of the penalty. β = ``algo.kl_coef``; with ``algo.kl_target`` the adaptive controller of Ziegler et
al. (Sec. 2.2) moves β towards a target KL per reply: e = clip(KL/KL_target − 1, −0.2, 0.2), β ← β·(1 + K_β·e),
K_β = 0.1 per update. The algorithm applies the penalty to each rollout before its update (:func:`kl_penalty`, from
``Algorithm.learn``); π_ref is one of its modules, declared by a regularized algorithm with β > 0
(``Algorithm.frozen_copies``) and built by the learner as the ``train`` stage starts.

Entropy bonus: −``algo.entropy_coef`` · H(π(·|s_t)) added to the policy loss, H the mean entropy over sampled
tokens (:func:`entropy_bonus`; Williams & Peng 1991, Mnih et al. 2016).
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from rayseq.losses import masked_mean
from rayseq.losses.menu import token_entropy
from rayseq.types import Rollout

K_BETA = 0.1  # Ziegler et al.'s proportional gain
# algo.* keys of every ``regularized`` algorithm (Algorithm.config_fields adds them): the algorithm applies the
# KL penalty before its update (Algorithm.learn, kl_penalty) and the learner passes the entropy weight to the update
# (with_entropy)
REGULARIZER_FIELDS = {
    "kl_coef": (float, Field(
        0.0, ge=0.0, description="Rollout algorithms: β of the per-token KL to the pretrained policy subtracted from "
        "the reward, r_t − β·(log π_old − log π_ref) (Ziegler et al. 2019; InstructGPT); 0 = off.")),
    "kl_target": (float | None, Field(
        None, gt=0, description="Rollout algorithms: adapt β towards this KL per reply (nats; Ziegler et al.'s "
        "controller, starting from kl_coef); None = β fixed.")),
    "entropy_coef": (float, Field(
        0.0, ge=0.0, description="Rollout algorithms: weight of the entropy bonus −c·H(π(·|s_t)) in the policy loss.")),
}


def sampled_kl(logp_old: np.ndarray, logp_ref: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(B, T) log π_old(y_t) − log π_ref(y_t) on the sampled tokens (0 elsewhere)."""
    return (np.asarray(logp_old) - np.asarray(logp_ref)) * np.asarray(mask)


def apply_kl_penalty(rollout: Rollout, kl: np.ndarray, coef: float) -> Rollout:
    """Subtract β·kl from the rollout's per-token rewards, β·Σ kl from its scores (and β·Σ_{τ≥t} kl_τ from given
    returns); in place, returns it."""
    pen = (coef * kl).astype(np.float32)
    rollout.rewards = rollout.rewards - pen
    rollout.score = rollout.score - pen.sum(1)
    if rollout.returns is not None:  # reward-to-go of the penalty (γ = 1, as SeqGAN's Q)
        rollout.returns = rollout.returns - np.flip(np.cumsum(np.flip(pen, 1), 1), 1)
    return rollout  # (SCST's greedy baseline reply has no sampled log-probs: its reward stays unpenalised)


class KLController:
    """β: fixed (``target`` None) or adapted towards ``target`` nats of KL per reply (Ziegler et al. Sec. 2.2)."""

    def __init__(self, coef: float, target: float | None):
        self.coef, self.target = float(coef), target

    def update(self, kl_per_reply: float) -> float:
        if self.target is not None:
            err = float(np.clip(kl_per_reply / self.target - 1.0, -0.2, 0.2))
            self.coef *= 1.0 + K_BETA * err
        return self.coef


def kl_penalty(rollout: Rollout, logp_ref: np.ndarray, controller: KLController) -> dict:
    """The KL penalty on a sampled rollout, in place, before the update that trains on it: kl_t = log π_old(y_t) −
    log π_ref(y_t) on its sampled tokens (:func:`sampled_kl`), its rewards, scores and given returns penalised by β·kl
    (:func:`apply_kl_penalty`), then β's controller step on the mean KL per reply.

    Args:
        rollout: the sampled rollout: ``logp`` (B, T) log π_old, ``action_mask`` (B, T); changed in place.
        logp_ref: (B, T) log π_ref of its tokens.
        controller: β (:class:`KLController`), stepped here.

    Returns:
        ``kl/per_reply`` (mean over replies of Σ_t kl_t), ``kl/per_token`` (Σ kl over the sampled tokens' count) and
        ``kl/coef`` (the β this rollout was penalised with).
    """
    kl = sampled_kl(rollout.logp, logp_ref, rollout.action_mask)
    coef = controller.coef
    apply_kl_penalty(rollout, kl, coef)
    per_reply = float(kl.sum(1).mean())
    controller.update(per_reply)
    return {"kl/per_reply": per_reply, "kl/per_token": float(kl.sum() / max(rollout.action_mask.sum(), 1.0)),
            "kl/coef": coef}


def entropy_bonus(logits: torch.Tensor | None, mask: torch.Tensor, coef: float,
                  entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """(−coef · mean entropy of π(·|s_t) over unmasked tokens, that mean entropy). logits (B, T, V) (−inf for
    banned ids), or ``entropy`` (B, T) already computed (a pass without logits); mask (B, T). Zero (and not computed)
    when coef is 0."""
    if coef == 0:
        return torch.zeros((), device=mask.device), float("nan")
    ent = masked_mean(token_entropy(logits) if entropy is None else entropy, mask)
    return -coef * ent, float(ent.detach())
