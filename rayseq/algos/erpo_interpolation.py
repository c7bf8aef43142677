"""The interpolation algorithm of ERPO (Tan et al. 2018, Sec. 4 and Supplement Algorithm 1, settings of
Supplement C.2).

Per token a categorical z ~ (λ1, λ2, λ3) (spike and slab) picks the source of y_t:
z = 1 the model, y_t ∝ exp{c · log p_θ(y_t | y_1:t−1, x)}; z = 2 the reward, y_t ∝ exp{c · ΔR(y_t | y_1:t−1, y*)}
(ΔR for every candidate token, vectorised); z = 3 the reference, y_t = y*_t. The M-step maximises
log p_θ(y|x) of the sequences so built (:mod:`rayseq.algos.erpo`; sampled on the rollout workers by the requests'
:class:`rayseq.algos.erpo.QSampler`, built on the learner, where λ lives).

Annealing (C.2): λ starts at (0.04, 0, 0.96). Every ``interp_val_every`` iterations the validation-set
reward (mean sentence BLEU-2 of greedy replies to validation inputs) is measured; when it is lower than at
the previous validation, the weights (and optimizer) return to that validation's ("we would not update θ
when the validation-set reward decreases") and λ moves: λ1 += 0.06 once, then λ2 += 0.06 four times,
periodically, λ3 −= 0.06 each time (the authors' code: ``interpolation_main.py``). After a drop the next
validation is always accepted, as there. The λ state and the saved weights are part of checkpoints.
"""

from __future__ import annotations

import copy
import math
from typing import Annotated

from pydantic import AfterValidator, Field

from rayseq.algos.common import Algorithm, LearnerState
from rayseq.algos.erpo import ERPO_C_FIELD, QSampler, mle_on_samples
from rayseq.algos.iteration import rollout_step
from rayseq.algos.sampling import check_builtin_engine
from rayseq.types import Rollout, RolloutRequest


def _a_distribution(v: list[float]) -> list[float]:
    # ERPO Alg. 1: each token comes from one of three sources with probabilities (λ1, λ2, λ3)
    if any(not 0.0 <= x <= 1.0 for x in v) or not math.isclose(sum(v), 1.0, abs_tol=1e-6):
        raise ValueError(f"algo.interp_lambdas: (λ1, λ2, λ3) are probabilities: each in [0, 1], summing to 1 "
                         f"(got {v}, sum {sum(v):g})")
    return v


INTERPOLATION_FIELDS = {
    "interp_lambdas": (Annotated[list[float], AfterValidator(_a_distribution)], Field(
        [0.04, 0.0, 0.96], min_length=3, max_length=3,
        description="Interpolation: initial (λ1 model, λ2 reward, λ3 reference) (ERPO Supp. C.2).")),
    "interp_delta": (float, Field(0.06, gt=0, le=1, description="Interpolation: λ step of each annealing (0.06).")),
    "interp_reward_steps": (int, Field(
        4, ge=0, description="Interpolation: λ2 increases this many times after each λ1 increase (4).")),
    "interp_val_every": (int, Field(
        25, ge=1, description="Interpolation: validation reward (task.val_size validation inputs) every this many "
        "iterations; a drop anneals λ and restores the weights of the last validation (ERPO Supp. C.2).")),
}


class ERPOInterpolation(Algorithm):
    name = "erpo_interpolation"
    fields = {**ERPO_C_FIELD, **INTERPOLATION_FIELDS}
    needs_targets = True
    needs_references = True
    needs_task_reward = True
    stateful_request = True  # λ lives on the learner: its iteration asks the learner for each request

    @classmethod
    def check_config(cls, cfg) -> None:
        check_builtin_engine(cfg, "samples ERPO's q")  # QSampler: the policy's own loop, reweighted

    def __init__(self, cfg, seed: int = 0):
        super().__init__(cfg, seed)
        self.lambdas = [float(x) for x in cfg.interp_lambdas]
        s = sum(self.lambdas)
        if min(self.lambdas) < 0 or abs(s - 1.0) > 1e-6:
            raise ValueError(f"algo.interp_lambdas must be a distribution (≥ 0, sum 1), got {cfg.interp_lambdas}")
        self.history = ["reward"] * cfg.interp_reward_steps  # so that the first annealing raises λ1
        self.last_reward: float | None = None
        self.snapshot: dict | None = None
        self.anneals = 0

    @property
    def validate_every(self) -> int:
        return self.cfg.interp_val_every

    def training_step(self, groups, step) -> dict:
        """Sample from q_λ → update, with the request the learner's copy builds (λ lives there); a validation before
        the stage's first update (what the first interval is judged against), and after every ``interp_val_every``
        iterations, where :meth:`on_validation` keeps or undoes the interval's updates and anneals λ."""
        validates = self.validate_every > 0

        def request(seed: int) -> RolloutRequest:
            return groups.learner.rollout_request(step.stage_iter, step.task.max_tgt_len,
                                                  step.cfg.rollout.temperature, seed)

        m = groups.learner.validate() if validates and step.stage_iter == 0 else {}
        m.update(rollout_step(self, groups, step, request=request))
        if validates and (step.stage_iter + 1) % self.validate_every == 0:
            m.update(groups.learner.validate())
        return m

    def rollout_request(self, iteration: int, max_len: int, temperature: float, seed: int) -> RolloutRequest:
        return RolloutRequest(max_len=max_len, temperature=1.0, seed=seed,
                              sampler=QSampler("interpolation", c=self.cfg.erpo_c, lambdas=tuple(self.lambdas)))

    def anneal(self) -> str:
        """One annealing step; returns which weight grew ("model" = λ1 or "reward" = λ2)."""
        k, delta = self.cfg.interp_reward_steps, self.cfg.interp_delta
        which = "model" if self.history[-k:] == ["reward"] * k else "reward"
        moved = min(delta, self.lambdas[2])  # λ3 cannot go below 0
        self.lambdas[0 if which == "model" else 1] += moved
        self.lambdas[2] -= moved
        self.history.append(which)
        self.anneals += 1
        return which

    def on_validation(self, state: LearnerState, reward: float) -> dict:
        """Keep or undo the last interval's updates by the validation reward (module docstring)."""
        dropped = self.last_reward is not None and reward < self.last_reward
        if dropped:
            state.generator.load_state_dict(self.snapshot["generator"])
            state.gen_opt.load_state_dict(self.snapshot["gen_opt"])
            self.anneal()
            self.last_reward = None
        else:
            self.last_reward = reward
            self.snapshot = {"generator": copy.deepcopy(state.generator.state_dict()),
                             "gen_opt": copy.deepcopy(state.gen_opt.state_dict())}
        return {"interp/val_reward": reward, "interp/restored": float(dropped), "interp/anneals": float(self.anneals),
                **self._lambda_metrics()}

    def _lambda_metrics(self) -> dict:
        return {f"interp/lambda{i + 1}": v for i, v in enumerate(self.lambdas)}

    def update(self, state: LearnerState, rollout: Rollout, iteration: int) -> dict:
        return {**mle_on_samples(state, rollout, self.cfg.max_grad_norm), **self._lambda_metrics()}

    def own_state_dict(self) -> dict:
        return {"lambdas": list(self.lambdas), "history": list(self.history), "last_reward": self.last_reward,
                "snapshot": self.snapshot, "anneals": self.anneals}

    def load_own_state_dict(self, state: dict) -> None:
        if "lambdas" not in state:  # a checkpoint of the MLE stage: nothing annealed yet
            return
        self.lambdas, self.history = list(state["lambdas"]), list(state["history"])
        self.last_reward, self.snapshot, self.anneals = state["last_reward"], state["snapshot"], int(state["anneals"])
