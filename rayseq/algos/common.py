"""Pieces every algorithm uses: the learner's state, tensors from a Rollout, advantages, a step."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from pydantic import Field
from torch import nn

from rayseq.algos.iteration import counted, pipelined_step, rollout_step
from rayseq.algos.parallel import DataParallel
from rayseq.algos.regularizers import REGULARIZER_FIELDS, entropy_bonus
from rayseq.losses import discounted_returns, masked_mean
from rayseq.types import Rollout, RolloutRequest, to_torch


@dataclass
class LearnerState:
    generator: nn.Module
    baseline: nn.Module  # value baseline b(s_t) (Ranzato et al.)
    gen_opt: torch.optim.Optimizer
    base_opt: torch.optim.Optimizer
    device: torch.device
    critic: nn.Module | None = None  # V_ψ(s_t) of actor-critic / SeqGAN-critic (rayseq.models.critic)
    critic_opt: torch.optim.Optimizer | None = None
    entropy_coef: float = 0.0  # weight of the entropy bonus in rollout algorithms' policy losses (regularizers.py)
    rollout_policy: nn.Module | None = None  # SeqGAN's G_β (Monte-Carlo search), when it differs from G_θ
    dp: DataParallel | None = None  # this learner's rank when learner.num_learners > 1 (rayseq.algos.parallel)


@dataclass
class RolloutTensors:
    src: torch.Tensor  # (B, S) int64
    src_len: torch.Tensor  # (B,) int64
    tokens: torch.Tensor  # (B, T) int64
    token_mask: torch.Tensor  # (B, T) float
    action_mask: torch.Tensor  # (B, T) float
    old_logp: torch.Tensor  # (B, T) float, log π_old
    returns: torch.Tensor  # (B, T) float, R_t = Σ γ^{τ−t} r_τ

    def index(self, idx: torch.Tensor) -> RolloutTensors:
        return RolloutTensors(*(getattr(self, f)[idx] for f in self.__dataclass_fields__))


def rollout_tensors(rollout: Rollout, device, gamma: float) -> RolloutTensors:
    token_mask = to_torch(rollout.token_mask, device)
    return RolloutTensors(
        src=to_torch(rollout.src, device),
        src_len=to_torch(rollout.src_len, device),
        tokens=to_torch(rollout.tokens, device),
        token_mask=token_mask,
        action_mask=to_torch(rollout.action_mask, device),
        old_logp=to_torch(rollout.logp, device),
        returns=(
            discounted_returns(to_torch(rollout.rewards, device), token_mask, gamma)
            if rollout.returns is None
            else to_torch(rollout.returns, device) * token_mask
        ),
    )


def advantages(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, normalize: bool) -> torch.Tensor:
    """A_t = R_t − b(s_t) (Tuan et al. Eq. 1), optionally whitened over unmasked tokens; detached."""
    adv = (returns - values).detach()
    if normalize:
        mean = masked_mean(adv, mask)
        std = masked_mean((adv - mean) ** 2, mask).sqrt()
        adv = (adv - mean) / (std + 1e-8)
    return adv * mask


def step(opt: torch.optim.Optimizer, loss: torch.Tensor, params, max_grad_norm: float | None,
         dp: DataParallel | None = None) -> float:
    """Backward + optional grad-norm clip + step; returns the pre-clip gradient norm. ``dp``: the ranks' gradients
    (of their share-scaled losses) are summed first, so the norm is clipped and the step taken on the whole
    minibatch's gradient (:mod:`rayseq.algos.parallel`)."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for p in params if p.grad is not None]
    if dp is not None:
        dp.all_reduce_grads(params)
    if max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    else:
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])) if params else 0.0
    opt.step()
    return float(norm)


def with_entropy(state: LearnerState, loss: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor,
                 metrics: dict, share: float | None = None) -> torch.Tensor:
    """``loss`` − entropy_coef · H(π(·|s_t)) over ``mask`` (rayseq.algos.regularizers); logs policy/entropy.
    ``share``: a data-parallel rank's share of ``mask``'s sum, which scales the bonus (rayseq.algos.parallel)."""
    bonus, h = entropy_bonus(logits, mask, state.entropy_coef)
    if share is not None:
        bonus = bonus * share
    if state.entropy_coef:
        metrics["policy/entropy"] = h
    return loss + bonus


def rollout_metrics(rollout: Rollout) -> dict:
    return {
        "rollout/reward_mean": float(rollout.score.mean()),
        "rollout/len_mean": float(rollout.token_mask.sum(1).mean()),
    }


# algo.* keys of the algorithms that subtract a learned value baseline b(s_t) from the returns (Ranzato et al.):
# read here (rollout_tensors, advantages, RolloutAlgo.baseline_on) and by the learner (the baseline's optimizer).
# An algorithm's ``fields`` holds every algo.* key it reads besides name, lr and max_grad_norm (rayseq.config)
BASELINE_FIELDS = {
    "gamma": (float, Field(1.0, ge=0.0, le=1.0, description="Discount factor of returns.")),
    "baseline_lr": (float, Field(1e-2, gt=0, description="Value-baseline learning rate (Adam).")),
    "use_baseline": (bool, Field(
        True, description="Subtract the learned baseline b(s_t) (REINFORCE, MIXER, PPO: yes; the SeqGAN family's "
        "default is no, as its code uses Q directly).")),
    "normalize_advantages": (bool, Field(False, description="Whiten advantages per batch (not in the paper).")),
}
def returns_gamma(cfg) -> float:
    """γ of the returns R_t: ``algo.gamma``, or 1 for an algorithm that reads none because its R_t are given (SeqGAN's
    Q in ``Rollout.returns``) or unused (GRPO's group advantages)."""
    return getattr(cfg, "gamma", 1.0)


def baseline_lr(cfg) -> float:
    """The value baseline's Adam learning rate: ``algo.baseline_lr``, or its default for an algorithm that reads none
    (the learner keeps a baseline for every algorithm; such an algorithm never steps it)."""
    return getattr(cfg, "baseline_lr", BASELINE_FIELDS["baseline_lr"][1].default)


class Algorithm:
    """What an algorithm class declares, read without instantiating it (rayseq.registry):

    ``name``; ``kind`` ``"supervised"`` (updates on reference targets) or ``"rollout"`` (on sampled rollouts);
    ``fields``: every ``algo.*`` key it reads besides name, lr and max_grad_norm (and the regularizer's keys,
    :data:`rayseq.algos.regularizers.REGULARIZER_FIELDS`, when ``regularized``), as ``key -> (type, pydantic
    Field)``: rayseq.config validates, documents and prints them; ``defaults``: its own values of keys shared with
    other algorithms, resolved into the config; ``adversarial``: trains SeqGAN's discriminator (reads ``disc.*``);
    ``monte_carlo``, ``uses_critic``, ``needs_references``, ``needs_task_reward`` (traits, see rayseq.registry);
    ``needs_targets``: its prompts carry reference targets. ``seed`` is the run's seed: every random stream an
    algorithm draws derives from it (:func:`rayseq.seeding.derive_seed`).
    """

    name = ""
    kind = "rollout"
    fields: dict = {}  # algo.* keys it reads: key -> (type, pydantic Field); subclasses spread their parent's
    defaults: dict = {}
    adversarial = False
    monte_carlo = False  # Q from SeqGAN's Monte-Carlo search with a rollout policy G_β
    uses_critic = False  # the learner keeps a critic V_ψ(s_t)
    needs_references = False  # token-level reward increments against the input's reference replies
    needs_task_reward = False  # learns from the task's reward (not a discriminator's, not only references)
    needs_targets = False
    # how its iteration gives a sampled rollout its rewards (what the config checks read, e.g. rollout.pipeline):
    # "task" (the task's reward, on the workers or scorer actors), "monte_carlo_q" (SeqGAN's Q from Monte-Carlo
    # search scored by D), "discriminator" (D(Y))
    scoring = "task"
    stateful_request = False  # the learner's copy builds the rollout requests (state lives there: interpolation's λ)
    validate_every = 0  # its iteration validates every this many iterations (0: never; on_validation)
    regularized = False  # KL-to-pretrained in the reward and the entropy bonus apply (algo.kl_*, entropy_coef)
    # its loss weighs each sampled token by π_θ / π_behaviour with the log-probs recorded at sampling
    # (Rollout.logp), so rollouts sampled with older weights are corrected: it may train on pipelined rollouts
    # (rollout.pipeline, staleness 1)
    off_policy_ratio = False
    # its update runs on learner.num_learners ranks, each on its rows of every minibatch with its share of the
    # losses' denominators (rayseq.algos.parallel); the others run on one learner
    data_parallel = False

    def __init__(self, cfg, seed: int = 0):
        self.cfg = cfg
        self.seed = int(seed)

    @classmethod
    def config_fields(cls) -> dict:
        """Every ``algo.*`` key it reads besides name, lr and max_grad_norm: its ``fields``, then the KL and entropy
        keys when ``regularized`` (the learner applies those to every such algorithm: algos/regularizers.py)."""
        return {**cls.fields, **(REGULARIZER_FIELDS if cls.regularized else {})}

    # -- the iteration ------------------------------------------------------------------------------
    def training_step(self, groups, step) -> dict:
        """One iteration against the actor groups (:mod:`rayseq.algos.iteration`): sample → score → update, one
        policy step on the task's reward; the next iteration's batch goes out with the update (chained, staleness
        0), or with ``rollout.pipeline`` is sampled during it (staleness 1). Returns the iteration's metrics."""
        if step.cfg.rollout.pipeline:
            return counted(groups, lambda: pipelined_step(self, groups, step))
        return counted(groups, lambda: rollout_step(self, groups, step, chain=True))

    @classmethod
    def pretrain_steps(cls, cfg) -> int:
        """Iterations of the algorithm's own stage between MLE pretraining and ``train`` (stage ``disc``: SeqGAN's
        D pretraining); 0: none."""
        return 0

    def pretrain_step(self, groups, step) -> dict:
        """One iteration of that stage."""
        raise NotImplementedError(f"algo.name={self.name} has no pretraining stage of its own")

    def assign_scores(self, rollout: Rollout, parts: list) -> dict:
        """Give a sampled rollout the scores its iteration computed on the scorers (``parts``: per shard, fetched;
        in place, on the learner, before :meth:`update`); returns metrics."""
        raise NotImplementedError(f"algo.name={self.name} scores its rollouts with the task's reward only")

    # -- optional hooks (defaults: what most algorithms want) ------------------------------------------
    @classmethod
    def check_config(cls, cfg) -> None:
        """Raise ValueError on a run config this algorithm cannot run (called when the config is validated)."""

    def prompt_copies(self) -> int:
        """Samples per prompt: the driver repeats each input this many times in consecutive rows (1: none)."""
        return 1

    def augment(self, task, batch, rng, iteration: int):
        """Supervised algorithms may change their batch on the driver: (batch, metrics)."""
        return batch, {}

    def on_validation(self, state, reward: float) -> dict:
        """Called with the validation reward every ``validate_every`` iterations; returns metrics."""
        return {}

    def state_dict(self) -> dict:
        """Algorithm state that checkpoints keep (empty: none)."""
        return {}

    def load_state_dict(self, d: dict) -> None:
        """Restore :meth:`state_dict`."""


class SupervisedAlgo(Algorithm):
    """Updates on reference targets (MLE, RAML, data noising, scheduled sampling): one batch of (input, target)
    pairs per iteration, which :meth:`augment` may change on the driver (RAML's reward-weighted samples)."""

    kind = "supervised"

    def training_step(self, groups, step) -> dict:
        t0 = time.perf_counter()
        m: dict = {}
        batch = step.task.sample_prompts(step.rng, step.batch_size, with_targets=True)
        batch, aug = self.augment(step.task, batch, step.rng, step.stage_iter)
        if aug:
            m.update(aug)
            m["time/augment_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        m.update(groups.learner.update_batch(batch, step.stage_iter))
        m["time/learn_s"] = time.perf_counter() - t1
        return m


class RolloutAlgo(Algorithm):
    """Default request for on-policy rollout algorithms: sample every token from π_θ.

    ``algo.use_baseline``: subtract b(s_t) (the SeqGAN family's ``defaults`` turn it off).
    ``adversarial``: rewards come from a discriminator (SeqGAN family) as Q values in ``Rollout.returns``.
    """

    fields = BASELINE_FIELDS
    needs_task_reward = True
    regularized = True

    @property
    def baseline_on(self) -> bool:
        return bool(self.cfg.use_baseline)

    def values_for_advantage(self, values: torch.Tensor) -> torch.Tensor:
        """b(s_t), or 0 when this algorithm runs without a baseline (A_t = R_t, e.g. SeqGAN's Q)."""
        return values if self.baseline_on else torch.zeros_like(values)

    def rollout_request(self, iteration: int, max_len: int, temperature: float, seed: int) -> RolloutRequest:
        return RolloutRequest(max_len=max_len, temperature=temperature, seed=seed)
