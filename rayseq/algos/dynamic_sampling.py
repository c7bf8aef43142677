"""Dynamic sampling for the group algorithms (GRPO, RLOO, GRPO-dynamic): DAPO, Yu et al. 2025, "DAPO: An
Open-Source LLM Reinforcement Learning System at Scale", Sec. 3.2 and Algorithm 1.

A group of G replies to one prompt whose rewards are all equal (all correct, all wrong) has advantage 0 for every
reply under GRPO's normalisation and RLOO's leave-one-out baseline alike: it adds no gradient, only dilutes the
batch's mean. DAPO's objective keeps only groups with 0 < |{correct o_i}| < G; its Algorithm 1 samples a batch,
drops the groups with equal rewards into nothing, keeps the others in a buffer and samples another batch until the
buffer holds the training batch. Here (``algo.dynamic_sampling=true``):

1. each round draws ``train.batch_size / G`` fresh prompts from the data stream (the driver's data RNG, which
   checkpoints keep) and samples G replies to each with the current weights (one weights version per iteration:
   every round is on-policy);
2. its rewards come back to the driver (B floats; the replies stay in the object store), and the groups whose
   rewards are not all equal are kept, in sampling order, until ``batch_size / G`` groups are kept (the rest of the
   round is dropped, as DAPO's buffer is cut to the batch);
3. at most ``algo.max_resample_rounds`` rounds after the first. **When the cap is reached with the batch short, the
   update trains on the groups kept** (a smaller batch; ``group/kept_groups`` says how many); when no group at all
   had distinct rewards, the iteration makes no update (there is no gradient to take; the weights, the optimizer
   and the learner's version stay as they are; ``group/kept_groups`` = 0). veRL raises an error at its cap and
   SkyRL stops training; a rayseq run goes on and logs it. An iteration that trains on fewer than half the batch's
   groups is also said in a warning (the first such iteration, then the 10th, the 100th, ...): the progress line's
   reward is then the few kept groups', and a policy that solves every prompt or none gets almost no signal.

The learner receives the kept rows' shards by reference and selects the rows there (``LearnerGroup.update(...,
rows=)``). Metrics: ``group/all_equal_frac`` (of every group sampled this iteration), ``group/resample_rounds``
(rounds after the first), ``group/prompts_consumed`` (prompts drawn this iteration), ``group/kept_groups``,
``group/sampled_reward_mean`` (the mean reward of every reply sampled this iteration: the policy's reward, unbiased;
``rollout/reward_mean`` is then the trained batch's, from which the all-correct groups were dropped); with
``reward.*`` each term's ``reward/<name>`` is also over every sampled reply (logged when no update is made too).

Rounds are synchronous (each waits for its rewards), so no batch is sampled ahead of the learner (the default
iteration's queue, ``ahead_step``) and ``rollout.max_staleness`` ≥ 1 is refused. Round 0 samples with the seed the plain
iteration would use; round r ≥ 1 with :func:`resample_seed`.
"""

from __future__ import annotations

import logging
import time

import numpy as np
from pydantic import Field

from rayseq.seeding import derive_seed

log = logging.getLogger(__name__)

DYNAMIC_SAMPLING_FIELDS = {
    "dynamic_sampling": (bool, Field(
        False, description="GRPO / RLOO / GRPO-dynamic: DAPO's dynamic sampling (Yu et al. 2025, Sec. 3.2): drop "
        "the groups whose rewards are all equal (advantage 0) and sample fresh prompts until the batch is full "
        "(rayseq.algos.dynamic_sampling).")),
    "max_resample_rounds": (int, Field(
        4, ge=0, description="Dynamic sampling: at most this many sampling rounds after the first per iteration; "
        "at the cap the update trains on the groups kept (none kept: no update).")),
}


def informative_groups(score: np.ndarray, group_size: int) -> np.ndarray:
    """(B,) rewards in consecutive groups of G -> (B/G,) bool: the group's rewards are not all equal."""
    r = np.asarray(score, dtype=np.float64).reshape(-1, group_size)
    return r.max(1) > r.min(1)


def resample_seed(run_seed: int, iteration: int, round_: int) -> int:
    """The sampling seed of resampling round ``round_`` (≥ 1) of ``iteration`` (its own stream: no round shares the
    seed of another round or of any iteration's first round)."""
    return derive_seed(run_seed, "dynamic_sampling", iteration, round_) % 2**40


def check_dynamic_sampling(cls, cfg) -> None:
    """What dynamic sampling cannot run with."""
    if cfg.algo.dynamic_sampling and cfg.rollout.max_staleness:
        raise ValueError(f"algo.dynamic_sampling=true: algo.name={cls.name} decides after each round's rewards "
                         f"whether to sample again, which rollout.max_staleness={cfg.rollout.max_staleness} (sampling "
                         "the next batches during the update) cannot; set rollout.max_staleness=0 and "
                         "rollout.pipeline=false")


def select_groups(round_scores: list[np.ndarray], group_size: int, wanted: int) -> np.ndarray:
    """Row indices (into the rounds' rows concatenated in order) of the first ``wanted`` groups whose rewards are not
    all equal; fewer when the rounds hold fewer."""
    score = np.concatenate(round_scores)
    groups = np.flatnonzero(informative_groups(score, group_size))[:wanted]
    return (groups[:, None] * group_size + np.arange(group_size)).reshape(-1)


def shards_holding(lengths: list[int], rows: np.ndarray) -> tuple[list[int], np.ndarray]:
    """Of shards of ``lengths`` rows, concatenated in order, the ones holding any of ``rows``, and ``rows`` as positions
    in the concatenation of those shards alone."""
    ends = np.cumsum(lengths)
    starts = ends - np.asarray(lengths)
    used = [i for i in range(len(lengths)) if np.any((rows >= starts[i]) & (rows < ends[i]))]
    position = np.full(int(ends[-1]), -1, dtype=np.int64)
    at = 0
    for i in used:
        position[starts[i]:ends[i]] = np.arange(at, at + lengths[i])
        at += lengths[i]
    return used, position[rows]


def dynamic_sampling_step(algo, groups, step) -> dict:
    """One iteration of a group algorithm with dynamic sampling (module docstring), against the actor groups."""
    return _step(algo, groups, step)


def _step(algo, groups, step) -> dict:
    cfg = algo.cfg
    G = cfg.group_size
    wanted = step.batch_size // G
    t0 = time.perf_counter()
    groups.rollout.sync_weights()
    t1 = time.perf_counter()
    shards: list = []  # every round's shard handles, in order
    shard_scores: list[np.ndarray] = []  # their rewards (B_i,)
    shard_terms: list = []  # their reward terms (B_i, K), or None
    for round_ in range(cfg.max_resample_rounds + 1):
        seed = step.seed(step.iteration) if round_ == 0 else resample_seed(step.cfg.seed, step.iteration, round_)
        handles, scores, terms = groups.rollout.sample_scored(step.prompts(algo), step.request(algo, seed))
        shards += handles
        shard_scores += scores
        shard_terms += terms
        rows = select_groups(shard_scores, G, wanted)
        if len(rows) == wanted * G:
            break
    t2 = time.perf_counter()
    score = np.concatenate(shard_scores)
    equal = ~informative_groups(score, G)
    kept = len(rows) // G
    m: dict = {}
    if kept:  # only the shards holding kept rows go to the learner
        used, used_rows = shards_holding([len(s) for s in shard_scores], rows)
        m = groups.learner.update([shards[i] for i in used], step.stage_iter, rows=used_rows)
    t3 = time.perf_counter()
    if 2 * kept < wanted:
        _warn_short_batch(algo, step.iteration, kept, wanted, round_, equal)
    if shard_terms and shard_terms[0] is not None:  # reward.*: each term over every sampled reply, as reward/<name>
        m.update(step.task.reward.metrics(np.concatenate(shard_terms)))
    m.update({
        "group/all_equal_frac": float(equal.mean()),
        "group/resample_rounds": float(round_),
        "group/prompts_consumed": float(len(score) // G),
        "group/kept_groups": float(kept),
        "group/sampled_reward_mean": float(score.mean()),
        "time/sync_s": t1 - t0, "time/rollout_s": t2 - t1, "time/learn_s": t3 - t2,
    })
    return m


def _warn_short_batch(algo, iteration: int, kept: int, wanted: int, rounds: int, equal: np.ndarray) -> None:
    """The warning of an iteration that trains on fewer than half the batch's groups: the 1st, 10th, 100th, ... such
    iteration of the run (counted on the driver's algorithm object)."""
    n = getattr(algo, "_short_batches", 0) + 1
    algo._short_batches = n
    if str(n).rstrip("0") != "1":
        return
    what = f"trained on {kept} of the batch's {wanted} groups" if kept else "made no update (no group kept)"
    so_far = f" ({n} such iterations so far)" if n > 1 else ""
    log.warning("algo.dynamic_sampling: iteration %d %s after %d resample round(s): %.1f%% of the %d groups sampled "
                "had rewards all equal (the policy solves all of a prompt's replies or none: no learning signal; "
                "group/all_equal_frac)%s. algo.max_resample_rounds=%d samples more rounds; a reward the policy "
                "never or always earns teaches it nothing", iteration, what, rounds, 100 * float(equal.mean()),
                len(equal), so_far, algo.cfg.max_resample_rounds)
