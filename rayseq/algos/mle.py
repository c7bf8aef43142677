"""Maximum likelihood (teacher forcing): minimise −log π_θ(y* | x) on reference targets.

Used for pretraining before every RL algorithm (Tuan et al. Supp. B, Algorithm 1: "Pretrain π using
MLE") and as the ``mle`` algorithm, which keeps training the same way for the RL stage's budget.
"""

from __future__ import annotations

import numpy as np
import torch

from rayseq.algos.common import LearnerState, SupervisedAlgo, grad_pass, optimizer_step
from rayseq.losses import token_nll_loss
from rayseq.types import PromptBatch, to_torch


class MLE(SupervisedAlgo):
    name = "mle"
    data_parallel = True
    needs_targets = True

    def __init__(self, cfg=None, seed: int = 0, max_grad_norm: float | None = 5.0):
        super().__init__(cfg, seed)
        self.max_grad_norm = cfg.max_grad_norm if cfg is not None else max_grad_norm

    def update(self, state: LearnerState, batch: PromptBatch, iteration: int) -> dict:
        dev, dp = state.device, state.dp
        tgt, src, src_len = to_torch(batch.tgt, dev), to_torch(batch.src, dev), to_torch(batch.src_len, dev)
        mask = (torch.arange(tgt.shape[1], device=dev)[None, :] < to_torch(batch.tgt_len, dev)[:, None]).float()
        if dp is not None:  # this rank's rows, its loss scaled by its share of the batch's tokens (algos/parallel.py)
            whole = mask
            rows = dp.part(torch.arange(len(tgt), device=dev))
            tgt, src, src_len, mask = tgt[rows], src[rows], src_len[rows], mask[rows]
        out = grad_pass(state.generator, src, src_len, tgt)  # an HF policy's head in chunks
        loss, stats = token_nll_loss(out.logp, mask)
        nll = float(stats.nll)
        if dp is not None:
            w = dp.share(mask, whole)
            loss = loss * w
            nll = dp.reduce({"nll": nll * w})["nll"]
        grad_norm = optimizer_step(state.gen_opt, loss, state.generator.parameters(), self.max_grad_norm, dp)
        return {
            "loss/nll": nll,
            "policy/grad_norm": grad_norm,
            "data/tokens": float(np.sum(batch.tgt_len)),
        }
