"""Maximum likelihood (teacher forcing): minimise −log π_θ(y* | x) on reference targets.

Used for pretraining before every RL algorithm (Tuan et al. Supp. B, Algorithm 1: "Pretrain π using
MLE") and as the ``mle`` algorithm, which keeps training the same way for the RL stage's budget.
"""

from __future__ import annotations

import numpy as np
import torch

from rayseq.algos.common import (
    LearnerState,
    SupervisedAlgo,
    apply_gradients,
    grad_micro_batches,
    grad_pass,
    optimizer_step,
    reduce_metrics,
)
from rayseq.algos.parallel import DataParallel
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
        """One step of −mean_t log π_θ(y*_t | x, y*_<t) over the batch's target tokens; with several learners or
        ``learner.micro_batch_size`` below the batch, the gradient accumulated over this rank's rows in micro-batches
        (:func:`~rayseq.algos.common.grad_micro_batches`), each micro-batch's mean scaled by its share of the batch's
        tokens, D_m / D: Σ_m (D_m / D) · mean_{t∈m} = mean over the batch."""
        dev = state.device
        tgt, src, src_len = to_torch(batch.tgt, dev), to_torch(batch.src, dev), to_torch(batch.src_len, dev)
        mask = (torch.arange(tgt.shape[1], device=dev)[None, :] < to_torch(batch.tgt_len, dev)[:, None]).float()
        pieces = grad_micro_batches(state, len(tgt), src.shape[1] + tgt.shape[1])
        if pieces is None:  # the whole batch in one pass
            out = grad_pass(state.generator, src, src_len, tgt)  # an HF policy's head in chunks
            loss, stats = token_nll_loss(out.logp, mask)
            nll = float(stats.nll)
            grad_norm = optimizer_step(state.gen_opt, loss, state.generator.parameters(), self.max_grad_norm)
        else:
            state.gen_opt.zero_grad(set_to_none=True)
            nll = 0.0
            for rows in pieces:
                w = DataParallel.share(mask[rows], mask)
                out = grad_pass(state.generator, src[rows], src_len[rows], tgt[rows])
                loss, stats = token_nll_loss(out.logp, mask[rows])
                (loss * w).backward()
                nll += float(stats.nll) * w
                del out, loss  # this micro-batch's activations, before the next one's
            nll = reduce_metrics(state, {"nll": nll})["nll"]
            grad_norm = apply_gradients(state.gen_opt, state.generator.parameters(), self.max_grad_norm, state.dp)
        return {
            "loss/nll": nll,
            "policy/grad_norm": grad_norm,
            "data/tokens": float(np.sum(batch.tgt_len)),
        }
