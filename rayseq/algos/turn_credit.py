"""Credit over turns: advantage estimators for episodes of several turns (``algo.turn_credit``).

An episode i of a rollout of episodes (:mod:`rayseq.episodes.runner`) has turns k = 1..K_i, each an action the policy
sampled and the environment's reward r_{i,k} for it (on the turn's last sampled token; ``turn`` says which turn each
token belongs to). The estimators below read the rollout as an **episode table**: per row, the rewards r_{i,k} (B, K)
and a mask of the turns it has (:func:`turn_table`); each gives an advantage A_{i,k} per turn, and every sampled token
of turn k is trained with A_{i,k} (:func:`spread`). The G episodes of a group (GRPO's, RLOO's: consecutive rows) start
from the same state (the same seed).

- ``trajectory`` (default): every turn gets the episode's advantage, as for one long reply
  (:func:`trajectory_advantages` is RLOO's; GRPO keeps its own normalisation). One number per episode: no credit
  for the turn that earned it.
- ``turn_returns``: the return from turn k on, discounted over turns by γ_turn (``algo.turn_gamma``), minus a group
  baseline: the mean, over the group's other episodes that reached turn k, of their return from turn k
  (:func:`turn_group_advantages`).
- ``turn_gae``: GAE over turns with a turn critic V(s_{i,k}), the value of the state at turn k's start, the
  actor-critic's critic read at each turn's first sampled token and trained on the turn-level λ-returns
  (:func:`turn_gae_advantages`; ``algo.name=actor_critic``).
- ``gigpo``: step grouping (GiGPO, Feng et al. 2025): the turns of the group's other episodes that stood at the same
  observation share a baseline (:func:`gigpo_advantages`).

Unbiasedness. Σ_k ∇log π(a_{i,k} | h_{i,k}) (G_{i,k} − b_{i,k}) is an unbiased estimate of ∇E[Σ_k r_k] (at
γ_turn = 1) when b_{i,k} does not depend on episode i's actions at turns ≥ k. Every baseline here is a function of
the group's *other* episodes (independent of episode i) and of the state at turn k; turn-level GAE's is V(s_{i,k}),
exact at λ = 1 for any V and at any λ for the true V^π. Normalising each turn's reward per turn index and summing
the normalised rewards over the episode's remaining turns (MT-GRPO's construction, veRL's RFC) is *not*: its
baseline Σ_{j=k}^{K_i} mean_j r_{·,j} has as many terms as episode i has turns, and the policy decides that number
(tests/algos/test_turn_credit_unbiased.py shows both on an MDP whose exact gradient is enumerated). γ_turn < 1 is
the usual discounted return-to-go: nearer rewards count more, a bias traded for variance.

numpy and torch only (the algorithm layer).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np
import torch
from pydantic import Field

from rayseq.losses import gae
from rayseq.types import Rollout

GROUP_CREDIT = ("trajectory", "turn_returns", "gigpo")  # the group algorithms' (GRPO, RLOO)
CRITIC_CREDIT = ("trajectory", "turn_gae")  # the actor-critic's


def _turn_gamma_field():
    return (float, Field(1.0, ge=0.0, le=1.0, description="algo.turn_credit=turn_returns / gigpo / turn_gae: γ_turn, "
                                                          "the discount over turns of the return from turn k on (1: "
                                                          "the unbiased return; < 1: nearer turns count more)."))


TURN_CREDIT_FIELDS = {  # GRPO's and RLOO's keys
    "turn_credit": (Literal[GROUP_CREDIT], Field(
        "trajectory", description="Episodes of an environment (env.name): the advantage each turn's tokens get. "
        "trajectory = the episode's, on every turn; turn_returns = the return from the turn on minus the mean of the "
        "group's other episodes' returns from the same turn; gigpo = minus the mean of the group's other episodes' "
        "returns from turns that stood at the same observation (GiGPO's step grouping). turn_gae needs a critic: "
        "algo.name=actor_critic (docs/algorithms/turn-credit.md).")),
    "turn_gamma": _turn_gamma_field(),
}
CRITIC_TURN_FIELDS = {  # the actor-critic's keys
    "turn_credit": (Literal[CRITIC_CREDIT], Field(
        "trajectory", description="Episodes of an environment (env.name): trajectory = token-level GAE over the "
        "whole episode (the actor-critic's own); turn_gae = GAE over turns with a turn critic V(state at the turn's "
        "start) trained on turn-level λ-returns (λ = algo.gae_lambda, γ = algo.turn_gamma). turn_returns and gigpo "
        "need groups: algo.name=grpo or rloo (docs/algorithms/turn-credit.md).")),
    "turn_gamma": _turn_gamma_field(),
}


def check_turn_credit(cls, cfg) -> None:
    """Turn-level credit needs episodes (``env.name``): ValueError otherwise."""
    if cfg.algo.turn_credit != "trajectory" and cfg.task.name != "env":
        raise ValueError(f"algo.turn_credit={cfg.algo.turn_credit}: credit over turns needs episodes of an environment "
                         f"(env.name); the {cfg.task.name} task's replies have one turn (use trajectory)")


class TurnTable(NamedTuple):
    """A rollout's rows as episode tables: ``rewards`` (B, K) r_{i,k}; ``mask`` (B, K) 1 on the turns a row has (a
    prefix); ``column`` (B, T) each token's turn column (−1: padding); ``start`` (B, K) the position of each turn's
    first sampled token (0 where none)."""

    rewards: np.ndarray
    mask: np.ndarray
    column: np.ndarray
    start: np.ndarray


def turn_table(rewards: np.ndarray, turn: np.ndarray, action_mask: np.ndarray) -> TurnTable:
    """Token rows -> episode tables: r_{i,k} = Σ of row i's token rewards over the tokens of its k-th turn.

    Args:
        rewards: (B, T) per-token rewards (each turn's on its last sampled token; a KL penalty on every sampled one).
        turn: (B, T) 1-based turn of each token (0: padding); a row that continues an episode starts at a later turn.
        action_mask: (B, T) 1 on sampled tokens.
    """
    turn = np.asarray(turn, np.int64)
    B, T = turn.shape
    real = turn > 0
    first = np.where(real.any(1), np.where(real, turn, np.iinfo(np.int64).max).min(1), 1)
    column = np.where(real, turn - first[:, None], -1)
    K = max(1, int(column.max()) + 1)
    table = np.zeros((B, K))
    mask = np.zeros((B, K))
    rows, ts = np.nonzero(real)
    np.add.at(table, (rows, column[rows, ts]), np.asarray(rewards, np.float64)[rows, ts])
    mask[rows, column[rows, ts]] = 1.0
    start = np.full((B, K), T, np.int64)  # the first sampled position of each turn (T: none yet)
    rows, ts = np.nonzero(real & (np.asarray(action_mask) > 0))
    np.minimum.at(start, (rows, column[rows, ts]), ts)
    return TurnTable(table, mask, column, np.where(start == T, 0, start))


def spread(adv: np.ndarray | torch.Tensor, column: np.ndarray, action_mask: np.ndarray) -> torch.Tensor:
    """(B, K) per-turn advantages -> (B, T): A_{i,k} on every sampled token of turn k, 0 elsewhere."""
    adv = torch.as_tensor(adv, dtype=torch.float32)
    col = torch.from_numpy(np.maximum(np.asarray(column), 0))
    out = adv.gather(1, col.to(adv.device))
    return out * torch.as_tensor(np.asarray(action_mask), dtype=torch.float32, device=adv.device)


def turn_returns(rewards: np.ndarray, mask: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """G_{i,k} = Σ_{j=k}^{K_i} γ^{j−k} r_{i,j} (B, K), 0 on the turns a row does not have."""
    r = np.asarray(rewards, np.float64) * mask
    out = np.zeros_like(r)
    running = np.zeros(r.shape[0])
    for k in range(r.shape[1] - 1, -1, -1):
        running = r[:, k] + gamma * running
        out[:, k] = running
    return out * mask


def trajectory_advantages(rewards: np.ndarray, mask: np.ndarray, group_size: int) -> np.ndarray:
    """Trajectory level (RLOO over episode returns): every turn k of episode i gets

        A_{i,k} = R_i − (1/(G−1)) Σ_{j≠i} R_j,   R_i = Σ_k r_{i,k}

    (B, K), 0 on the turns a row does not have."""
    R = (np.asarray(rewards, np.float64) * mask).sum(1).reshape(-1, group_size)
    loo = R - (R.sum(1, keepdims=True) - R) / (group_size - 1)
    return loo.reshape(-1, 1) * mask


def turn_group_advantages(rewards: np.ndarray, mask: np.ndarray, group_size: int, gamma: float = 1.0) -> np.ndarray:
    """Turn-level returns with a group baseline over the episodes of the same start:

        A_{i,k} = G_{i,k} − b_{i,k},   G_{i,k} = Σ_{j≥k} γ^{j−k} r_{i,j},
        b_{i,k} = (1/|N_{i,k}|) Σ_{j ∈ N_{i,k}} G_{j,k},   N_{i,k} = {j ≠ i in i's group : episode j reached turn k}

    (b_{i,k} = 0 when no other episode reached turn k). The baseline is the group's other episodes' (RLOO's leave
    one out, per turn), so it does not depend on episode i's actions: unbiased at γ = 1 (module docstring).

    Args:
        rewards, mask: (B, K) the episode table (:func:`turn_table`), groups of G consecutive rows.
        group_size: G (≥ 2).
        gamma: γ_turn.
    """
    G = turn_returns(rewards, mask, gamma)
    g = G.reshape(-1, group_size, G.shape[1])
    m = np.asarray(mask, np.float64).reshape(g.shape)
    others = m.sum(1, keepdims=True) - m
    base = np.where(others > 0, (g.sum(1, keepdims=True) - g) / np.maximum(others, 1), 0.0)
    return ((g - base) * m).reshape(G.shape)


def turn_gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
                        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level GAE with a turn critic V(s_{i,k}) (the value of the state at turn k's start):

        δ_{i,k} = r_{i,k} + γ V(s_{i,k+1}) − V(s_{i,k})     (V after the last turn is 0)
        A_{i,k} = Σ_{j≥0} (γλ)^j δ_{i,k+j},   critic target G^λ_{i,k} = A_{i,k} + V(s_{i,k})

    (:func:`rayseq.losses.gae` over the turns). λ = 1: A = G_{i,k} − V(s_{i,k}), unbiased for any V; λ < 1 is
    unbiased when V is the policy's value, and trades bias for variance otherwise.

    Args:
        rewards, values, mask: (B, K) turn rewards, V at each turn's start, the turns a row has.

    Returns:
        (advantages, λ-returns) (B, K), both detached.
    """
    return gae(rewards, values, mask, gamma, lam)


def gigpo_advantages(rewards: np.ndarray, mask: np.ndarray, states: np.ndarray, group_size: int,
                     gamma: float = 1.0) -> np.ndarray:
    """Step grouping (GiGPO, Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training"): the
    turns of a group's episodes that stood at the same observation form a step group, and a turn's baseline is its
    step group's mean return over the *other* episodes:

        A_{i,k} = G_{i,k} − b_{i,k},
        b_{i,k} = mean { G_{j,l} : j ≠ i in i's group, turn l of j reached, s_{j,l} = s_{i,k} }

    and, when no other episode stood at s_{i,k}, the turn-level baseline of :func:`turn_group_advantages`. GiGPO
    itself adds an episode-level and a step-level advantage, each normalised by its group's std with the turn itself
    in the mean; here the turn is left out of its baseline (as RLOO leaves out the reply) and nothing is divided, so
    the estimate stays unbiased (module docstring).

    Args:
        rewards, mask: (B, K) the episode table, groups of G consecutive rows.
        states: (B, K) integer keys of the observation each turn started from (:func:`observation_keys`).
        group_size: G.
        gamma: γ_turn.
    """
    G = turn_returns(rewards, mask, gamma)
    fallback = G - turn_group_advantages(rewards, mask, group_size, gamma)  # b_{i,k} of the turn index
    B, K = G.shape
    g = G.reshape(-1, group_size, K)
    m = np.asarray(mask, np.float64).reshape(g.shape)
    s = np.asarray(states).reshape(g.shape)
    # match[n, i, k, j, l]: turn l of episode j (≠ i) of group n stood where turn k of episode i did
    match = (s[:, :, :, None, None] == s[:, None, None, :, :]) * m[:, None, None, :, :]
    match = match * (1.0 - np.eye(group_size))[None, :, None, :, None]
    count = match.sum((3, 4))
    total = (match * g[:, None, None, :, :]).sum((3, 4))
    base = np.where(count > 0, total / np.maximum(count, 1), fallback.reshape(g.shape))
    return ((g - base) * m).reshape(B, K)


def observation_keys(src: np.ndarray, src_len: np.ndarray, tokens: np.ndarray, action_mask: np.ndarray,
                     table: TurnTable) -> np.ndarray:
    """(B, K) a key per turn of the observation it started from: the row's prompt for its first turn, the tokens
    rendered after the previous turn's action (its turn's unsampled tokens) for the others. Equal observations, equal
    keys (a hash of the ids)."""
    B, K = table.mask.shape
    keys = np.zeros((B, K), np.int64)
    for i in range(B):
        keys[i, 0] = hash(tuple(int(x) for x in src[i, : int(src_len[i])]))
        for k in range(1, K):
            if table.mask[i, k]:
                obs = (table.column[i] == k - 1) & (np.asarray(action_mask[i]) == 0)
                keys[i, k] = hash(tuple(int(x) for x in tokens[i][obs]))
    return keys


def group_turn_advantages(cfg, rollout: Rollout, group_size: int) -> tuple[torch.Tensor, dict]:
    """(B, T) the advantages of ``algo.turn_credit`` (turn_returns or gigpo) on a rollout of episodes in groups of
    G: each sampled token of turn k gets A_{i,k}; and :func:`turn_metrics`."""
    table = rollout_turn_table(rollout)
    if cfg.turn_credit == "turn_returns":
        adv = turn_group_advantages(table.rewards, table.mask, group_size, cfg.turn_gamma)
    elif cfg.turn_credit == "gigpo":
        keys = observation_keys(rollout.src, rollout.src_len, rollout.tokens, rollout.action_mask, table)
        adv = gigpo_advantages(table.rewards, table.mask, keys, group_size, cfg.turn_gamma)
    else:
        raise ValueError(f"algo.turn_credit={cfg.turn_credit}: not a group estimator ({', '.join(GROUP_CREDIT[1:])})")
    return spread(adv, table.column, rollout.action_mask), turn_metrics(table, adv)


def rollout_turn_table(rollout: Rollout) -> TurnTable:
    """The rollout's episode table: its rewards (the environment's, with the KL penalty if any) by turn."""
    if "turn" not in rollout.extras:
        raise ValueError("algo.turn_credit: this rollout has no turns (credit over turns needs episodes of an "
                         "environment, env.name)")
    return turn_table(rollout.rewards, rollout.extras["turn"], rollout.action_mask)


def turn_metrics(table: TurnTable, adv: np.ndarray | torch.Tensor) -> dict:
    """``credit/turns_per_row`` and ``credit/turn_advantage_abs`` (mean |A_{i,k}| over the turns)."""
    a = np.abs(np.asarray(adv, np.float64)) * table.mask
    n = max(table.mask.sum(), 1.0)
    return {"credit/turns_per_row": float(table.mask.sum(1).mean()), "credit/turn_advantage_abs": float(a.sum() / n)}


__all__ = ["CRITIC_TURN_FIELDS", "TURN_CREDIT_FIELDS", "TurnTable", "check_turn_credit", "gigpo_advantages",
           "group_turn_advantages", "observation_keys", "rollout_turn_table", "spread", "trajectory_advantages",
           "turn_gae_advantages", "turn_group_advantages", "turn_metrics", "turn_returns", "turn_table"]
