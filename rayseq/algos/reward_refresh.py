"""A reward model refreshed online during RL (``reward.refresh`` of a ``reward_model`` term): SeqGAN's schedule of
discriminator steps on fresh policy samples (:mod:`rayseq.algos.seqgan`), generalised to a Bradley–Terry reward
model and a labeller the user names.

Every ``refresh.every`` iterations of the ``train`` stage (:func:`refresh_step`, run by the driver after the
algorithm's iteration, whatever the algorithm):

1. the rollout workers sample G = ``refresh.group_size`` replies to each of ``refresh.prompts`` prompts with the
   current policy (rows g·G … g·G + G − 1 answer one prompt);
2. on every learner rank (:class:`RewardRefresh`), the labeller (``refresh.labeller``: the task's reward, a gold
   reward, any reward function) scores them, s (B,), and each group gives its pairs (:func:`preference_pairs`):
   every (i, j) of one group with s_i ≠ s_j (ties dropped), y_i preferred when s_i > s_j, or — with a temperature
   τ = ``refresh.temperature`` > 0 — with the Bradley–Terry probability

       P(y_i ≻ y_j) = σ((s_i − s_j) / τ);

3. ``refresh.steps`` Adam steps (``refresh.lr``) on the reward model's weights (its policy body and scalar head), each
   on ``refresh.batch_size`` pairs — a fraction ``refresh.mix`` of them drawn from a fixed preference file
   (``refresh.preferences``, when given), the rest from the fresh ones — of the Bradley–Terry loss

       L = −(1/B) Σ_k log σ(r(x_k, y⁺_k) − r(x_k, y⁻_k))        (:func:`rayseq.losses.preference.bradley_terry_loss`);

4. the new weights go to the scorer actors (their version is new) before the next batch is scored, and into the
   run's checkpoints (a resumed run scores and refreshes with them).

Metrics: ``reward_model/refresh_accuracy`` (the fraction of the fresh pairs the reward model ranked as the labeller
did, before it trained on them: its accuracy on the current policy's replies, which it has not seen),
``reward_model/refresh_loss`` (L, the mean over the steps, each before its update), ``reward_model/pairs`` (pairs
built), ``reward_model/fixed_pairs`` (the file's pairs in each step) and ``reward_model/version`` (refreshes so
far). A refresh whose groups are all tied (no pair) leaves the model as it is.

References: Yu et al. (2017, SeqGAN Algorithm 1: the discriminator retrained on fresh samples); Ouyang et al. (2022,
Eq. 1); Gao et al. (2022) on optimising a fixed proxy reward model.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from rayseq import registry
from rayseq.data.preferences import read_preferences
from rayseq.losses.preference import bradley_terry_loss
from rayseq.rewards.reward import Reward, Term
from rayseq.rewards.trained import load_refreshed, load_scorer
from rayseq.seeding import derive_seed
from rayseq.types import Rollout, RolloutRequest


def preference_pairs(scores: np.ndarray, group_size: int, temperature: float = 0.0,
                     rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(chosen (P,), rejected (P,)) row indices of the pairs of ``scores`` (B,) in groups of ``group_size``
    consecutive rows (module docstring, step 2): every i < j of a group with s_i ≠ s_j, in group order; τ = 0:
    chosen the higher-scored; τ > 0: y_i chosen with probability σ((s_i − s_j)/τ), drawn from ``rng``."""
    scores = np.asarray(scores, dtype=np.float64)
    if len(scores) % group_size:
        raise ValueError(f"{len(scores)} replies are not groups of {group_size}")
    chosen, rejected = [], []
    for g in range(0, len(scores), group_size):
        for i in range(g, g + group_size):
            for j in range(i + 1, g + group_size):
                diff = scores[i] - scores[j]
                if diff == 0:
                    continue  # a tie says nothing about which is better
                first = diff > 0 if temperature == 0 else rng.random() < 1.0 / (1.0 + np.exp(-diff / temperature))
                chosen.append(i if first else j)
                rejected.append(j if first else i)
    return np.asarray(chosen, dtype=np.int64), np.asarray(rejected, dtype=np.int64)


class RewardRefresh:
    """On a learner rank: a trainable copy of the refreshed term's reward model (``path``, a reward model's run),
    its Adam, the labeller, and the refreshes so far (``version``). ``term``: the config's refreshed
    :class:`rayseq.config.schema.RewardTerm`; ``task``: the learner's task (its configured reward installed)."""

    def __init__(self, term, task, device: torch.device, seed: int):
        self.cfg = term.refresh
        self.path = term.kwargs["path"]
        self.seed = int(seed)
        self.model = load_scorer(self.path, str(device))  # this rank's own copy, trained here
        self.model.generator.train()
        params = [*self.model.generator.parameters(), *self.model.head.parameters()]
        self.opt = torch.optim.Adam(params, lr=self.cfg.lr)
        own = getattr(task, "reward", None)  # the task's own reward, under the configured one that replaced it
        fn = registry.reward_function(self.cfg.labeller, self.cfg.labeller_kwargs)
        self.labeller = Reward(task, [Term(name="labeller", fn=fn, kwargs=dict(self.cfg.labeller_kwargs),
                                           label=f"reward.refresh.labeller={self.cfg.labeller}")],
                               task_rewards=own.task_rewards if isinstance(own, Reward) else None)
        self.version = 0
        load_refreshed(self.path, self.weights())  # this process scores with the run's copy (not an earlier run's)
        self.fixed = fixed_pairs(self.model, self.cfg.preferences) if self.cfg.preferences else None

    def update(self, rollout: Rollout) -> dict:
        """One refresh on the sampled groups of ``rollout`` (module docstring, steps 2-3); its metrics. The new
        weights are loaded into this process's scoring copy too (in-process runs score with it; the learner's
        ``val/reward`` reads it)."""
        t0 = time.perf_counter()
        args = (rollout.src, rollout.src_len, rollout.tokens, rollout.token_mask, rollout.key)
        scores, _ = self.labeller.scores(*args)
        rng = np.random.default_rng(derive_seed(self.seed, "reward_refresh", self.version))
        chosen, rejected = preference_pairs(scores, self.cfg.group_size, self.cfg.temperature, rng)
        m = {"reward_model/pairs": float(len(chosen)), "reward_model/label_mean": float(np.mean(scores))}
        if len(chosen) == 0:  # every group tied: nothing to learn from
            return {**m, "reward_model/version": float(self.version)}
        encoded = self.model.encode_pairs(*self.labeller.texts(*args))
        with torch.no_grad():
            r = self.model.rewards(encoded).float()
        m["reward_model/refresh_accuracy"] = float((r[chosen] > r[rejected]).float().mean())
        losses = []
        n_fixed = 0 if self.fixed is None else min(round(self.cfg.fixed_fraction * self.cfg.batch_size),
                                                    len(self.fixed[0]))
        for _ in range(self.cfg.steps):
            rows = rng.permutation(len(chosen))[: self.cfg.batch_size - n_fixed]
            pos, neg = [encoded[i] for i in chosen[rows]], [encoded[i] for i in rejected[rows]]
            if n_fixed:  # the fixed file's share of the step (refresh.mix)
                drawn = rng.permutation(len(self.fixed[0]))[:n_fixed]
                pos, neg = pos + [self.fixed[0][i] for i in drawn], neg + [self.fixed[1][i] for i in drawn]
            loss, _ = self.pair_loss(pos, neg)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            losses.append(float(loss.detach()))
        self.version += 1
        load_refreshed(self.path, self.weights())
        return {**m, "reward_model/refresh_loss": float(np.mean(losses)), "reward_model/version": float(self.version),
                "reward_model/fixed_pairs": float(n_fixed), "time/refresh_update_s": time.perf_counter() - t0}

    def pair_loss(self, chosen: list, rejected: list) -> tuple[torch.Tensor, object]:
        """The Bradley–Terry loss (module docstring, step 3) of (prompt ids, reply ids) pairs, chosen and rejected
        replies in one pass."""
        r = self.model.rewards(chosen + rejected).float()
        return bradley_terry_loss(r[: len(chosen)], r[len(chosen) :])

    def weights(self) -> dict:
        """The reward model's weights, as the scorers load them."""
        return self.model.weights()

    def state_dict(self) -> dict:
        return {**self.model.weights(), "opt": self.opt.state_dict(), "version": self.version}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (a resumed run), and score with it in this process."""
        self.model.load_weights(state)
        self.opt.load_state_dict(state["opt"])
        self.version = int(state["version"])
        load_refreshed(self.path, self.weights())


def fixed_pairs(model, path: str) -> tuple[list, list]:
    """(chosen, rejected) (prompt ids, reply ids) of every row of a fixed preference file (``refresh.preferences``,
    read as ``task.name=preferences`` reads one), encoded for ``model`` (a RewardModelScorer)."""
    rows = read_preferences(path)
    if isinstance(rows[0].prompt, list):
        raise ValueError(f"reward.refresh.preferences={path}: conversational prompts; the refresh reads text prompts "
                         "(the prompts the policy's replies are scored with)")
    prompts = [r.prompt for r in rows]
    return (model.encode_pairs(prompts, [r.chosen for r in rows]),
            model.encode_pairs(prompts, [r.rejected for r in rows]))


def refresh_due(cfg, stage_iter: int) -> bool:
    """Whether the ``train`` stage's iteration ``stage_iter`` (0-based) ends with a refresh (``refresh.every``)."""
    term = cfg.reward.refreshed if cfg.uses_reward_config else None
    return term is not None and (stage_iter + 1) % term.refresh.every == 0


def refresh_step(groups, step) -> dict:
    """One refresh, against the actor groups (module docstring): sample the groups with the current policy, refresh
    on the learner ranks, publish to the scorers. Its metrics."""
    rcfg = step.cfg.reward.refreshed.refresh
    t0 = time.perf_counter()
    groups.rollout.sync_weights()
    prompts = step.task.sample_prompts(step.rng, rcfg.prompts).repeat(rcfg.group_size)
    seed = step.seed(step.iteration) ^ 0x2EF2E5  # a stream of its own beside the iteration's sampling
    request = RolloutRequest(max_len=step.task.max_tgt_len, temperature=step.cfg.rollout.temperature, seed=seed)
    shards = groups.rollout.sample(prompts, request)
    t1 = time.perf_counter()
    m = groups.learner.refresh_reward(shards)
    t2 = time.perf_counter()
    groups.scorer.sync_weights()  # before the next batch is scored
    return {**m, "time/refresh_sample_s": t1 - t0, "time/refresh_s": t2 - t1,
            "time/refresh_publish_s": time.perf_counter() - t2}
