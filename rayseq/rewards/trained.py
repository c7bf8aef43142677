"""A reward model (``algo.name=reward_model``) loaded read-only from its run, scoring text: what ``POST /get_reward``
answers (:mod:`rayseq.serving.app`, OpenRLHF's shape ``{"query": [...]}`` → ``{"rewards": [...]}``) and what
``reward.fn=reward_model`` with ``path=RUN`` computes (on the scorer actors: any ``model.arch``, the built-in ones
included).

A query is the prompt followed by the reply, as one text. The model was trained on the ids of the prompt followed
by those of the reply; with ``prompts`` in the request (OpenRLHF's remote reward sends them), a query that starts
with its prompt is split there and each part encoded, so the ids are those of training. Without it, an HF reward
model encodes the whole query (a causal LM's last hidden state reads the same ids wherever the prompt ends); a
built-in one (an encoder and a decoder) needs the prompts, and a request without them is refused.

Math layer: torch; never Ray.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch

from rayseq.checkpoint import load_latest
from rayseq.config import ModelConfig
from rayseq.data.hf_text import HFVocab
from rayseq.data.subword import vocab_from_spec
from rayseq.data.text import tokenize
from rayseq.models.factory import generator_from_parts
from rayseq.models.reward_head import sequence_rewards

SCORE_ROWS = 64  # queries per forward pass


class InputError(ValueError):
    """A request the reward model cannot score (the app answers 422 with the message)."""


def is_reward_checkpoint(checkpoint: str | os.PathLike) -> bool:
    """Whether the run (or checkpoint file) holds a reward model."""
    _, ck = load_latest(checkpoint, training_state=False)
    return ck["config"]["algo"]["name"] == "reward_model"


def is_run(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a rayseq run directory or checkpoint file (not a Hugging Face folder)."""
    p = Path(path).expanduser()
    return p.is_file() or (p / "checkpoints").is_dir() or (p / "summary.json").is_file()


_LOADED: dict[tuple[str, str], RewardModelScorer] = {}  # (run, device) -> its scorer, one per process


def scorer_of(run: str | os.PathLike, device: str) -> RewardModelScorer:
    """The reward model of ``run`` on ``device``, loaded once per process."""
    key = (str(Path(run).expanduser().absolute()), device)
    if key not in _LOADED:
        _LOADED[key] = RewardModelScorer(key[0], device)
    return _LOADED[key]


class RewardModelScorer:
    """r(prompt, reply) of a reward model's run (its newest checkpoint that loads) on ``device``."""

    def __init__(self, checkpoint: str | os.PathLike, device: str = "cpu"):
        t0 = time.perf_counter()
        self.checkpoint, ck = load_latest(checkpoint, map_location=device, training_state=True)
        cfg, task = ck["config"], ck["task"]
        if cfg["algo"]["name"] != "reward_model":
            raise ValueError(f"{self.checkpoint}: not a reward model (algo.name={cfg['algo']['name']})")
        self.hf = "hf_tokenizer" in task["vocab"]
        self.vocab = HFVocab.from_spec(task["vocab"]) if self.hf else vocab_from_spec(task["vocab"])
        self.max_src_len, self.max_tgt_len = int(task["max_src_len"]), int(task["max_tgt_len"])
        self.device = torch.device(device)
        self.generator = generator_from_parts(ModelConfig(**cfg["model"]), self.vocab, self.vocab.specials)
        self.generator.load_state_dict(ck["learner"]["generator"])
        self.generator.to(self.device).eval()
        weight = ck["learner"]["algo"]["rm_head"]["weight"]
        self.head = torch.nn.Linear(weight.shape[1], 1, bias=False).to(self.device)
        self.head.load_state_dict({"weight": weight})
        driver = ck["driver"]
        self.model_id = f"rayseq-reward-model-it{driver['iteration']}"
        self.info = {"id": self.model_id, "task": task["name"], "algo": "reward_model", "about": task.get("about", ""),
                     "checkpoint": self.checkpoint, "iteration": driver["iteration"], "device": str(self.device),
                     "decoding": {}, "load_s": round(time.perf_counter() - t0, 3)}

    def _ids(self, text: str) -> list[int]:
        if self.hf:
            return self.vocab.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.vocab.encode(tokenize(text, "words")).tolist()

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
        pad, eos = self.vocab.specials.pad, self.vocab.specials.eos
        for a in range(0, len(pairs), SCORE_ROWS):
            part = pairs[a : a + SCORE_ROWS]
            src = np.full((len(part), max(max(len(p) for p, _ in part), 1)), pad, dtype=np.int64)
            tokens = np.full((len(part), max(len(r) for _, r in part) + 1), pad, dtype=np.int64)
            for i, (p, r) in enumerate(part):
                src[i, : len(p)] = p
                tokens[i, : len(r) + 1] = [*r, eos]
            src_len = torch.tensor([len(p) for p, _ in part], device=self.device)
            ends = torch.tensor([len(r) for _, r in part], device=self.device)
            r = sequence_rewards(self.generator, self.head, torch.as_tensor(src, device=self.device), src_len,
                                 torch.as_tensor(tokens, device=self.device), ends)
            out += r.float().cpu().tolist()
        return out
