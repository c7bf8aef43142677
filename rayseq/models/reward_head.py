"""A reward model's scalar head on a policy (``algo.name=reward_model``): r(x, y) = wᵀ h(x, y), h the policy's state
after reading the prompt x and the whole reply y — its state at y's <eos> position (the state that predicts <eos>;
for an HF policy the last hidden layer at y's last token, what ``AutoModelForSequenceClassification`` reads). No
bias, as a sequence-classification head of transformers has none (Bradley–Terry reads differences).

:class:`RewardModelScorer` loads a reward model's run read-only and scores text with it: what ``POST /get_reward``
answers (:mod:`rayseq.serving.app`, OpenRLHF's ``{"query": [...]}`` → ``{"rewards": [...]}``) and what
``reward.fn=reward_model`` with ``path=RUN`` computes (:mod:`rayseq.rewards.hf_classifier`). A query is the prompt
followed by the reply, as one text; the model was trained on the ids of the prompt followed by those of the reply.
With the prompts given, a query that starts with its prompt is split there and each part encoded, so the ids are
those of training. Without them, an HF reward model encodes the whole query (a causal LM's last hidden state reads
the same ids wherever the prompt ends); a built-in one (an encoder and a decoder) needs the prompts.

Math layer: torch; never Ray.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from rayseq.checkpoint import load_latest, read_module_shards
from rayseq.config import ModelConfig
from rayseq.models.factory import generator_from_parts


def reward_head(state_dim: int) -> nn.Linear:
    """w: a bias-free (H → 1) linear map, initialised as transformers initialises a classifier head (std 1/√(H+1))."""
    head = nn.Linear(state_dim, 1, bias=False)
    nn.init.normal_(head.weight, std=1.0 / (state_dim + 1) ** 0.5)
    return head


def trained_head(ck: dict, state_dim: int) -> nn.Linear:
    """The reward head of a reward model's loaded checkpoint (``training_state=True``): from the learner's files, or,
    when sharded learners wrote it (``learner.strategy=fsdp``), read whole from the checkpoint's shards (any number
    of ranks wrote them; read here without a process group)."""
    learner = ck["learner"]
    head = reward_head(state_dim)
    held = (learner.get("algo") or {}).get("rm_head")
    if held is not None:
        head.load_state_dict(held)
    elif "dcp" in learner:
        read_module_shards(learner["dcp"], {"rm_head": head})
    else:
        raise ValueError("the checkpoint holds no reward head (algo.rm_head): not a reward model's training state")
    return head.eval()


def reply_states(policy, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(B, T, H) the policy's states at each reply position (the one that predicts token t has read y_<t): its
    ``reply_states`` when it has one (an HF policy: the last hidden layer, without the LM head), else its
    ``logprobs``' states."""
    own = getattr(policy, "reply_states", None)
    if own is not None:
        return own(src, src_len, tokens)
    return policy.logprobs(src, src_len, tokens).states


def sequence_rewards(policy, head: nn.Module, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor,
                     ends: torch.Tensor) -> torch.Tensor:
    """r (B,) of replies ``tokens`` (B, T) to prompts ``src`` (B, S) (lengths ``src_len``), each ending in <eos> at
    column ``ends`` (B,) (its length without <eos>)."""
    states = reply_states(policy, src, src_len, tokens)
    return head(states[torch.arange(len(ends), device=ends.device), ends].float()).squeeze(-1)


SCORE_ROWS = 64  # queries per forward pass


class InputError(ValueError):
    """A request the reward model cannot score (the app answers 422 with the message)."""


def is_reward_checkpoint(checkpoint: str | os.PathLike) -> bool:
    """Whether the run (or checkpoint file) holds a reward model."""
    _, ck = load_latest(checkpoint, training_state=False)
    return ck["config"]["algo"]["name"] == "reward_model"


class RewardModelScorer:
    """r(prompt, reply) of a reward model's run (its newest checkpoint that loads) on ``device``. ``vocab_of(spec)``
    builds the vocabulary of the checkpoint's task spec and ``encode(vocab, text)`` gives the ids of a text (the
    data layer's, which the callers pass: models do not read text)."""

    def __init__(self, checkpoint: str | os.PathLike, vocab_of: Callable, encode: Callable, device: str = "cpu"):
        t0 = time.perf_counter()
        self.checkpoint, ck = load_latest(checkpoint, map_location=device, training_state=True)
        cfg, task = ck["config"], ck["task"]
        if cfg["algo"]["name"] != "reward_model":
            raise ValueError(f"{self.checkpoint}: not a reward model (algo.name={cfg['algo']['name']})")
        self.hf = "hf_tokenizer" in task["vocab"]
        self.vocab = vocab_of(task["vocab"])
        self.encode = encode
        self.max_src_len, self.max_tgt_len = int(task["max_src_len"]), int(task["max_tgt_len"])
        self.device = torch.device(device)
        self.generator = generator_from_parts(ModelConfig(**cfg["model"]), self.vocab, self.vocab.specials)
        self.generator.load_state_dict(ck["learner"]["generator"])
        self.generator.to(self.device).eval()
        self.head = trained_head(ck, self.generator.state_dim).to(self.device)
        driver = ck["driver"]
        self.model_id = f"rayseq-reward-model-it{driver['iteration']}"
        self.info = {"id": self.model_id, "task": task["name"], "algo": "reward_model", "about": task.get("about", ""),
                     "checkpoint": self.checkpoint, "iteration": driver["iteration"], "device": str(self.device),
                     "decoding": {}, "load_s": round(time.perf_counter() - t0, 3)}

    def _ids(self, text: str) -> list[int]:
        return list(self.encode(self.vocab, text))

    def _split(self, query: str, prompt: str | None) -> tuple[list[int], list[int]]:
        """(prompt ids, reply ids) of a query (module docstring)."""
        if prompt is not None and query.startswith(prompt) and prompt:
            return self._ids(prompt)[-self.max_src_len :], self._ids(query[len(prompt) :])[: self.max_tgt_len]
        if not self.hf:
            raise InputError("this reward model reads a prompt and a reply: send prompts beside query (each query "
                             "starting with its prompt)")
        ids = self._ids(query)
        if not ids:
            raise InputError("a query has no tokens")
        reply = min(len(ids) - 1, self.max_tgt_len)  # (for a causal LM, where the split falls changes nothing)
        return ids[: len(ids) - reply][-self.max_src_len :], ids[len(ids) - reply :]

    @torch.no_grad()
    def score(self, queries: list[str], prompts: list[str] | None = None) -> list[float]:
        """r of each query (InputError on one it cannot score)."""
        if prompts is not None and len(prompts) != len(queries):
            raise InputError(f"prompts has {len(prompts)} items for {len(queries)} queries")
        pairs = [self._split(q, None if prompts is None else prompts[i]) for i, q in enumerate(queries)]
        out = []
        for a in range(0, len(pairs), SCORE_ROWS):
            out += self.rewards(pairs[a : a + SCORE_ROWS]).float().cpu().tolist()
        return out

    def rewards(self, pairs: list[tuple[list[int], list[int]]]) -> torch.Tensor:
        """r (B,) of (prompt ids, reply ids) pairs (:meth:`_split`'s), in one pass, with gradients when enabled (what
        an online refresh trains: rayseq.algos.reward_refresh)."""
        pad, eos = self.vocab.specials.pad, self.vocab.specials.eos
        src = np.full((len(pairs), max(max(len(p) for p, _ in pairs), 1)), pad, dtype=np.int64)
        tokens = np.full((len(pairs), max(len(r) for _, r in pairs) + 1), pad, dtype=np.int64)
        for i, (p, r) in enumerate(pairs):
            src[i, : len(p)] = p
            tokens[i, : len(r) + 1] = [*r, eos]
        src_len = torch.tensor([len(p) for p, _ in pairs], device=self.device)
        ends = torch.tensor([len(r) for _, r in pairs], device=self.device)
        return sequence_rewards(self.generator, self.head, torch.as_tensor(src, device=self.device), src_len,
                                torch.as_tensor(tokens, device=self.device), ends)

    def encode_pairs(self, prompts: list[str], replies: list[str]) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, reply ids) of each prompt and its reply, as the model was trained on them."""
        return [self._split(p + r, p) for p, r in zip(prompts, replies)]

    def weights(self) -> dict:
        """``{"generator": ..., "head": ...}`` state dicts on the CPU: what a refresh publishes."""
        return {k: {n: v.detach().cpu() for n, v in m.state_dict().items()}
                for k, m in (("generator", self.generator), ("head", self.head))}

    def load_weights(self, weights: dict) -> None:
        """Load :meth:`weights` (of a refreshed copy)."""
        self.generator.load_state_dict(weights["generator"])
        self.head.load_state_dict(weights["head"])

