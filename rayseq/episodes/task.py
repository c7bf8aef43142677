"""The episodes' task (``task.name=env``, set by ``env.name``): what the rest of rayseq asks of a task, for a run whose
rollouts are episodes of an environment (:mod:`rayseq.episodes`).

- Prompts are the episodes' seeds (``PromptBatch.key``); the prompt the policy reads is the first observation,
  rendered on the rollout worker when the episode starts. A group algorithm repeats each seed G times: G episodes of
  one game.
- The vocabulary: a Hugging Face tokenizer's with its chat template (``model.arch=hf``; observations are rendered as
  the template's suffix), or for a policy trained from scratch one token per word of the environment's
  ``vocabulary`` (``task.vocabulary=env``) or per printable character (``chars``).
- The reward is the environment's, per turn; :meth:`EnvTask.rewards` gives nothing of its own.
- Evaluation plays ``val_size`` (``test_size``) episodes from seeds of ``val_seed`` (``test_seed``) with the
  policy sampling at temperature 1: ``<split>/success``, ``<split>/return`` (also as ``<split>/reward``),
  ``<split>/turns`` and the other episode figures, and a few of them as text for the run's viewer. The episodes come
  in chunks of :data:`EVAL_EPISODES` (:meth:`EnvTask.eval_decodes`) that a rollout worker plays under Ray, with its
  engine and environments (:meth:`EnvTask.eval_play`); the learners add up the figures (:meth:`EnvTask.eval_figures`,
  :mod:`rayseq.tasks.evaluation`).
"""

from __future__ import annotations

import dataclasses
import json
import string
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from rayseq.config.env import EnvConfig
from rayseq.episodes.decode import context_length, make_continuation
from rayseq.episodes.pool import LocalEnvs
from rayseq.episodes.protocol import EnvError, close_environment, make_environment
from rayseq.episodes.render import TURN, ChatRenderer, VocabRenderer
from rayseq.episodes.runner import (
    FIGURES,
    EpisodeSampler,
    Limits,
    episode_metrics,
    rollout_arrays,
    run_episodes,
    transcript_text,
)
from rayseq.tasks.base import Task
from rayseq.tasks.evaluation import EvalDecode, check_split, chunked
from rayseq.types import PromptBatch
from rayseq.vocab import Vocab

METRICS = ("success", "return", "reward", "turns", "reward_per_turn", "failures", "timeouts", "tokens", "truncated",
           "splits", "retokenization_drift")
EVAL_EPISODES = 64  # episodes per evaluation chunk (one rollout worker's call): val_size's default, one chunk


class EnvTask(Task):
    """Episodes of the ``env:`` section's environment (module docstring)."""

    name = "env"
    fields = {
        "hf_tokenizer": (str | None, Field(
            None, description="Set from model.path by model.arch=hf: the tokenizer (and its chat template) the "
            "episodes are rendered with.")),
        "vocabulary": (Literal["env", "chars"], Field(
            "env", description="A policy trained from scratch (rnn, transformer): one token per word of the "
            "environment's vocabulary (env; it declares one) or per printable character (chars).")),
        "val_size": (int, Field(64, ge=1, description="Episodes of each evaluation (val/*), in chunks of 64 "
                                "that the rollout workers play (one chunk: 64 or fewer).")),
        "val_seed": (int, Field(2019, description="Seed of the evaluation episodes' seeds and sampling.")),
        "test_size": (int, Field(256, ge=1, description="Episodes of the final test (test/*), in chunks of "
                                 "64 that the rollout workers play.")),
        "test_seed": (int, Field(2018, description="Seed of the test episodes' seeds and sampling.")),
        "env": (dict | None, Field(None, exclude=True, description="The env: section (derived from it).")),
    }
    has_reward = True
    progress_metrics = {"episode/success": "success", "episode/turns": "turns"}

    def __init__(self, cfg):
        self.cfg = cfg
        self.env = EnvConfig(**(cfg.env or {}))
        if not self.env.name:
            raise EnvError("task.name=env: set env.name")
        # one environment made and reset here, so that a class that cannot start stops the run before any episode
        probe = make_environment(self.env.name, self.env.kwargs)
        try:
            self.tools = list(getattr(probe, "tools", None) or []) or None
            words = getattr(probe, "vocabulary", None)
            first = probe.reset(0)
        except Exception as exc:  # noqa: BLE001 (a user's environment: its error in one line, with the key)
            raise EnvError(f"env.name={self.env.name}: reset(0) raised {type(exc).__name__}: {exc}") from exc
        finally:
            close_environment(probe)
        if cfg.hf_tokenizer:
            from rayseq.data.hf_text import HFVocab

            self.vocab = HFVocab(cfg.hf_tokenizer, separator=False)
            if self.env.chat_template:
                self.vocab.tokenizer.chat_template = self.env.chat_template
            if not getattr(self.vocab.tokenizer, "chat_template", None):
                raise EnvError(f"{cfg.hf_tokenizer}: the tokenizer has no chat template; episodes render observations "
                               "as its suffix (give one with env.chat_template)")
            self.renderer = ChatRenderer(self.vocab.tokenizer, self.env.system_prompt)
        else:
            if cfg.vocabulary == "env":
                if not words:
                    raise EnvError(f"env.name={self.env.name} declares no vocabulary; use task.vocabulary=chars (or "
                                   "a Hugging Face policy, model.arch=hf)")
                self.vocab = Vocab(list(dict.fromkeys([*(str(w) for w in words), TURN])))
            else:
                self.vocab = Vocab(list(string.printable[:-5]) + ["\n", TURN])  # printable ASCII, space, newline
            self.renderer = VocabRenderer(self.vocab, "words" if cfg.vocabulary == "env" else "chars",
                                          self.env.system_prompt)
        self.specials = self.vocab.specials
        self.max_src_len = max(8, 2 * len(self.renderer.start(first, self.tools)[0]))
        self.max_tgt_len = self.env.max_tokens
        self.limits = Limits(self.env.max_turns, self.env.max_tokens, self.env.max_action_tokens)
        self._rows = None
        if self.env.rows:
            lines = Path(self.env.rows).expanduser().read_text().splitlines()
            self._rows = [json.loads(line) for line in lines if line.strip()]
            if not self._rows:
                raise EnvError(f"env.rows={self.env.rows}: no rows")

    @classmethod
    def check_config(cls, run_cfg) -> None:
        algo = run_cfg.algorithm
        from rayseq.algos.common import RolloutAlgo

        if algo.kind != "rollout" or algo.own_reward or algo.rollout_request is not RolloutAlgo.rollout_request:
            raise ValueError(f"algo.name={run_cfg.algo.name}: episodes are sampled by the environment's loop, so the "
                             "algorithm must sample π_θ as it is and learn from the task's reward (grpo, rloo, ppo, "
                             "ppo_dynamic, reinforce, ...)")
        if run_cfg.train.pretrain_iters:
            raise ValueError("train.pretrain_iters: an environment has no reference replies to pretrain on; set 0")
        if not run_cfg.reward.is_task:
            raise ValueError("reward: the environment gives the rewards; leave reward.* out")

    # -- what the rollout workers and the evaluation build -------------------------------------------------
    def row(self, key: int) -> dict:
        return dict(self._rows[int(key) % len(self._rows)]) if self._rows else {}

    def environment(self):
        return make_environment(self.env.name, self.env.kwargs)

    def local_envs(self) -> LocalEnvs:
        """Environments in this process (``env.num_actors`` = 0), with the step timeout."""
        return LocalEnvs(self.environment, self.env.step_timeout_s, self.env.max_concurrent)

    def limits_of(self, policy, engine=None) -> Limits:
        """The ``env:`` section's limits, with the positions ``policy`` (sampled through ``engine``) reads
        (:func:`rayseq.episodes.decode.context_length`)."""
        return dataclasses.replace(self.limits, context=context_length(policy, engine))

    def episode_sampler(self, policy, engine, device, envs=None) -> EpisodeSampler:
        """The rollout worker's sampler: episodes in ``envs`` (default: in this process) with ``policy`` sampled
        through ``engine``."""
        return EpisodeSampler(envs or self.local_envs(), self.renderer, make_continuation(policy, engine, device),
                              self.limits_of(policy, engine), rows=self.row if self._rows else None,
                              exact=getattr(engine, "exact", True), tools=self.tools)

    # -- the task protocol ------------------------------------------------------------------------------------
    def sample_prompts(self, rng: np.random.Generator, n: int, *, with_targets: bool = False) -> PromptBatch:
        if with_targets:
            raise ValueError("an environment has no reference replies (train.pretrain_iters=0; a rollout algorithm)")
        keys = rng.integers(0, 2**31 - 1, size=n, dtype=np.int64)
        # the prompt is rendered on the worker from the episode's first observation; this one is a placeholder
        return PromptBatch(np.full((n, 1), self.specials.pad, np.int64), np.ones(n, np.int64), key=keys)

    def rewards(self, src, src_len, tokens, token_mask, key=None):
        """Nothing of the task's own: the environment's rewards come with the episodes."""
        z = np.zeros(tokens.shape, np.float32)
        return z, z.sum(1)

    # -- evaluation: chunks of a split's episodes, played where the rollout engine is (rayseq.tasks.evaluation) -----
    def split_seeds(self, split: str) -> tuple[np.ndarray, int]:
        """The ``split``'s episode seeds (n,) and the split's seed (``val_seed``, ``test_seed``)."""
        n, seed = (self.cfg.val_size, self.cfg.val_seed) if check_split(split) == "val" else (self.cfg.test_size,
                                                                                              self.cfg.test_seed)
        return np.random.default_rng(seed).integers(0, 2**31 - 1, size=n), seed

    def eval_decodes(self, split: str) -> list[EvalDecode]:
        """The split's episodes in chunks of :data:`EVAL_EPISODES`, chunk c sampled with ``chunk_seed(seed, c)``
        (one chunk, as ``val_size`` = 64: the one call every evaluation made before it was chunked). More chunks
        play other episodes than one call over the split would: each turn samples the batch of active episodes from
        one generator, so an episode's draws depend on the seed and on the episodes beside it; the figures are the
        same arithmetic over the episodes played (each chunk as if played alone)."""
        seeds, seed = self.split_seeds(split)
        return chunked(split, "episodes", len(seeds), EVAL_EPISODES, self.env.max_tokens, seed=seed)

    def eval_play(self, decode: EvalDecode, sampler: EpisodeSampler) -> dict:
        """Episodes ``decode.start:stop`` of the split played with ``sampler`` (its continuation, engine and
        environments: a rollout worker's, or :meth:`evaluate`'s in-process one) at temperature 1, seeded with
        ``decode.seed``. Returns what :meth:`eval_figures` reads, per episode (n,) in seed order: its figures
        (:data:`rayseq.algos.episode_metrics.FIGURES`, ``episode_turn_rewards`` (n, K) among them), and the first
        ``env.transcripts`` episodes as text."""
        seeds = self.split_seeds(decode.split)[0][decode.start:decode.stop]
        episodes = run_episodes(sampler.envs, sampler.renderer, sampler.continuation, seeds,
                                [self.row(k) if self._rows else {} for k in seeds], sampler.limits,
                                temperature=1.0, seed=decode.seed, tools=sampler.tools)
        a = rollout_arrays(episodes, self.specials.pad, self.renderer)
        first = a["episode_continues"] == 0  # an episode's first row (one per episode, in order)
        out = {k: a[k][first] for k in FIGURES}
        out["transcripts"] = [transcript_text(ep) for ep in episodes[: self.env.transcripts]]
        return out

    def eval_figures(self, split: str, decoded: list, generator=None, device="cpu") -> tuple[dict, dict]:
        """The ``<split>/*`` episode figures (:func:`rayseq.algos.episode_metrics.episode_metrics`: means over the
        split's episodes, e.g. success = Σ_i won_i / n) of the chunks' results (:meth:`eval_play`, in the order of
        :meth:`eval_decodes`) joined in seed order, ``<split>/reward`` = ``<split>/return``; the first
        ``env.transcripts`` episodes as the viewer's text. Reads nothing of the policy (``generator`` unused)."""
        decodes = self.eval_decodes(split)
        if len(decodes) != len(decoded):
            raise ValueError(f"{len(decodes)} decodes of {split}'s episodes, {len(decoded)} results")
        for d, r in zip(decodes, decoded):
            if len(r["episode_return"]) != d.rows:
                raise ValueError(f"decode {d}: {len(r['episode_return'])} episodes for {d.rows}")
        width = max(r["episode_turn_rewards"].shape[1] for r in decoded)
        joined = {k: np.concatenate([r[k] for r in decoded]) for k in FIGURES if k != "episode_turn_rewards"}
        joined["episode_turn_rewards"] = np.concatenate([np.pad(r["episode_turn_rewards"], (
            (0, 0), (0, width - r["episode_turn_rewards"].shape[1]))) for r in decoded])
        m = episode_metrics(joined, prefix=f"{split}/")
        m[f"{split}/reward"] = m[f"{split}/return"]
        m.pop(f"{split}/count", None)
        viewer = "\n\n".join([t for r in decoded for t in r["transcripts"]][: self.env.transcripts])
        return m, {"viewer": viewer} if viewer else {}

    def evaluate(self, generator, device: str = "cpu", *, split: str = "val") -> tuple[dict, dict]:
        """Both halves in this process: every chunk played with ``generator``'s own loop (the built-in engine) in
        environments made here, then the figures. Under Ray the rollout workers play the chunks
        (:func:`rayseq.distributed.actors.worker.decode_held_out`) and the learners only add up the figures."""
        import torch

        from rayseq.engines.base import BuiltinEngine

        was_training = generator.training
        generator.eval()
        dev = torch.device(device)
        sampler = self.episode_sampler(generator, BuiltinEngine(generator, dev), dev)
        try:
            decoded = [self.eval_play(d, sampler) for d in self.eval_decodes(split)]
        finally:
            sampler.envs.close()
            generator.train(was_training)
        return self.eval_figures(split, decoded)

    @classmethod
    def metric_names(cls, task_cfg, split: str) -> list[str]:
        return [f"{split}/{m}" for m in METRICS]


__all__ = ["EnvTask"]
