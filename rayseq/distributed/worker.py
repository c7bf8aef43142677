"""RolloutWorker: samples responses with the current weights and scores them with the task reward."""

from __future__ import annotations

import os
import time

import torch

from rayseq.config import RunConfig
from rayseq.models.generator import build_generator
from rayseq.tasks import make_task
from rayseq.types import PromptBatch, Rollout, RolloutRequest, to_torch


def placement_group_id() -> str | None:
    """Hex id of the placement group this process's actor runs in (None in-process or outside one)."""
    import sys

    if "ray" not in sys.modules:
        return None
    import ray

    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_placement_group_id()


class RolloutWorker:
    def __init__(self, cfg: dict, index: int = 0):
        self.cfg = RunConfig.model_validate(cfg)
        self.index = index
        torch.set_num_threads(self.cfg.rollout.torch_threads)
        self.device = torch.device("cuda" if self.cfg.rollout.num_gpus_per_worker > 0 else "cpu")
        self.task = make_task(self.cfg.task)
        self.generator = build_generator(len(self.task.vocab), self.cfg.model, self.task.specials).to(self.device)
        self.generator.eval()
        self.version = -1
        self.loads = 0  # weight loads (one per version)

    def pid(self) -> int:
        return os.getpid()

    def stats(self) -> dict:
        """Diagnostics: pid, weights version and loads, and a checksum of the weights."""
        checksum = float(sum(p.detach().double().sum() for p in self.generator.parameters()))
        return {
            "pid": os.getpid(), "version": self.version, "loads": self.loads, "checksum": checksum,
            "placement_group": placement_group_id(),
        }

    def set_weights(self, weights: dict, version: int) -> int:
        if version != self.version:
            self.generator.load_state_dict(weights)
            self.version = version
            self.loads += 1
        return self.version

    def sample(self, prompts: PromptBatch, request: RolloutRequest) -> Rollout:
        t0 = time.perf_counter()
        d = self.device
        gen = None
        if request.seed is not None:
            gen = torch.Generator(device=d).manual_seed(int(request.seed))
        prefix = to_torch(prompts.tgt, d) if request.prefix_len > 0 else None
        out = self.generator.sample(
            to_torch(prompts.src, d), to_torch(prompts.src_len, d), request.max_len,
            temperature=request.temperature, prefix=prefix, prefix_len=request.prefix_len, generator=gen,
        )
        tokens = out.tokens.cpu().numpy()
        token_mask = out.token_mask.cpu().numpy()
        rewards, score = self.task.rewards(prompts.src, prompts.src_len, tokens, token_mask)
        return Rollout(
            src=prompts.src, src_len=prompts.src_len, tokens=tokens, token_mask=token_mask,
            action_mask=out.action_mask.cpu().numpy(), logp=out.logp.cpu().numpy(),
            rewards=rewards, score=score, tgt=prompts.tgt, version=self.version,
            info={"worker": self.index, "pid": os.getpid(), "sample_s": time.perf_counter() - t0},
        )
