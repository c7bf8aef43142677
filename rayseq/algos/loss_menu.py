"""The policy-loss menu on the algorithms' side: its ``algo.*`` keys (TRL's ``GRPOConfig`` names and meanings), the
combinations refused, and the chosen variant bound to its coefficients once per update (:class:`PolicyLoss`).

The variants themselves are :mod:`rayseq.losses.menu` (one function each, chosen from ``LOSS_TYPES`` by name);
veRL's ``loss_agg_mode`` strings are accepted as ``algo.loss_type`` where they name the same aggregation of PPO's
objective (``token-mean`` = dapo, ``seq-mean-token-mean`` = grpo, ``seq-mean-token-sum`` = luspo,
``seq-mean-token-sum-norm`` = dr_grpo). Who reads which key:

| key | grpo | grpo_dynamic | rloo | ppo | ppo_dynamic |
| --- | --- | --- | --- | --- | --- |
| loss_type | every variant | aggregations | aggregations | every variant but gmpo | aggregations |
| importance_sampling_level | yes | — | — | — | — |
| scale_rewards | yes | yes | — | — | — |
| delta | yes | yes | — | yes | yes |
| mask_truncated_completions, top_entropy_quantile | yes | yes | yes | yes | yes |

"aggregations": the algorithm's objective is its own (PPO-dynamic's bounds, RLOO's REINFORCE step), so only the
loss types that differ from dapo in how they average the token terms (grpo, dr_grpo, luspo, bnpo) change it; cispo,
sapo and gmpo replace the objective and are refused there. PPO's advantages differ per token (its value baseline),
which GMPO's one advantage per reply cannot take. GSPO's sequence ratio needs one advantage per reply and a clip
range that is not per token: GRPO's alone.

How an update applies the variant (``ppo_update``, RLOO's update):

- ``mask_truncated_completions`` (DAPO's overlong filtering, Yu et al. 2025, Sec. 3.4): a reply that ends without
  the end token (the length cap cut it) leaves the policy loss, its entropy bonus and its diagnostics: its tokens
  leave the mask, so they leave the denominators too (the value baseline still regresses on them). A task whose
  replies have a fixed length and no end token (counting) has no truncated reply to tell apart: refused there.
- ``top_entropy_quantile`` ρ < 1 (Wang et al. 2025, "Beyond the 80/20 Rule", arXiv:2506.01939): only the tokens
  whose entropy H(π_θ(·|s_t)) is in the top ρ of the minibatch's tokens keep their terms (``keep``); the quantile is
  over the whole minibatch, so N learner ranks gather their parts' entropies first (as TRL gathers over processes).
- Several learner ranks: each takes its share of the variant's denominator, tokens or replies
  (``PolicyLoss.per_reply``), so N ranks make the update of one (:mod:`rayseq.algos.parallel`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from pydantic import Field

from rayseq.algos.parallel import DataParallel
from rayseq.losses.menu import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    VERL_AGGREGATIONS,
    LossType,
    high_entropy_mask,
    token_entropy,
)

LOSS_TYPE_NAMES = (*LOSS_TYPES, *VERL_AGGREGATIONS)
AGGREGATION_ONLY = ("dapo", "bnpo", "grpo", "dr_grpo", "luspo")  # the loss types that are PPO's objective averaged
_LOSS_TYPE_HELP = (
    "The policy loss, by TRL's loss_type (rayseq.losses.menu): dapo = PPO's clipped objective over the batch's tokens "
    "(TRL's default; bnpo: the same here); grpo = each reply's token mean, then over replies; dr_grpo = token sums "
    "/ (replies × the task's longest reply); luspo = token sums over replies; cispo = the importance weight capped at "
    "algo.eps_high × A·log π; sapo = a sigmoid gate instead of the clip; gmpo = the geometric mean of each reply's "
    "token ratios, clipped in log space. veRL's loss_agg_mode names: token-mean = dapo, seq-mean-token-mean = grpo, "
    "seq-mean-token-sum = luspo, seq-mean-token-sum-norm = dr_grpo.")

# every algorithm of the menu: the loss type, and DAPO's and the 80/20 rule's token selections
LOSS_TYPE_FIELDS = {
    "loss_type": (Literal[LOSS_TYPE_NAMES], Field("dapo", description=_LOSS_TYPE_HELP)),
    "mask_truncated_completions": (bool, Field(
        False, description="Leave out of the policy loss every reply that ended without the end token (cut at the "
        "length cap): DAPO's overlong filtering (Yu et al. 2025, Sec. 3.4), TRL's mask_truncated_completions. Not "
        "for tasks whose replies have a fixed length and no end token (counting).")),
    "top_entropy_quantile": (float, Field(
        1.0, ge=0.0, le=1.0, description="ρ: only the tokens whose policy entropy is in the top ρ of the minibatch's "
        "tokens keep their policy-loss terms (Wang et al. 2025, 'Beyond the 80/20 Rule': 0.2); the denominators "
        "still count every token. 1 = every token (TRL's top_entropy_quantile).")),
}
# the algorithms whose objective is PPO's clip (with its own or PPO-dynamic's bounds)
DELTA_FIELDS = {
    "delta": (float | None, Field(
        None, gt=1.0, description="INTELLECT-2's two-sided clip: the ratio is also capped at δ in the unclipped "
        "term, min(min(ρ, δ)A, clip(ρ)A), bounding the step of a token with A < 0 whose ratio grew far (TRL's "
        "delta; > 1 + the clip's upper ε). None = no cap.")),
}
# PPO's and GRPO's, which offer SAPO
SAPO_FIELDS = {
    "sapo_temperature_pos": (float, Field(
        1.0, gt=0, description="algo.loss_type=sapo: the gate's temperature τ for tokens with A > 0 (TRL's "
        "sapo_temperature_pos).")),
    "sapo_temperature_neg": (float, Field(
        1.05, gt=0, description="algo.loss_type=sapo: the gate's temperature τ for tokens with A ≤ 0 (TRL's "
        "sapo_temperature_neg; larger: their gradient decays faster off-policy).")),
}
# GRPO's alone: one advantage per reply and one clip range for every token
SEQUENCE_FIELDS = {
    "importance_sampling_level": (Literal[tuple(IMPORTANCE_SAMPLING_LEVELS)], Field(
        "token", description="The importance ratio: token = one per token (PPO, GRPO); sequence = one per reply, "
        "the geometric mean of its token ratios, GSPO (Zheng et al. 2025; TRL's recipe: algo.loss_type=grpo, "
        "algo.eps=3e-4, algo.eps_high=4e-4).")),
}


def chosen(name: str) -> LossType:
    """The loss type ``name`` names (TRL's, or veRL's ``loss_agg_mode`` alias)."""
    return LOSS_TYPES[VERL_AGGREGATIONS.get(name, name)]


def canonical(name: str) -> str:
    """TRL's name of loss type ``name``."""
    return VERL_AGGREGATIONS.get(name, name)


@dataclass(frozen=True)
class PolicyLoss:
    """A policy loss as an update applies it.

    Args:
        fn: ``(logp, old_logp, advantages, mask, *, keep) -> (loss, PolicyStats)``, its coefficients bound.
        per_reply: its mean is over replies, not tokens: a learner rank's share of it is its share of the rows.
        mask_truncated: replies without the end token leave its mask (``algo.mask_truncated_completions``).
        top_entropy_quantile: ρ of the high-entropy tokens that keep their terms (1: all).
    """

    fn: Callable
    per_reply: bool = False
    mask_truncated: bool = False
    top_entropy_quantile: float = 1.0

    def mask(self, action_mask: torch.Tensor, tokens: torch.Tensor, token_mask: torch.Tensor,
             policy) -> torch.Tensor:
        """The tokens the loss counts, (B, T): the sampled ones (``action_mask``), less those of the replies of
        ``tokens`` the length cap cut (no ``policy.eos_id`` at their end) when asked."""
        if not self.mask_truncated:
            return action_mask
        return action_mask * ended(tokens, token_mask, policy.eos_id)[:, None]

    def keep(self, out, mask: torch.Tensor, dp: DataParallel | None, whole_mask: torch.Tensor | None,
             population: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor | None:
        """The high-entropy tokens of ``mask`` (B, T), the quantile taken over the whole minibatch (``whole_mask``
        with ``dp``: every rank's entropies gathered); None when every token keeps its term. ``out``: the pass's
        :class:`rayseq.models.protocol.GeneratorOutput` (its ``entropy``, else its ``logits``). ``population``
        (entropies, mask) of the whole minibatch, given when ``out`` holds only a micro-batch of it."""
        if self.top_entropy_quantile >= 1.0:
            return None
        with torch.no_grad():
            h = (token_entropy(out.logits) if out.entropy is None else out.entropy).detach()
            if population is None and dp is not None:
                population = (dp.gather_rows(h, len(whole_mask)), whole_mask)
            return high_entropy_mask(h, mask, self.top_entropy_quantile, population=population)

    def counted(self, mask: torch.Tensor) -> torch.Tensor:
        """What the loss's denominator counts in ``mask``'s rows: its tokens, or one per reply."""
        return mask.new_ones(mask.shape[0]) if self.per_reply else mask


def ended(tokens: torch.Tensor, token_mask: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(B,) float: 1 where the reply's last token is the end token, 0 where the length cap cut it (TRL's
    ``is_truncated``: the last token is neither EOS nor padding)."""
    last = (token_mask.sum(1).long() - 1).clamp(min=0)
    return (tokens.gather(1, last[:, None])[:, 0] == eos_id).to(token_mask.dtype)


def _bound(fn: Callable, available: dict) -> Callable:
    """``fn`` with those of ``available``'s coefficients its signature names."""
    params = inspect.signature(fn).parameters
    return partial(fn, **{k: v for k, v in available.items() if k in params})


def _options(cfg, fn: Callable, per_reply: bool) -> PolicyLoss:
    return PolicyLoss(fn, per_reply, cfg.mask_truncated_completions, cfg.top_entropy_quantile)


def _max_len(name: str, max_reply_len: int | None) -> int | None:
    if canonical(name) == "dr_grpo" and max_reply_len is None:
        raise ValueError("algo.loss_type=dr_grpo divides by the longest reply the task allows: the learner state has "
                         "no max_reply_len")
    return max_reply_len


def clip_policy_loss(cfg, max_reply_len: int | None) -> PolicyLoss:
    """PPO's and GRPO's loss: ``algo.loss_type``'s variant with its coefficients from the config (``eps``,
    ``eps_high`` (CISPO's cap ε_max), ``delta``, the SAPO temperatures, the ratio of ``importance_sampling_level``,
    and ``max_reply_len``, the task's longest reply, for dr_grpo)."""
    loss_type = chosen(cfg.loss_type)
    available = {"eps": cfg.eps, "eps_high": cfg.eps_high, "eps_max": cfg.eps_high, "delta": cfg.delta,
                 "tau_pos": getattr(cfg, "sapo_temperature_pos", None),
                 "tau_neg": getattr(cfg, "sapo_temperature_neg", None),
                 "log_ratio": IMPORTANCE_SAMPLING_LEVELS[getattr(cfg, "importance_sampling_level", "token")],
                 "max_len": _max_len(cfg.loss_type, max_reply_len)}
    return _options(cfg, _bound(loss_type.loss, available), loss_type.per_reply)


def own_objective_loss(cfg, objective: Callable, max_reply_len: int | None, **coefficients) -> PolicyLoss:
    """An algorithm's own objective (``objective(logp, …, *, aggregate, keep, **coefficients)``: PPO-dynamic's,
    REINFORCE's) averaged as ``algo.loss_type`` averages the token terms."""
    loss_type = chosen(cfg.loss_type)
    aggregate = _bound(loss_type.aggregate, {"max_len": _max_len(cfg.loss_type, max_reply_len)})
    return _options(cfg, partial(objective, aggregate=aggregate, **coefficients), loss_type.per_reply)


def check_loss_menu(cls, cfg, *, own_objective: bool = False, reply_advantages: bool = True) -> None:
    """Refuse the combinations of menu keys that mean nothing, naming both keys.

    Args:
        cls: the algorithm's class.
        cfg: the run's config.
        own_objective: the algorithm's objective is its own (PPO-dynamic's bounds, REINFORCE): only the loss types
            that change the aggregation apply.
        reply_advantages: its advantages are one per reply (the group algorithms'; PPO's value baseline gives one
            per token).
    """
    a = cfg.algo
    name = canonical(a.loss_type)
    what = f"algo.loss_type={a.loss_type}"
    if own_objective and name not in AGGREGATION_ONLY:
        raise ValueError(f"{what} replaces the objective, and algo.name={cls.name} has its own; use one of "
                         f"{', '.join(AGGREGATION_ONLY)} (how its token terms are averaged), or algo.name=grpo for "
                         "cispo, sapo, gmpo")
    if name == "gmpo" and not reply_advantages:
        raise ValueError(f"{what} weighs each reply by one advantage, and algo.name={cls.name}'s differ per token "
                         "(its value baseline); use algo.name=grpo")
    if getattr(a, "delta", None) is not None and name in ("cispo", "sapo", "gmpo"):
        raise ValueError(f"algo.delta={a.delta} caps the ratio of PPO's clipped objective, which {what} does not "
                         "have; leave algo.delta unset")
    if name == "cispo" and a.eps_high is None:
        raise ValueError(f"{what} caps the importance weight at algo.eps_high (its ε_max; ScaleRL uses 5.0), which "
                         "is not set")
    if name == "sapo" and getattr(a, "eps_high", None) is not None:
        raise ValueError(f"algo.eps_high={a.eps_high} is a clip bound, and {what} has no clip (its gate's "
                         "temperatures are algo.sapo_temperature_pos / _neg); leave algo.eps_high unset")
    if name == "gmpo" and getattr(a, "importance_sampling_level", "token") == "sequence":
        raise ValueError(f"algo.importance_sampling_level=sequence with {what}: GMPO's geometric mean of the token "
                         "ratios is already one ratio per reply; use importance_sampling_level=token")
    fixed = getattr(cfg.task_class, "fixed_reply_length", None)
    if a.mask_truncated_completions and fixed is not None:
        raise ValueError(f"algo.mask_truncated_completions=true with task.name={cfg.task.name}: its replies are "
                         f"{fixed} tokens with no end token, so every reply would count as truncated")
