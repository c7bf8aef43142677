"""ScorerActor: scores rollouts with the task reward when it is expensive (chitchat's BLEU-2 against all
references) or configured (``reward.*``: functions on text, user code, maybe a model on the scorer's GPU), and
turns SeqGAN's Monte-Carlo continuations into Q values with its discriminator copy.

D's weights arrive through the object store after each d-step (one ``ray.put`` per discriminator
version, like the generator's). Scoring is large batched forward passes (``scorer.batch_size``).
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from rayseq.config import RunConfig
from rayseq.distributed.placement import placement_group_id
from rayseq.distributed.worker import score_rollout
from rayseq.models import make_discriminator
from rayseq.rewards.mc_search import q_values
from rayseq.seeding import set_deterministic
from rayseq.tasks import make_task
from rayseq.types import MCBatch, Rollout, to_torch


class ScorerActor:
    def __init__(self, cfg: dict, index: int = 0):
        self.cfg = RunConfig.model_validate(cfg)
        self.index = index
        torch.set_num_threads(self.cfg.scorer.torch_threads)
        set_deterministic(self.cfg.deterministic)
        self.device = torch.device("cuda" if self.cfg.scorer.num_gpus_per_scorer > 0 else "cpu")
        self.task = make_task(self.cfg.task, self.cfg.reward)  # with a configured reward: its functions run here
        self.disc = make_discriminator(self.cfg, self.task).to(self.device).eval() if self.cfg.is_gan else None
        self.disc_version = -1
        self.loads = 0

    def pid(self) -> int:
        return os.getpid()

    def stats(self) -> dict:
        return {"pid": os.getpid(), "disc_version": self.disc_version, "loads": self.loads,
                "placement_group": placement_group_id()}

    def set_disc_weights(self, weights: dict, version: int) -> int:
        if version != self.disc_version:
            self.disc.load_state_dict(weights)
            self.disc_version = version
            self.loads += 1
        return self.disc_version

    def score_rollout(self, rollout: Rollout) -> Rollout:
        """The reward (the task's, e.g. BLEU-2 against the input's references, or the configured one) of sampled
        rollouts."""
        t0 = time.perf_counter()
        out = score_rollout(self.task, rollout)
        out.info = {**out.info, "score_s": time.perf_counter() - t0}
        return out

    def score_rollout_shard(self, rollout: Rollout, report_score: bool = False) -> tuple[Rollout, dict]:
        """:meth:`score_rollout`, and its info (the Ray groups' two return objects: data by reference, info to the
        driver; with ``report_score`` the rewards ``score`` (B,) and ``term_scores`` (B, K) too)."""
        out = self.score_rollout(rollout)
        report = {"score": out.score, "term_scores": out.term_scores} if report_score else {}
        return out, {"score_s": out.info["score_s"], "rows": len(out), **report}

    def score_sequences(self, rollout: Rollout) -> tuple[np.ndarray, dict]:
        """D(Y) (B,) float32 of the rollout's whole sequences (SeqGAN-critic's terminal reward), and timings."""
        t0 = time.perf_counter()
        d = self.device
        conditional = rollout.src.shape[1] > 0
        lengths = to_torch((rollout.token_mask > 0).sum(1).astype(np.int64), d)
        src = to_torch(rollout.src, d) if conditional else None
        src_len = to_torch(rollout.src_len, d) if conditional else None
        p = self.disc.score(to_torch(rollout.tokens, d), lengths, src, src_len, batch_size=self.cfg.scorer.batch_size)
        return p.cpu().numpy().astype(np.float32), {"score_s": time.perf_counter() - t0, "scored": len(rollout)}

    def score_mc(self, batch: MCBatch) -> tuple[np.ndarray, dict]:
        """Q (B, T) float32 by SeqGAN Eq. 4 for the batch's sequences, and timings. The continuations of prefix t
        share its windows: D convolves them once per sequence (:meth:`CNNDiscriminator.score_shared_prefix`)."""
        t0 = time.perf_counter()
        d = self.device
        B, Tm1, N, T = batch.cont.shape
        conditional = batch.src.shape[1] > 0
        src = to_torch(batch.src, d) if conditional else None
        src_len = to_torch(batch.src_len, d) if conditional else None
        tokens, lengths = to_torch(batch.tokens, d), to_torch(batch.lengths, d)
        cont = to_torch(batch.cont.astype(np.int64), d)
        bs = self.cfg.scorer.batch_size
        d_cont = self.disc.score_shared_prefix(tokens, lengths, cont, to_torch(batch.cont_len, d),
                                               torch.arange(1, T, device=d), src, src_len, batch_size=bs)
        d_full = self.disc.score(tokens, lengths, src, src_len, batch_size=bs)
        q = q_values(d_cont, d_full, lengths)
        return q.cpu().numpy().astype(np.float32), {"score_s": time.perf_counter() - t0, "scored": B * Tm1 * N}
