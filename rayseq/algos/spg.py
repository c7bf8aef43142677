"""Softmax policy gradient as the ERPO instance (R = the task's common reward, α = 1, β = 0; Tan et al.
2018 Sec. 3.4, Eq. 8; Ding & Soricut 2017), at token level (Eq. 4):

    E-step  q(y|x) ∝ Π_t p_θ(y_t | y_1:t−1, x) · exp(c · ΔR(y_t | y_1:t−1, y*))
    M-step  θ ← argmax E_q[log p_θ(y|x)]   (one gradient step on the samples' NLL per batch)

q is sampled on the rollout workers (the requests' :class:`rayseq.algos.erpo.QSampler`, ``mode="spg"``); ΔR is the
BLEU-2 increment of each candidate token against the input's references.
"""

from __future__ import annotations

from rayseq.algos.common import Algorithm, LearnerState
from rayseq.algos.erpo import ERPO_C_FIELD, QSampler, mle_on_samples
from rayseq.algos.sampling import check_builtin_engine
from rayseq.types import Rollout, RolloutRequest


class SPG(Algorithm):
    name = "spg"
    fields = ERPO_C_FIELD
    needs_references = True
    needs_task_reward = True

    @classmethod
    def check_config(cls, cfg) -> None:
        check_builtin_engine(cfg, "samples ERPO's q")  # QSampler: the policy's own loop, reweighted

    def rollout_request(self, iteration: int, max_len: int, temperature: float, seed: int) -> RolloutRequest:
        return RolloutRequest(max_len=max_len, temperature=1.0, seed=seed,
                              sampler=QSampler("spg", c=self.cfg.erpo_c))

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        return mle_on_samples(state, rollout, self.cfg.max_grad_norm)
