"""A batch of episodes run concurrently on a rollout worker, kept as exact tokens, and handed on as a rollout.

:func:`run_episodes` — all B episodes advance together: one batched sampling call gives every active episode its
action (:mod:`rayseq.episodes.decode`), every environment steps (:mod:`rayseq.episodes.pool` in-process, or actors),
each observation is rendered and appended (:mod:`rayseq.episodes.render`), until an episode is done, reaches
``max_turns``, or its next turn would pass ``max_tokens`` (the actions' and observations' tokens after the prompt) or
the policy's ``context`` (the positions it reads: prompt and tokens of a row; a turn's actions are then cut to what the
fullest row has left, and a row with no room left ends, ``tokens``).
An environment that raises or times out ends its episode, recorded (``failure``) and counted; the others go on.

The trajectory of an episode is one sample (a rollout row): ``src`` the first observation as rendered, ``tokens``
every action as sampled and every observation as rendered, in order; ``action_mask`` 1 on the sampled tokens only;
``logp`` the engine's log-probs of them; each turn's reward on its last sampled token; ``turn`` the turn each token
belongs to (its action, then the observation that answers it: what credit over turns reads). Where the renderer
cannot prove the observation extends the prefix, the episode goes on in a new sample (the next row, marked
``continues``); the earlier sample's last sampled token then also carries the later samples' rewards, so that each
row's undiscounted return is the episode's from that row on (the first row's: the whole episode's). In a group
(episodes sharing a seed: GRPO's, RLOO's G rows) the episode ends there instead (truncated, ``split``), so that every
episode stays one row of its group.

:class:`EpisodeSampler` is the rollout worker's sampler for a run with an environment (``env.name``): the
:class:`rayseq.algos.sampling.Sampler` protocol, so the worker, the learner and every algorithm read its rollout as
any other. Its rows' ``score`` is the episode's return, so a group algorithm's G rows of one seed are G episodes of
the same game.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rayseq.algos.episode_metrics import FIGURES, episode_metrics  # noqa: F401 (re-exported)
from rayseq.episodes.pool import Failure
from rayseq.episodes.protocol import Action, as_step_result
from rayseq.episodes.render import Split, as_messages, retokenization_drift
from rayseq.seeding import derive_seed


@dataclass
class Limits:
    """An episode's limits: turns, tokens after the prompt, tokens per action, and the positions the policy reads in
    one row, its prompt included (``context``: a Hugging Face model's, :func:`rayseq.episodes.decode.context_length`;
    None: no such limit)."""

    max_turns: int = 10
    max_tokens: int = 512
    max_action_tokens: int = 32
    context: int | None = None

    def context_room(self, sample) -> float:
        """Positions ``sample``'s row has left for sampled tokens (inf without a context limit)."""
        return float("inf") if self.context is None else self.context - len(sample.src) - len(sample.tokens)


@dataclass
class Sample:
    """One trained row of an episode (module docstring)."""

    src: list[int]
    tokens: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)  # 1 where the policy sampled the token
    logp: list[float] = field(default_factory=list)  # the engine's log-prob of a sampled token, 0 elsewhere
    reward: list[float] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)  # 1-based turn of each token
    continues: bool = False  # continues the previous row's episode (a split)


@dataclass
class Episode:
    seed: int
    samples: list[Sample] = field(default_factory=list)
    turns: int = 0
    rewards: list[float] = field(default_factory=list)  # per turn
    done: bool = False
    success: bool | None = None  # what the environment said (info["success"]); None: the return is positive
    failure: str | None = None  # "raised: ..." / "timeout: ..." when the environment failed
    # "turns" / "tokens" when a limit ended it, "split" (a group's episode, a split), "prompt" (a first prompt longer
    # than the policy reads: ended before its first action)
    truncated: str | None = None
    splits: list[str] = field(default_factory=list)  # why each new sample was started
    transcript: list[tuple[str, str]] = field(default_factory=list)  # (role, text), for the viewer
    conv: Any = None  # the renderer's conversation

    @property
    def ret(self) -> float:
        return float(sum(self.rewards))

    @property
    def won(self) -> bool:
        return bool(self.success) if self.success is not None else self.ret > 0

    @property
    def n_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.samples)

    def drift(self, renderer) -> int:
        """How many ids of the episode's last sample (its prompt and tokens, as sampled and rendered) a
        re-tokenisation of the final conversation's text would change (:func:`retokenization_drift`)."""
        if self.conv is None:
            return 0
        s = self.samples[-1]
        return retokenization_drift(np.asarray(s.src + s.tokens), np.asarray(renderer.conversation_ids(self.conv)))


def _observation_text(obs) -> str:
    return "\n".join(str(m.get("content", "")) for m in as_messages(obs))


def run_episodes(envs, renderer, continuation, seeds, rows, limits: Limits, *, temperature: float = 1.0,
                 seed: int = 0, tools=None, split_ends: bool = False) -> list[Episode]:
    """Run one episode per seed (module docstring).

    Args:
        envs: the environments (:class:`rayseq.episodes.pool.LocalEnvs` or the actor pool): ``call([(slot, method,
            args)]) -> results``, slot b for episode b.
        renderer: renders observations (:mod:`rayseq.episodes.render`).
        continuation: samples the next actions (:mod:`rayseq.episodes.decode`).
        seeds: (B,) the episodes' seeds (a group's episodes share one).
        rows: B dicts of data for ``reset`` (empty: none).
        limits: turns and tokens.
        temperature: sampling temperature.
        seed: the call's seed; turn k samples with one derived from it.
        split_ends: where the renderer cannot prove an observation extends the prefix, end the episode there
            (truncated, ``split``) instead of going on in a new sample: an episode of a group stays one row.
        tools: the environment's tools, rendered into the first prompt by a chat template.

    Returns:
        The B episodes.
    """
    episodes = [Episode(int(s)) for s in seeds]
    firsts = envs.call([(b, "reset", (int(s),), dict(rows[b] or {})) for b, s in enumerate(seeds)])
    for ep, first in zip(episodes, firsts):
        if isinstance(first, Failure):
            ep.failure, ep.done = f"{first.kind}: {first.error}", True
            ep.samples.append(Sample(src=renderer.start("", tools)[0]))
            continue
        src, ep.conv = renderer.start(first, tools)
        ep.samples.append(Sample(src=src))
        ep.transcript.append(("observation", _observation_text(first)))
    turn = 0
    while True:
        active = [b for b, ep in enumerate(episodes) if not ep.done]
        for b in active:  # a row the policy's context cannot extend by a token (a prompt that fills it) ends here
            last = episodes[b].samples[-1]
            if limits.context_room(last) < 1:
                episodes[b].done, episodes[b].truncated = True, "tokens"
                if not last.tokens and len(last.src) >= limits.context:
                    # a first prompt the policy cannot read whole: nothing was sampled, nothing is learnt; its row
                    # keeps the prompt's last positions so that no pass over it reads past the policy's positions
                    episodes[b].truncated = "prompt"
                    last.src = list(last.src)[len(last.src) - limits.context + 1 :]
        active = [b for b in active if not episodes[b].done]
        if not active:
            return episodes
        turn += 1
        room = [limits.max_tokens - episodes[b].n_tokens for b in active]
        # one width for the batch: never past the context of the fullest row (the engine samples every row as wide)
        fits = min(limits.context_room(episodes[b].samples[-1]) for b in active)
        width = max(1, int(min(limits.max_action_tokens, max(room), fits)))
        out = continuation([episodes[b].samples[-1].src for b in active],
                           [episodes[b].samples[-1].tokens for b in active], width, temperature=temperature,
                           seed=derive_seed(seed, "episode_turn", turn))
        actions = []
        for b, ids, lp, ended, left in zip(active, out.ids, out.logp, out.ended, room):
            ended = ended and len(ids) <= left  # (an action past the episode's token budget is cut there)
            ids, lp = ids[:left], lp[:left]
            s = episodes[b].samples[-1]
            s.tokens += ids
            s.sampled += [1] * len(ids)
            s.logp += [float(x) for x in lp]
            s.reward += [0.0] * len(ids)
            s.turn += [turn] * len(ids)
            text = renderer.action_text(ids)
            episodes[b].transcript.append(("action", text))
            episodes[b].turns = turn
            actions.append((ids, ended, Action(text, ids[:-1] if ended else ids)))
        results = envs.call([(b, "step", (a[2],), {}) for b, a in zip(active, actions)])
        for b, (ids, ended, _), res in zip(active, actions, results):
            ep = episodes[b]
            if not isinstance(res, Failure):
                try:
                    res = as_step_result(res)
                except TypeError as exc:
                    res = Failure("raised", str(exc))
            if isinstance(res, Failure):
                ep.failure, ep.done = f"{res.kind}: {res.error}", True
                ep.rewards.append(0.0)
                renderer.finish(ep.conv, ids, ended)
                continue
            step = res
            ep.rewards.append(step.reward)
            s = ep.samples[-1]
            said = list(ep.conv["messages"])  # the conversation before this turn's observation
            if ids:
                s.reward[-1] += step.reward  # the turn's reward on its last sampled token
            if "success" in step.info:
                ep.success = bool(step.info["success"])
            if step.done or turn >= limits.max_turns:
                ep.done, ep.truncated = True, (None if step.done else "turns")
                renderer.finish(ep.conv, ids, ended)
                continue
            ep.transcript.append(("observation", _observation_text(step.observation)))
            nxt = renderer.next(ep.conv, ids, ended, step.observation)
            if isinstance(nxt, Split):
                ep.splits.append(nxt.reason)
                if split_ends:
                    ep.done, ep.truncated = True, "split"
                    ep.conv["messages"] = said
                    renderer.finish(ep.conv, ids, ended)
                else:
                    ep.samples.append(Sample(src=nxt.src, continues=True))
                continue
            if ep.n_tokens + len(nxt) + 1 > limits.max_tokens or limits.context_room(s) < len(nxt) + 1:
                ep.done, ep.truncated = True, "tokens"
                ep.conv["messages"] = said  # the observation that did not fit is not part of the episode
                renderer.finish(ep.conv, ids, ended)
                continue
            s.tokens += nxt
            s.sampled += [0] * len(nxt)
            s.logp += [0.0] * len(nxt)
            s.reward += [0.0] * len(nxt)
            s.turn += [turn] * len(nxt)


def episode_rows(episodes: list[Episode]) -> list[tuple[Episode, Sample]]:
    """The trained rows: every sample of every episode, in order (a split episode's samples consecutive), each with
    its episode; a sample without tokens is left out unless it is its episode's only one."""
    out = []
    for ep in episodes:
        samples = [s for s in ep.samples if s.tokens] or ep.samples[:1]
        for k, s in enumerate(samples):
            if k + 1 < len(samples) and s.sampled:  # the later samples' rewards, on this one's last sampled token
                later = sum(sum(x.reward) for x in samples[k + 1 :])
                last = max(i for i, m in enumerate(s.sampled) if m)
                s.reward[last] += later
            out.append((ep, s))
    return out


def rollout_arrays(episodes: list[Episode], pad: int, renderer=None) -> dict[str, np.ndarray]:
    """The episodes' rows as arrays: src (N, S), src_len (N,), tokens, token_mask, action_mask, logp, rewards, turn
    (N, T), and per row the episode's figures (returns, turns, success, failure, tokens, splits, continues, and with
    ``renderer`` the ids a re-tokenisation would change) and ``episode_turn_rewards`` (N, K): the reward of each of its
    turns on the episode's first row (0 on the rows that continue it)."""
    rows = episode_rows(episodes)
    N = len(rows)
    S = max(1, max(len(s.src) for _, s in rows))
    T = max(1, max(len(s.tokens) for _, s in rows))
    a = {"src": np.full((N, S), pad, np.int64), "src_len": np.zeros(N, np.int64),
         "tokens": np.full((N, T), pad, np.int64), "token_mask": np.zeros((N, T), np.float32),
         "action_mask": np.zeros((N, T), np.float32), "logp": np.zeros((N, T), np.float32),
         "rewards": np.zeros((N, T), np.float32), "turn": np.zeros((N, T), np.int64),
         "seed": np.zeros(N, np.int64)}
    figures = {k: np.zeros(N, np.float32) for k in ("episode_return", "episode_turns", "episode_success",
                                                    "episode_failed", "episode_timeout", "episode_tokens",
                                                    "episode_truncated", "episode_splits", "episode_continues",
                                                    "episode_drift")}
    drift = {id(ep): ep.drift(renderer) for ep in episodes} if renderer is not None else {}
    turn_rewards = np.zeros((N, max(1, max(len(ep.rewards) for ep in episodes))), np.float32)
    for i, (ep, s) in enumerate(rows):
        n = len(s.tokens)
        a["src"][i, : len(s.src)] = s.src
        a["src_len"][i] = max(1, len(s.src))
        a["tokens"][i, :n] = s.tokens
        a["token_mask"][i, :n] = 1.0
        a["action_mask"][i, :n] = s.sampled
        a["logp"][i, :n] = s.logp
        a["rewards"][i, :n] = s.reward
        a["turn"][i, :n] = s.turn
        a["seed"][i] = ep.seed
        figures["episode_return"][i] = ep.ret
        figures["episode_turns"][i] = ep.turns
        figures["episode_success"][i] = float(ep.won)
        figures["episode_failed"][i] = float(ep.failure is not None)
        figures["episode_timeout"][i] = float(bool(ep.failure and ep.failure.startswith("timeout")))
        figures["episode_tokens"][i] = ep.n_tokens
        figures["episode_truncated"][i] = float(ep.truncated is not None)
        figures["episode_splits"][i] = len(ep.splits)
        figures["episode_continues"][i] = float(s.continues)
        figures["episode_drift"][i] = drift.get(id(ep), 0)
        if not s.continues:  # every turn's reward, on the episode's first row
            turn_rewards[i, : len(ep.rewards)] = ep.rewards
    return {**a, **figures, "episode_turn_rewards": turn_rewards}


def transcript_text(ep: Episode) -> str:
    """One episode as readable text (the episode viewer)."""
    head = (f"seed {ep.seed}: {ep.turns} turns, return {ep.ret:g}, {'success' if ep.won else 'no success'}"
            + (f", failed ({ep.failure})" if ep.failure else "") + (f", cut at max_{ep.truncated}" if ep.truncated
                                                                    else "")
            + (f", {len(ep.splits)} split(s)" if ep.splits else ""))
    lines = [head]
    for role, text in ep.transcript:
        lines.append(f"  {'env   ' if role == 'observation' else 'policy'} | {text}")
    rewards = " ".join(f"{r:g}" for r in ep.rewards)
    lines.append(f"  rewards per turn: {rewards}")
    return "\n".join(lines)


class EpisodeSampler:
    """The rollout worker's sampler in a run with an environment (module docstring).

    Args:
        envs: the environments (in-process or actors).
        renderer: the task's renderer.
        continuation: samples actions (:func:`rayseq.episodes.decode.make_continuation`).
        limits: turns and tokens.
        rows: ``key -> dict`` of data for ``reset`` (None: none).
        exact: the engine's log-probs are the policy's own; otherwise they are returned as the engine's, and the
            learners compute the policy's over each whole episode (one pass) for the correction.
        tools: the environment's tools (rendered into the first prompt).
        keep_transcripts: how many episodes' text each call keeps in the rollout's info (the viewer's).
    """

    def __init__(self, envs, renderer, continuation, limits: Limits, *, rows=None, exact: bool = True, tools=None,
                 keep_transcripts: int = 2):
        self.envs, self.renderer, self.continuation, self.limits = envs, renderer, continuation, limits
        self.rows, self.exact, self.tools, self.keep = rows, exact, tools, keep_transcripts

    def run(self, keys, temperature: float, seed: int) -> list[Episode]:
        rows = [self.rows(int(k)) if self.rows is not None else {} for k in keys]
        keys = [int(k) for k in keys]
        # episodes that share a seed are a group (GRPO's, RLOO's: rows in consecutive groups of G): one row each, so
        # an episode whose template cannot be shown to extend the prefix ends there rather than adding a row
        grouped = len(set(keys)) < len(keys)
        return run_episodes(self.envs, self.renderer, self.continuation, keys, rows, self.limits,
                            temperature=temperature, seed=seed, tools=self.tools, split_ends=grouped)

    def sample(self, call):
        from rayseq.algos.sampling import Sampled
        from rayseq.models.protocol import SampleOutput
        from rayseq.types import PromptBatch

        if call.prompts.key is None:
            raise ValueError("episodes are started from their seeds: the prompts need keys (task.name=env gives them)")
        seed = int(torch.randint(0, 2**62, (1,), generator=call.rng).item()) if call.rng is not None else 0
        episodes = self.run(call.prompts.key, call.temperature, seed)
        a = rollout_arrays(episodes, call.policy.pad_id, self.renderer)
        dev = call.src.device
        t = {k: torch.from_numpy(a[k]).to(dev) for k in ("tokens", "token_mask", "action_mask", "logp")}
        out = SampleOutput(t["tokens"], t["token_mask"], t["action_mask"], t["logp"])
        # an engine whose log-probs are not the policy's: they are kept as the engine's, and the learners compute the
        # policy's over each whole episode (rayseq.algos.common.behaviour_logprobs)
        engine_logp = None if self.exact else t["logp"]
        extras = {k: a[k] for k in FIGURES}
        extras["env_rewards"], extras["turn"] = a["rewards"], a["turn"]
        info = {"episodes": [transcript_text(ep) for ep in episodes[: self.keep]]}
        prompts = PromptBatch(a["src"], a["src_len"], key=a["seed"])
        return Sampled(out, extras=extras, info=info, engine_logp=engine_logp, prompts=prompts)

    def score(self, task, rollout) -> None:
        """The environment's rewards: each turn's on its last sampled token; the row's score the episode's return."""
        rollout.rewards = np.asarray(rollout.extras["env_rewards"], np.float32) * rollout.token_mask
        rollout.score = np.asarray(rollout.extras["episode_return"], np.float32)
