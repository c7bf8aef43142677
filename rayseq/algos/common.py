"""Pieces every algorithm uses: the learner's state, tensors from a Rollout, the value baseline, advantages, a
step."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pydantic import Field
from torch import nn

from rayseq.algos.episode_metrics import episode_metrics
from rayseq.algos.iteration import Groups, Step, ahead_step
from rayseq.algos.parallel import DataParallel, is_dtensor, rows_without_grad
from rayseq.algos.regularizers import REGULARIZER_FIELDS, KLController, entropy_bonus, kl_penalty
from rayseq.losses import discounted_returns, masked_mean
from rayseq.losses.menu import token_entropy
from rayseq.losses.mismatch import logp_mismatch, truncated_is_weights
from rayseq.models.baseline import ValueBaseline
from rayseq.models.protocol import GeneratorOutput, lean_logprobs
from rayseq.types import PromptBatch, Rollout, RolloutRequest, to_torch


@dataclass
class LearnerState:
    generator: nn.Module
    gen_opt: torch.optim.Optimizer
    device: torch.device
    entropy_coef: float = 0.0  # weight of the entropy bonus in rollout algorithms' policy losses (regularizers.py)
    # rows per pass, with gradients or without (learner.micro_batch_size; None: micro_batch_rows decides)
    micro_batch: int | None = None
    dp: DataParallel | None = None  # this learner's rank when learner.num_learners > 1 (rayseq.algos.parallel)
    # the longest reply the task allows (its max_tgt_len): the constant of the losses that divide by it (Dr.GRPO)
    max_reply_len: int | None = None


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


def policy_pass(policy, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor, lean: bool) -> tuple:
    """``policy``'s teacher-forced log-probs (B, T) and states (B, T, H) of ``tokens``: with ``lean`` its pass
    that keeps no (B, T, V) logits (:func:`rayseq.models.protocol.lean_logprobs`), else ``logprobs``'."""
    if lean:
        return lean_logprobs(policy, src, src_len, tokens)
    out = policy.logprobs(src, src_len, tokens)
    return out.logp, out.states


def without_grad(state: LearnerState, fn, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor) -> tuple:
    """A forward pass without gradients over a batch, ``fn(src, src_len, tokens, lean) -> tuple of (m, ...)
    tensors``: one call on the whole batch, or (``learner.micro_batch_size`` set, several learner ranks, or a batch
    too large for the policy's one pass: an HF policy's ``fits_one_pass``) in row micro-batches of
    :func:`micro_batch_rows` shared by the ranks with ``lean`` passes (:func:`rayseq.algos.parallel.rows_without_grad`).
    Returns the tuple for every row."""
    length = src.shape[1] + tokens.shape[1]
    fits = getattr(state.generator, "fits_one_pass", None)  # a policy that bounds its passes itself (HF)
    if state.micro_batch is None and state.dp is None and (fits is None or fits(len(tokens), length)):
        with torch.no_grad():
            return fn(src, src_len, tokens, False)

    def rows(idx: torch.Tensor) -> tuple:
        idx = idx.to(tokens.device)
        return fn(src[idx], src_len[idx], tokens[idx], True)

    return rows_without_grad(rows, len(tokens), micro_batch_rows(state, length), state.dp)


def values_without_grad(state: LearnerState, value_fn, b: RolloutTensors) -> torch.Tensor:
    """``value_fn(states)`` (B, T) of every row of ``b`` (b(s_t), V_ψ(s_t)) on the generator's states from its pass
    without gradients (:func:`without_grad`: micro-batched, the rows shared by the learner ranks): the values an
    update that accumulates its gradients over micro-batches reads for the whole batch's advantages."""

    def values(src, src_len, tokens, lean):
        return (value_fn(policy_pass(state.generator, src, src_len, tokens, lean)[1]),)

    (out,) = without_grad(state, values, b.src, b.src_len, b.tokens)
    return out


def micro_batch_rows(state: LearnerState, length: int) -> int | None:
    """Rows per learner pass (with or without gradients) over rows of ``length`` = S + T positions:
    ``learner.micro_batch_size`` when set; else, for a policy that declares ``micro_batch_tokens`` (an HF policy),
    max(1, micro_batch_tokens // length), so an unset micro-batch is bounded by the lengths, not the batch; else None
    (the whole batch at once: the built-in models, whose passes are small)."""
    if state.micro_batch is not None:
        return state.micro_batch
    tokens = getattr(state.generator, "micro_batch_tokens", None)
    return None if tokens is None else max(1, int(tokens) // max(int(length), 1))


def micro_batches(idx: torch.Tensor, rows: int | None) -> list[torch.Tensor]:
    """``idx`` (m,) in consecutive pieces of at most ``rows`` (None: one piece) for gradient accumulation."""
    if rows is None or rows >= len(idx):
        return [idx]
    return list(torch.split(idx, rows))


def grad_micro_batches(state: LearnerState, n: int, length: int, row_cost: int = 1) -> list[torch.Tensor] | None:
    """The rows of a batch of ``n`` rows of ``length`` = S + T positions that this learner's gradient pass takes at a
    time, for an update that takes its whole batch in one step: None when it takes them all in one pass (one learner,
    and ``learner.micro_batch_size`` unset on a built-in model or not below ``n``: the update's one-pass code, bit for
    bit); else this rank's rows (:meth:`~rayseq.algos.parallel.DataParallel.part`; all of them with one learner) in
    micro-batches of :func:`micro_batch_rows` rows of the pass, ``row_cost`` of them per entry of the batch (a
    preference pair: 2), at least one entry (:func:`micro_batches`). Each micro-batch's loss is then scaled by its
    share of the batch's denominator (:meth:`~rayseq.algos.parallel.DataParallel.share`), the gradients accumulated,
    and one step taken (:func:`apply_gradients`): the update of one pass up to float rounding."""
    rows_per_pass = micro_batch_rows(state, length)
    if rows_per_pass is not None:
        rows_per_pass = max(1, rows_per_pass // row_cost)
    if state.dp is None and (rows_per_pass is None or rows_per_pass >= n):
        return None
    idx = torch.arange(n, device=state.device)
    if state.dp is not None:
        idx = state.dp.part(idx)
    return micro_batches(idx, rows_per_pass)


def reduce_metrics(state: LearnerState, sums: dict) -> dict:
    """Share-weighted metric sums of a learner's micro-batches, summed over the ranks (one learner: as they are)."""
    return sums if state.dp is None else state.dp.reduce(sums)


def grad_pass(policy, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor,
              entropy: bool = False) -> GeneratorOutput:
    """``policy``'s teacher-forced pass with gradients: its ``chunked_logprobs`` when it has one (an HF policy: the
    log-probs and, with ``entropy``, the entropies, without (B, T, V) logits; :mod:`rayseq.models.chunked`), else its
    ``logprobs`` (the logits kept, the entropies taken from them where needed: :func:`token_entropies`)."""
    chunked = getattr(policy, "chunked_logprobs", None)
    if chunked is None:
        return policy.logprobs(src, src_len, tokens)
    return chunked(src, src_len, tokens, entropy=entropy)


def token_entropies(out: GeneratorOutput) -> torch.Tensor:
    """H(π(·|s_t)) (B, T) of a pass: the entropies it computed, else from its logits."""
    return out.entropy if out.entropy is not None else token_entropy(out.logits)


def reference_logp(state: LearnerState, policy, rollout: Rollout) -> np.ndarray:
    """(B, T) log-probs under ``policy`` (π_ref of the KL penalty; the generator itself for an engine's samples,
    :func:`behaviour_logprobs`) of the rollout's tokens, without gradients (:func:`without_grad`: micro-batched, the
    rows shared by the learner ranks)."""
    return logp_without_grad(state, policy, rollout).cpu().numpy()


def logp_without_grad(state: LearnerState, policy, rollout: Rollout) -> torch.Tensor:
    """:func:`reference_logp` as a (B, T) tensor on the learner's device."""
    dev = state.device

    def logp(src, src_len, tokens, lean):
        return (policy_pass(policy, src, src_len, tokens, lean)[0],)

    (out,) = without_grad(state, logp, to_torch(rollout.src, dev), to_torch(rollout.src_len, dev),
                          to_torch(rollout.tokens, dev))
    return out


def behaviour_logprobs(state: LearnerState, rollout: Rollout, correction: str, cap: float) -> dict:
    """The policy's log-probs of an engine's samples, and their truncated importance weights, in place: a rollout
    sampled by an engine whose log-probs are not the policy's (``Rollout.engine_logp``, ``Rollout.logp`` None:
    ``rollout.engine=vllm``) gets

        logp_t = log π_θ(y_t | x, y_<t) · a_t        (teacher-forced, the learner's weights, a = action_mask)
        w_t    = min(exp(logp_t − log π_engine(y_t | …)), C)  on sampled tokens, 1 elsewhere   (``correction="tis"``)

    (:func:`rayseq.losses.mismatch.truncated_is_weights`; ``cap`` = C, ``rollout.tis_cap``; ``correction="none"``:
    no weights). The pass is the learners' pass without gradients (:func:`without_grad`: micro-batched, the rows shared
    by the ranks, reply positions only with lean passes), with the generator in evaluation mode as the workers sample.

    On a rollout sampled with the learner's weights (``rollout.max_staleness`` 0) this is π_old of Eq. 3 exactly, the
    learner's own computation. On one sampled ahead (staleness k ≥ 1) the learner no longer holds the weights that
    sampled it: π_θ is then its weights before this update (π_prox of the decoupled objective, Hilton et al. 2022),
    and w corrects the engine's sampling at the older weights towards them.

    Returns metrics: ``time/behaviour_logp_s``."""
    if rollout.engine_logp is None:
        raise ValueError("a rollout without log-probs (Rollout.logp None) is an engine's, with its own beside "
                         "(Rollout.engine_logp); this one has neither")
    t0 = time.perf_counter()
    dev = state.device
    action_mask = to_torch(rollout.action_mask, dev)
    generator = state.generator
    was_training = generator.training
    generator.eval()
    try:
        logp = logp_without_grad(state, generator, rollout).float() * action_mask
    finally:
        generator.train(was_training)
    rollout.logp = logp.cpu().numpy()
    if correction == "tis":
        rollout.is_weights = truncated_is_weights(logp, to_torch(rollout.engine_logp, dev), action_mask,
                                                  cap).cpu().numpy()
    return {"time/behaviour_logp_s": time.perf_counter() - t0}


def advantages(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, normalize: bool) -> torch.Tensor:
    """A_t = R_t − b(s_t) (Tuan et al. Eq. 1), optionally whitened over unmasked tokens; detached."""
    adv = (returns - values).detach()
    if normalize:
        mean = masked_mean(adv, mask)
        std = masked_mean((adv - mean) ** 2, mask).sqrt()
        adv = (adv - mean) / (std + 1e-8)
    return adv * mask


def optimizer_step(opt: torch.optim.Optimizer, loss: torch.Tensor, params, max_grad_norm: float | None,
         dp: DataParallel | None = None) -> float:
    """Backward + optional grad-norm clip + step; returns the pre-clip gradient norm. ``dp``: the ranks' gradients
    (of their share-scaled losses) are summed first, so the norm is clipped and the step taken on the whole
    minibatch's gradient (:mod:`rayseq.algos.parallel`)."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    return apply_gradients(opt, params, max_grad_norm, dp)


def apply_gradients(opt: torch.optim.Optimizer, params, max_grad_norm: float | None,
                    dp: DataParallel | None = None) -> float:
    """:func:`optimizer_step` after its backward: the gradients already in ``.grad`` (one backward pass, or several
    accumulated over micro-batches, each loss scaled by its share) summed over the ranks, clipped, stepped; returns
    the pre-clip norm."""
    params = [p for p in params if p.grad is not None]
    if dp is not None:
        dp.all_reduce_grads(params)
    if max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    elif params and is_dtensor(params[0].grad):  # a sharded learner's: the norm of the whole gradient, over the ranks
        norm = torch.nn.utils.clip_grad_norm_(params, float("inf"))
    else:
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])) if params else 0.0
    opt.step()
    return float(norm)


def with_entropy(state: LearnerState, loss: torch.Tensor, logits: torch.Tensor | None, mask: torch.Tensor,
                 metrics: dict, share: float | None = None, entropy: torch.Tensor | None = None) -> torch.Tensor:
    """``loss`` − entropy_coef · H(π(·|s_t)) over ``mask`` (rayseq.algos.regularizers); logs policy/entropy.
    ``share``: a data-parallel rank's (or a micro-batch's) share of ``mask``'s sum, which scales the bonus
    (rayseq.algos.parallel). ``entropy`` (B, T): the entropies, from a pass without ``logits``."""
    bonus, h = entropy_bonus(logits, mask, state.entropy_coef, entropy)
    if share is not None:
        bonus = bonus * share
    if state.entropy_coef:
        metrics["policy/entropy"] = h
    return loss + bonus


def rollout_metrics(rollout: Rollout) -> dict:
    out = {
        "rollout/reward_mean": float(rollout.score.mean()),
        "rollout/len_mean": float(rollout.token_mask.sum(1).mean()),
        **episode_metrics(rollout.extras),  # a rollout of episodes: episode/turns, success, failures, ...
    }
    if rollout.engine_logp is not None:  # an engine with its own log-probs (rayseq.losses.mismatch)
        mask = to_torch(rollout.action_mask)
        stats = logp_mismatch(to_torch(rollout.logp), to_torch(rollout.engine_logp), mask)
        out.update({"rollout/logp_diff_mean": float(stats.diff_mean), "rollout/logp_diff_max": float(stats.diff_max),
                    "rollout/engine_kl": float(stats.kl)})
        if rollout.is_weights is not None:
            out["rollout/is_weight_mean"] = float(masked_mean(to_torch(rollout.is_weights), mask))
        diffs = [p["engine_checksum_diff"] for p in rollout.info.get("parts", [rollout.info])
                 if "engine_checksum_diff" in p]
        if diffs:  # the engines' weights against the policy's after their last load (0: the same)
            out["sync/engine_checksum_diff"] = max(diffs)
    return out


# algo.* keys of the algorithms that subtract a learned value baseline b(s_t) from the returns (Ranzato et al.):
# read here (rollout_tensors, advantages, RolloutAlgo.baseline_on, value_baseline).
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
    """The value baseline's Adam learning rate: ``algo.baseline_lr``, or its default for an algorithm whose keys leave
    it out."""
    return getattr(cfg, "baseline_lr", BASELINE_FIELDS["baseline_lr"][1].default)


def value_baseline(run_cfg, generator: nn.Module, device: torch.device) -> dict:
    """The value baseline b(s_t) on the generator's per-step states (Ranzato et al.; zero at the start) and its Adam
    (``algo.baseline_lr``): ``{"baseline": ..., "base_opt": ...}``, first among the modules of an algorithm that
    reads it (:meth:`Algorithm.build_modules`)."""
    baseline = ValueBaseline(generator.state_dim).to(device)
    return {"baseline": baseline, "base_opt": torch.optim.Adam(baseline.parameters(), lr=baseline_lr(run_cfg.algo))}


class Algorithm:
    """An algorithm: what it declares (class attributes, read without instantiating it: rayseq.registry, rayseq.config),
    the modules it trains besides the generator, and its iteration.

    Declarations: ``name``; ``kind`` ``"supervised"`` (updates on reference targets) or ``"rollout"`` (on sampled
    rollouts); ``fields``: every ``algo.*`` key it reads besides name, lr and max_grad_norm (and the regularizer's
    keys, :data:`rayseq.algos.regularizers.REGULARIZER_FIELDS`, when ``regularized``), as ``key -> (type, pydantic
    Field)``; ``sections``: config sections of its own, ``name -> Section class`` (SeqGAN's ``disc:``);
    ``defaults``: its own values of keys shared with other algorithms, resolved into the config. rayseq.config
    validates, documents and prints all of them. The traits below say what the config checks and the learner need to
    know; nothing else branches on an algorithm.

    State: the learner calls :meth:`build_modules` once and keeps the result in ``modules`` (what a sharded learner
    wraps and what :meth:`state_dict` saves); rollout workers and scorers hold the copies
    :meth:`worker_modules` / :meth:`scorer_modules` declare and receive :meth:`worker_weights` /
    :meth:`scorer_weights`.

    Args:
        cfg: the run's ``algo:`` section (this algorithm's keys).
        seed: the run's seed; every random stream an algorithm draws derives from it
            (:func:`rayseq.seeding.derive_seed`).
    """

    name = ""
    kind = "rollout"
    fields: dict = {}  # algo.* keys it reads: key -> (type, pydantic Field); subclasses spread their parent's
    sections: dict = {}  # config sections of its own: section name -> rayseq.config.base.Section subclass
    defaults: dict = {}
    needs_references = False  # token-level reward increments against the input's reference replies
    needs_task_reward = False  # learns from the task's reward (not a discriminator's, not only references)
    needs_targets = False  # its prompts carry reference targets
    # its rewards come from a model it trains itself (SeqGAN's discriminator), computed by its iteration on the scorer
    # actors: the task's reward and reward.* are not read, the run has scorers, and its rollouts cannot be pipelined
    own_reward = False
    # the only task it trains on (the reward model: task.name=preferences, pairs no other task has); None: any task.
    # The tests that run every algorithm on every task skip it; its own tests cover it
    own_task: str | None = None
    stateful_request = False  # the learner's copy builds the rollout requests (state lives there: interpolation's λ)
    validate_every = 0  # its iteration validates every this many iterations (0: never; on_validation)
    regularized = False  # KL-to-pretrained in the reward and the entropy bonus apply (algo.kl_*, entropy_coef)
    # its loss weighs each sampled token by π_θ / π_behaviour with the log-probs recorded at sampling
    # (Rollout.logp), so rollouts sampled with older weights are corrected: it may train on rollouts sampled
    # ahead of the learner (rollout.max_staleness)
    off_policy_ratio = False
    # its update runs on learner.num_learners ranks, each on its rows of every minibatch with its share of the
    # losses' denominators (rayseq.algos.parallel); the others run on one learner
    data_parallel = False
    pretrain_label = ""  # the progress label of its own pretraining stage (pretrain_steps > 0)
    # the figures its iterations show in the progress line: metric name -> label (those its metrics have)
    progress_metrics = {"rollout/reward_mean": "reward", "loss/nll": "nll"}

    # of its modules, those ``train.init_from`` takes from another run's checkpoint when that run holds them too (the
    # learner reads them, whole or from shards); what it pretrains itself it takes in init_from
    carried: tuple = ("baseline",)

    def __init__(self, cfg: Any, seed: int = 0):
        self.cfg = cfg
        self.seed = int(seed)
        self.modules: dict = {}  # what build_modules returned (on the learner; empty elsewhere)
        # β of the KL penalty (algos/regularizers.py): fixed, or adapted towards algo.kl_target
        self.kl = KLController(cfg.kl_coef, cfg.kl_target) if self.regularized else None

    @classmethod
    def config_fields(cls) -> dict:
        """Every ``algo.*`` key it reads besides name, lr and max_grad_norm: its ``fields``, then the KL and entropy
        keys when ``regularized`` (the KL penalty applied by :meth:`learn`, the entropy bonus by the updates:
        algos/regularizers.py)."""
        return {**cls.fields, **(REGULARIZER_FIELDS if cls.regularized else {})}

    @classmethod
    def train_iters(cls, cfg) -> int:
        """Iterations of the ``train`` stage for run config ``cfg``: ``train.iters`` (critic algorithms add their
        critic-only warm-up)."""
        return cfg.train.iters

    # -- the iteration ------------------------------------------------------------------------------
    def training_step(self, groups: Groups, step: Step) -> dict:
        """One iteration against the actor groups (:mod:`rayseq.algos.iteration`): sample → update, one policy step
        on the task's reward, with ``rollout.max_staleness`` = k batches sampling ahead of the learner (k = 0: the
        next one goes out right behind the update, sampled with its weights); :func:`~.iteration.ahead_step`.

        Args:
            groups: the run's actor groups (:class:`rayseq.algos.iteration.Groups`).
            step: the driver's side of the iteration (:class:`rayseq.algos.iteration.Step`).

        Returns:
            The iteration's metrics (the driver adds timing, counters and evaluation).
        """
        return ahead_step(self, groups, step)

    @classmethod
    def pretrain_steps(cls, cfg) -> int:
        """Iterations of the algorithm's own stage between MLE pretraining and ``train`` (SeqGAN's D pretraining;
        its progress label: ``pretrain_label``); 0: none."""
        return 0

    def pretrain_step(self, groups, step) -> dict:
        """One iteration of that stage (arguments and result as :meth:`training_step`'s)."""
        raise NotImplementedError(f"algo.name={self.name} has no pretraining stage of its own")

    def learn(self, state: LearnerState, batch: Rollout | PromptBatch, iteration: int) -> dict:
        """What the learner runs on a batch: :meth:`update`; while it holds π_ref (a regularized algorithm with
        ``algo.kl_coef`` > 0, in its ``train`` stage) the rollout is first penalised by its KL to π_ref
        (:func:`rayseq.algos.regularizers.kl_penalty`), whose metrics join the update's.

        Args and result: as :meth:`update`'s.
        """
        if "ref_policy" not in self.modules:
            return self.update(state, batch, iteration)
        penalty = kl_penalty(batch, reference_logp(state, self.modules["ref_policy"], batch), self.kl)
        return {**self.update(state, batch, iteration), **penalty}

    def update(self, state: LearnerState, batch: Rollout | PromptBatch, iteration: int) -> dict:
        """The update on the learner.

        Args:
            state: the learner's generator, its optimizer, device and data-parallel rank (what the algorithm trains
                besides the generator is in ``self.modules``).
            batch: a :class:`rayseq.types.Rollout` (``kind="rollout"``) or a :class:`rayseq.types.PromptBatch` with
                targets (``kind="supervised"``).
            iteration: the iteration within the stage (0-based).

        Returns:
            The update's metrics.
        """
        raise NotImplementedError

    def assign_scores(self, rollout: Rollout, parts: list) -> dict:
        """Give a sampled rollout the scores its iteration computed on the scorers (in place, on the learner, before
        :meth:`update`).

        Args:
            rollout: the rollout the learner assembled from the shards.
            parts: what the scorers returned, per shard, fetched.

        Returns:
            Metrics.
        """
        raise NotImplementedError(f"algo.name={self.name} scores its rollouts with the task's reward only")

    def aux_update(self, state: LearnerState, positives: PromptBatch, negatives: Rollout, seed: int) -> dict:
        """An update of a model of its own on real examples against sampled ones (SeqGAN's d-step), on the learner.

        Args:
            state: as :meth:`update`'s.
            positives: real (input, target) pairs, a :class:`rayseq.types.PromptBatch`.
            negatives: sampled replies.
            seed: the seed of its shuffling.

        Returns:
            Metrics.
        """
        raise NotImplementedError(f"algo.name={self.name} trains no model besides the generator")

    # -- what it holds ------------------------------------------------------------------------------
    def build_modules(self, run_cfg: Any, generator: nn.Module, task: Any, device: torch.device) -> dict:
        """The modules and optimizers it trains besides the generator, built once by the learner, which keeps them in
        ``self.modules``: saved by :meth:`state_dict`, given their learning rates by :meth:`config_lrs`. An algorithm
        whose update reads the value baseline b(s_t) returns :func:`value_baseline`'s first; one that does not holds
        none.

        Args:
            run_cfg: the whole run config (:class:`rayseq.config.RunConfig`).
            generator: the learner's generator (on ``device``).
            task: the run's task (its vocabulary sizes the models).
            device: the learner's torch device.

        Returns:
            ``{name: nn.Module or torch.optim.Optimizer}`` (empty: none).
        """
        return {}

    def frozen_copies(self) -> tuple[str, ...]:
        """Names of the frozen copies of the generator it reads, taken as the ``train`` stage starts and kept in
        ``modules``: the learner builds them (its strategy: a sharded learner's sharded the same way). A regularized
        algorithm with ``algo.kl_coef`` > 0 reads π_ref, ``ref_policy``, in :meth:`learn`."""
        return ("ref_policy",) if self.kl is not None and self.kl.coef > 0 else ()

    @classmethod
    def worker_modules(cls, run_cfg, task, device) -> dict:
        """Copies a rollout worker holds besides the generator (SeqGAN's G_β), loaded from :meth:`worker_weights`:
        ``{name: nn.Module}``."""
        return {}

    @classmethod
    def scorer_modules(cls, run_cfg, task, device) -> dict:
        """Copies a scorer actor holds (SeqGAN's D), loaded from :meth:`scorer_weights`: ``{name: nn.Module}``."""
        return {}

    def worker_weights(self) -> dict:
        """``{name: state dict}`` of :meth:`worker_modules` the learner publishes with the generator's weights."""
        return {}

    def scorer_weights(self) -> tuple[int, dict]:
        """(version, ``{name: state dict}`` of :meth:`scorer_modules`): the scorers load them when the version is
        new to them. Version 0 with nothing: the scorers hold nothing of this algorithm's."""
        return 0, {}

    def config_lrs(self, run_cfg) -> dict:
        """``{optimizer name in modules: learning rate}`` from the config (re-applied after a checkpoint is loaded:
        a resumed run or a Tune PBT exploit uses its own rates): the value baseline's, when it holds one (an
        algorithm that declares more optimizers adds theirs to this)."""
        return {"base_opt": baseline_lr(run_cfg.algo)} if "base_opt" in self.modules else {}

    def start(self, state: LearnerState) -> None:
        """The ``train`` stage starts on the learner (the generator is pretrained): e.g. SeqGAN's G_β ← G_θ."""

    def state_dict(self) -> dict:
        """What checkpoints keep of it: each module's and optimizer's state dict under its name, and what it keeps
        beside them (:meth:`state_beside_modules`)."""
        return {**{k: module.state_dict() for k, module in self.modules.items()}, **self.state_beside_modules()}

    def state_beside_modules(self) -> dict:
        """What it keeps beside its modules' state dicts (what a sharded checkpoint writes beside their shards): β of
        the KL penalty while it holds π_ref (``kl_coef``), and its own state (:meth:`own_state_dict`)."""
        kl = {"kl_coef": self.kl.coef} if "ref_policy" in self.modules else {}
        return {**kl, **self.own_state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (a module missing from ``state`` keeps its own)."""
        for k, module in self.modules.items():
            if k in state:
                module.load_state_dict(state[k])
        if "ref_policy" in self.modules and "kl_coef" in state:
            self.kl.coef = float(state["kl_coef"])
        self.load_own_state_dict(state)

    def own_state_dict(self) -> dict:
        """Its state beside the modules (counters, schedules); empty: none."""
        return {}

    def load_own_state_dict(self, state: dict) -> None:
        """Restore :meth:`own_state_dict`."""

    def init_from(self, state: dict) -> dict:
        """Start from another run's pretrained state (``train.init_from``): take what it has of what this algorithm
        pretrains itself.

        Args:
            state: that run's algorithm entries (:meth:`state_dict`'s).

        Returns:
            ``{what: whether it was there}`` for each thing the algorithm pretrains (SeqGAN: its discriminator); a
            missing one is pretrained in the algorithm's own stage.
        """
        return {}

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

    def evaluate_saved(self, location: str, generator: nn.Module, task: Any, split: str,
                       device: str) -> tuple[dict, dict]:
        """The ``split`` figures of a saved run (``location``: its checkpoint) whose trained ``generator`` is given,
        in this process, as its training evaluates it: the task's evaluation by default."""
        return task.evaluate(generator, device, split=split)


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
