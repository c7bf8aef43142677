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

from collections import defaultdict
from dataclasses import dataclass

import torch
from pydantic import Field

from rayseq.algos.common import (
    BASELINE_FIELDS,
    LearnerState,
    RolloutAlgo,
    advantages,
    apply_gradients,
    grad_micro_batches,
    grad_pass,
    optimizer_step,
    reduce_metrics,
    rollout_metrics,
    rollout_tensors,
    values_without_grad,
    with_entropy,
)
from rayseq.algos.parallel import DataParallel
from rayseq.algos.turn_credit import (
    CRITIC_TURN_FIELDS,
    check_turn_credit,
    rollout_turn_table,
    spread,
    turn_gae_advantages,
    turn_metrics,
)
from rayseq.losses import gae, masked_mean, reinforce_loss, value_loss
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

@dataclass
class CriticFit:
    """Where the critic is fitted: ``mask`` (B, K) the positions (every token, K = T; or each turn), ``targets``
    (B, K) their λ-returns, ``start`` (B, K) the token each turn's value is read at (None: every token's)."""

    mask: torch.Tensor
    targets: torch.Tensor | None = None
    start: torch.Tensor | None = None

    def read(self, values: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """V at the fitted positions of ``values`` (B, T), the values of ``rows`` of the batch when given."""
        if self.start is None:
            return values
        start, mask = (self.start, self.mask) if rows is None else (self.start[rows], self.mask[rows])
        return values.gather(1, start) * mask


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
    data_parallel = True  # several learners: each its rows in micro-batches (accumulated_update)
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
        pieces = grad_micro_batches(state, len(rollout), rollout.src.shape[1] + rollout.tokens.shape[1])
        if pieces is not None:  # learner.micro_batch_size rows at a time
            return self.accumulated_update(state, rollout, iteration, pieces)
        b, out, values, _ = critic_pass(state, self.modules["critic"], rollout, cfg.gamma)
        adv, fit, extra = self.advantages_and_targets(rollout, b, values)
        m = policy_step(cfg, state, out, adv, b.action_mask, train=iteration >= cfg.critic_warmup)
        m.update(critic_step(self.modules, fit.read(values), fit.targets, fit.mask))
        return {**rollout_metrics(rollout), **m, **extra}

    def advantages_and_targets(self, rollout: Rollout, b, values: torch.Tensor) -> tuple:
        """(A_t (B, T), the critic's :class:`CriticFit`, metrics) from V_ψ(s_t) (B, T): per token, GAE over the tokens
        towards the TD(λ) targets; with ``algo.turn_credit=turn_gae``, V read at each turn's first sampled token, GAE
        over the turns, A_k on every token of turn k and the turn-level λ-returns as targets."""
        cfg, dev = self.cfg, b.tokens.device
        extra: dict = {}
        if cfg.turn_credit == "turn_gae":
            table = rollout_turn_table(rollout)
            fit = CriticFit(torch.as_tensor(table.mask, dtype=torch.float32, device=dev), None,
                            torch.from_numpy(table.start).to(dev))
            r_turn = torch.as_tensor(table.rewards, dtype=torch.float32, device=dev)
            adv_turn, fit.targets = turn_gae_advantages(r_turn, fit.read(values), fit.mask, cfg.turn_gamma,
                                                        cfg.gae_lambda)
            adv = spread(adv_turn, table.column, rollout.action_mask).to(dev)
            extra = turn_metrics(table, adv_turn.cpu().numpy())
        else:
            fit = CriticFit(b.token_mask)
            adv, fit.targets = gae(to_torch(rollout.rewards, dev), values, b.token_mask, cfg.gamma, cfg.gae_lambda)
        return advantages(adv, torch.zeros_like(adv), b.action_mask, cfg.normalize_advantages), fit, extra

    def accumulated_update(self, state: LearnerState, rollout: Rollout, iteration: int, pieces: list) -> dict:
        """:meth:`update` with its gradients accumulated over ``pieces`` (this rank's rows in micro-batches,
        :func:`~rayseq.algos.common.grad_micro_batches`). V_ψ(s_t) of every row comes first from the generator's pass
        without gradients (:func:`~rayseq.algos.common.values_without_grad`), so the advantages and the critic's
        targets are the one pass's; then per micro-batch m, with D^a its sampled tokens and D^v the critic's fitted
        positions (tokens, or turns):

            L_m = (D^a_m / D^a) · (−mean_{t∈m} A_t log π_θ(y_t | s_t) − entropy_coef · H_m)
            C_m = (D^v_m / D^v) · mean_m (V_ψ − G^λ)²

        backward (the actor's only after the critic warm-up), and one step of each optimizer."""
        cfg, critic, share = self.cfg, self.modules["critic"], DataParallel.share
        b = rollout_tensors(rollout, state.device, cfg.gamma)
        values = values_without_grad(state, critic, b)
        adv, fit, extra = self.advantages_and_targets(rollout, b, values)
        train = iteration >= cfg.critic_warmup
        state.gen_opt.zero_grad(set_to_none=True)
        self.modules["critic_opt"].zero_grad(set_to_none=True)
        sums: dict = defaultdict(float)
        for rows in pieces:
            part = b.index(rows)
            w, w_fit = share(part.action_mask, b.action_mask), share(fit.mask[rows], fit.mask)
            out = grad_pass(state.generator, part.src, part.src_len, part.tokens, bool(state.entropy_coef))
            loss, _ = reinforce_loss(out.logp, adv[rows], part.action_mask)
            sums["loss/policy"] += loss.item() * w
            m: dict = {}
            loss = with_entropy(state, loss * w, out.logits, part.action_mask, m, w, out.entropy)
            if train:
                loss.backward()
            v_loss = value_loss(fit.read(critic(out.states), rows), fit.targets[rows], fit.mask[rows])[0] * w_fit
            v_loss.backward()
            sums["loss/critic"] += v_loss.item()
            for k, v in m.items():
                sums[k] += v * w
            del out, loss  # this micro-batch's graph and activations, before the next one's
        m = {**reduce_metrics(state, dict(sums)), "policy/advantage_mean": float(masked_mean(adv, b.action_mask)),
             "critic/warmup": float(not train)}
        if train:
            m["policy/grad_norm"] = apply_gradients(state.gen_opt, state.generator.parameters(), cfg.max_grad_norm,
                                                    state.dp)
        apply_gradients(self.modules["critic_opt"], critic.parameters(), None, state.dp)
        _, v_stats = value_loss(fit.read(values), fit.targets, fit.mask)  # of every row: the one pass's figures
        m.update({"critic/explained_variance": float(v_stats.explained_variance),
                  "critic/value_mean": float(v_stats.value_mean)})
        return {**rollout_metrics(rollout), **m, **extra}
