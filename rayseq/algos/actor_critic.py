"""Batch advantage actor-critic (Keneshloo et al. survey Sec. III-B, Algorithm 3; Bahdanau et al. 2017).

Actor π_θ, critic V_ψ(s_t) (:class:`rayseq.models.critic.Critic` on the detached decoder state). Per batch of
sampled sequences with per-token rewards r_t (the task's reward on the last token):

    δ_t = r_t + γ V_ψ(s_{t+1}) − V_ψ(s_t),   A_t = Σ_k (γλ)^k δ_{t+k}   (GAE, :func:`rayseq.losses.gae`)
    actor   loss = −mean_t A_t log π_θ(y_t | s_t)                          (survey Eq. 22 with A_Ψ)
    critic  loss = mean_t (V_ψ(s_t) − G_t^λ)²,  G_t^λ = A_t + V_ψ(s_t)      (TD(λ) targets; Eq. 24 with λ = 1)

λ = ``algo.gae_lambda``. On episodes of an environment, ``algo.turn_credit=turn_gae`` runs the same over turns: the
critic is read at each turn's first sampled token (the state the turn starts from), trained on the turn-level
λ-returns, and every token of turn k gets A_k (:func:`rayseq.algos.turn_credit.turn_gae_advantages`, γ =
``algo.turn_gamma``). The first ``algo.critic_warmup`` iterations (added to ``train.iters``) train the critic
only, with the actor fixed (Bahdanau et al. 2017 pretrain their critic this way).
"""

from __future__ import annotations

import torch
from pydantic import Field

from rayseq.algos.common import (
    BASELINE_FIELDS,
    LearnerState,
    RolloutAlgo,
    advantages,
    grad_pass,
    optimizer_step,
    rollout_metrics,
    rollout_tensors,
    with_entropy,
)
from rayseq.algos.turn_credit import (
    CRITIC_TURN_FIELDS,
    check_turn_credit,
    rollout_turn_table,
    spread,
    turn_gae_advantages,
    turn_metrics,
)
from rayseq.losses import gae, reinforce_loss, value_loss
from rayseq.models import Critic
from rayseq.types import Rollout, to_torch

# the critic V_ψ (the learner builds it from critic_hidden, critic_lr) and its TD(λ) targets
CRITIC_FIELDS = {
    "gae_lambda": (float, Field(
        0.95, ge=0.0, le=1.0, description="Actor-critic / SeqGAN-critic: λ of TD(λ) targets and GAE (survey Sec. "
        "III-B).")),
    "critic_lr": (float, Field(1e-3, gt=0, description="Actor-critic / SeqGAN-critic: critic learning rate (Adam).")),
    "critic_hidden": (int, Field(
        128, ge=0, description="Critic MLP hidden size on the decoder state (0 = linear).")),
    "critic_warmup": (int, Field(
        0, ge=0, description="Actor-critic / SeqGAN-critic: iterations before the algorithm's budget that train the "
        "critic only (generator fixed, no d-steps), as Bahdanau et al. (2017) pretrain their critic.")),
}

def build_critic(run_cfg, generator, device) -> dict:
    """V_ψ(s_t) on the generator's per-step states (``algo.critic_hidden``) and its Adam (``algo.critic_lr``)."""
    critic = Critic(generator.state_dim, run_cfg.algo.critic_hidden).to(device)
    return {"critic": critic, "critic_opt": torch.optim.Adam(critic.parameters(), lr=run_cfg.algo.critic_lr)}


def with_warmup(run_cfg) -> int:
    """``train.iters`` plus the critic-only warm-up (``algo.critic_warmup``)."""
    return run_cfg.train.iters + run_cfg.algo.critic_warmup


def critic_step(modules: dict, values: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> dict:
    """One Adam step of the critic (``modules["critic"]``, ``modules["critic_opt"]``) towards ``targets`` on the
    unmasked tokens."""
    v_loss, v_stats = value_loss(values, targets, mask)
    optimizer_step(modules["critic_opt"], v_loss, modules["critic"].parameters(), None)
    return {"loss/critic": v_loss.item(), "critic/explained_variance": float(v_stats.explained_variance),
            "critic/value_mean": float(v_stats.value_mean)}


def critic_pass(state: LearnerState, critic, rollout: Rollout, gamma: float):
    """The rollout's tensors, the generator's teacher-forced pass, V_ψ(s_t) (B, T) and the rewards r_t (B, T)."""
    b = rollout_tensors(rollout, state.device, gamma)
    out = grad_pass(state.generator, b.src, b.src_len, b.tokens, bool(state.entropy_coef))
    return b, out, critic(out.states), to_torch(rollout.rewards, state.device)


def policy_step(cfg, state: LearnerState, out_g, adv: torch.Tensor, mask: torch.Tensor, train: bool) -> dict:
    """REINFORCE step with the given advantages on the generator pass ``out_g`` (``train=False``: the loss only,
    e.g. during critic warm-up)."""
    loss, stats = reinforce_loss(out_g.logp, adv, mask)
    out = {"loss/policy": loss.item(), "policy/advantage_mean": float(stats.advantage_mean),
           "critic/warmup": float(not train)}
    loss = with_entropy(state, loss, out_g.logits, mask, out, entropy=out_g.entropy)
    if train:
        out["policy/grad_norm"] = optimizer_step(state.gen_opt, loss, state.generator.parameters(), cfg.max_grad_norm)
    return out


class ActorCritic(RolloutAlgo):
    name = "actor_critic"
    fields = {k: BASELINE_FIELDS[k] for k in ("gamma", "normalize_advantages")} | CRITIC_FIELDS | CRITIC_TURN_FIELDS

    @classmethod
    def check_config(cls, cfg) -> None:
        check_turn_credit(cls, cfg)

    def build_modules(self, run_cfg, generator, task, device) -> dict:
        return build_critic(run_cfg, generator, device)

    def config_lrs(self, run_cfg) -> dict:
        return {**super().config_lrs(run_cfg), "critic_opt": run_cfg.algo.critic_lr}

    @classmethod
    def train_iters(cls, cfg) -> int:
        return with_warmup(cfg)

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        cfg = self.cfg
        b, out, values, rewards = critic_pass(state, self.modules["critic"], rollout, cfg.gamma)
        if cfg.turn_credit == "turn_gae":
            return self.turn_update(state, rollout, iteration, b, out, values)
        adv, targets = gae(rewards, values, b.token_mask, cfg.gamma, cfg.gae_lambda)
        adv = advantages(adv, torch.zeros_like(adv), b.action_mask, cfg.normalize_advantages)
        m = policy_step(cfg, state, out, adv, b.action_mask, train=iteration >= cfg.critic_warmup)
        m.update(critic_step(self.modules, values, targets, b.token_mask))
        return {**rollout_metrics(rollout), **m}

    def turn_update(self, state: LearnerState, rollout: Rollout, iteration: int, b, out, values) -> dict:
        """``algo.turn_credit=turn_gae``: V(s_k) at each turn's first sampled token, GAE over the turns, A_k on every
        token of turn k, the critic stepped towards the turn-level λ-returns."""
        cfg, dev = self.cfg, state.device
        table = rollout_turn_table(rollout)
        mask = torch.as_tensor(table.mask, dtype=torch.float32, device=dev)
        v_turn = values.gather(1, torch.from_numpy(table.start).to(dev)) * mask
        r_turn = torch.as_tensor(table.rewards, dtype=torch.float32, device=dev)
        adv_turn, targets = turn_gae_advantages(r_turn, v_turn, mask, cfg.turn_gamma, cfg.gae_lambda)
        adv = spread(adv_turn, table.column, rollout.action_mask).to(dev)
        adv = advantages(adv, torch.zeros_like(adv), b.action_mask, cfg.normalize_advantages)
        m = policy_step(cfg, state, out, adv, b.action_mask, train=iteration >= cfg.critic_warmup)
        m.update(critic_step(self.modules, v_turn, targets, mask))
        return {**rollout_metrics(rollout), **m, **turn_metrics(table, adv_turn.cpu().numpy())}
