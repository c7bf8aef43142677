"""A trained generator loaded read-only from a checkpoint, with text in and text out.

Everything needed comes from the checkpoint itself: the model sizes (its config), the vocabulary and
the tokenizer (its task spec). :meth:`ChatModel.generate` decodes a batch of requests at once, each
with its own temperature, top-k, length cap and seed.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, field

import torch

from rayseq.checkpoint import load_checkpoint, resolve_checkpoint
from rayseq.config import ModelConfig
from rayseq.data.text import detokenize, tokenize
from rayseq.models.generator import build_generator
from rayseq.tasks.base import Vocab


@dataclass
class GenRequest:
    text: str  # the message the model answers
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = whole vocabulary
    max_tokens: int = 20  # reply length cap (the HTTP layer enforces its own maximum)
    n: int = 1  # replies to sample
    seed: int | None = None  # reply i uses seed + i


@dataclass
class GenResult:
    replies: list[str]
    finish_reasons: list[str]  # "stop" (end token) or "length"
    prompt_tokens: int
    completion_tokens: int
    unknown_words: list[str] = field(default_factory=list)


class ChatModel:
    def __init__(self, checkpoint: str | os.PathLike, device: str = "cpu"):
        self.checkpoint = resolve_checkpoint(checkpoint)
        t0 = time.perf_counter()
        ck = load_checkpoint(self.checkpoint, map_location=device)
        task = ck["task"]
        if task["name"] == "oracle":
            raise ValueError(f"{self.checkpoint}: an unconditional oracle-task generator takes no input to reply to; "
                             "serve a chat (or counting) checkpoint")
        self.vocab = Vocab.from_spec(task["vocab"])
        tok = task.get("tokenizer", {"kind": "words", "lowercase": True})
        self.tokenizer_kind, self.lowercase = tok["kind"], tok.get("lowercase", True)
        self.max_src_len = int(task.get("max_src_len", 50))
        self.max_tgt_len = int(task.get("max_tgt_len", 20))
        cfg = ck["config"]
        self.device = torch.device(device)
        self.generator = build_generator(len(self.vocab), ModelConfig(**cfg["model"]), self.vocab.specials)
        self.generator.load_state_dict(ck["learner"]["generator"])
        self.generator.to(self.device).eval()
        it = ck["driver"]["iteration"]
        self.model_id = f"rayseq-{task['name']}-{cfg['algo']['name']}-it{it}"
        self.info = {
            "id": self.model_id, "task": task["name"], "algo": cfg["algo"]["name"], "iteration": it,
            "checkpoint": self.checkpoint, "vocab_size": len(self.vocab), "device": str(self.device),
            "load_s": round(time.perf_counter() - t0, 3),
        }

    def encode(self, text: str) -> tuple[list[int], list[str]]:
        """Token ids of ``text`` (truncated to the model's input length) and the words that were unknown."""
        words = tokenize(text, self.tokenizer_kind, self.lowercase)[-self.max_src_len :]
        ids = self.vocab.encode(words).tolist()
        unknown = [w for w, i in zip(words, ids) if i == self.vocab.specials.unk]
        return ids, unknown

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Decode all replies of all requests in one batch."""
        rows, encoded = [], []
        for r in requests:
            ids, unknown = self.encode(r.text)
            ids = ids or [self.vocab.specials.unk]  # an input of only spaces/punctuation the tokenizer drops
            encoded.append((ids, unknown))
            base = r.seed if r.seed is not None else secrets.randbits(62)
            rows += [(ids, r, base + i) for i in range(r.n)]
        B, S = len(rows), max(len(ids) for ids, _, _ in rows)
        src = torch.full((B, S), self.vocab.specials.pad, dtype=torch.long)
        for i, (ids, _, _) in enumerate(rows):
            src[i, : len(ids)] = torch.tensor(ids)
        dev = self.device
        out = self.generator.generate(
            src.to(dev),
            torch.tensor([len(ids) for ids, _, _ in rows], device=dev),
            torch.tensor([r.max_tokens for _, r, _ in rows], device=dev),
            torch.tensor([float(r.temperature) for _, r, _ in rows], device=dev),
            torch.tensor([int(r.top_k) for _, r, _ in rows], device=dev),
            [torch.Generator(device=dev).manual_seed(seed % 2**63) for _, _, seed in rows],
        )
        tokens, mask = out.tokens.cpu().tolist(), out.token_mask.cpu()
        lengths = mask.sum(1).long().tolist()
        results, row = [], 0
        for r, (ids, unknown) in zip(requests, encoded):
            replies, reasons, n_tokens = [], [], 0
            for _ in range(r.n):
                seq = tokens[row][: lengths[row]] if tokens else []
                ended = bool(seq) and seq[-1] == self.vocab.specials.eos
                replies.append(detokenize(self.vocab.decode(seq), self.tokenizer_kind))
                reasons.append("stop" if ended else "length")
                n_tokens += len(seq)
                row += 1
            results.append(GenResult(replies, reasons, len(ids), n_tokens, unknown))
        return results
