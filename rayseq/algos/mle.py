"""Maximum likelihood (teacher forcing): minimise −log π_θ(y* | x) on reference targets.

Used for pretraining before every RL algorithm (Tuan et al. Supp. B, Algorithm 1: "Pretrain π using
MLE") and as the ``mle`` algorithm, which keeps training the same way for the RL stage's budget.
"""

from __future__ import annotations

import numpy as np
import torch

from rayseq.algos.common import LearnerState, SupervisedAlgo, step
from rayseq.losses import token_nll_loss
from rayseq.types import PromptBatch, to_torch


class MLE(SupervisedAlgo):
    name = "mle"
    needs_targets = True

    def __init__(self, cfg=None, seed: int = 0, max_grad_norm: float | None = 5.0):
        super().__init__(cfg, seed)
        self.max_grad_norm = cfg.max_grad_norm if cfg is not None else max_grad_norm

    def update(self, state: LearnerState, batch: PromptBatch, iteration: int) -> dict:
        d = state.device
        tgt = to_torch(batch.tgt, d)
        mask = (torch.arange(tgt.shape[1], device=d)[None, :] < to_torch(batch.tgt_len, d)[:, None]).float()
        out = state.generator.logprobs(to_torch(batch.src, d), to_torch(batch.src_len, d), tgt)
        loss, stats = token_nll_loss(out.logp, mask)
        grad_norm = step(state.gen_opt, loss, state.generator.parameters(), self.max_grad_norm)
        return {
            "loss/nll": float(stats.nll),
            "policy/grad_norm": grad_norm,
            "data/tokens": float(np.sum(batch.tgt_len)),
        }
