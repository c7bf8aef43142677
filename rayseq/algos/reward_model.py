"""``algo.name=reward_model``: a Bradley–Terry reward model trained on preference pairs (``task.name=preferences``).

The model is the run's ``model.arch`` with a scalar head (:mod:`rayseq.models.reward_head`): r(x, y) = wᵀ h(x, y),
h the model's state after it has read the prompt x and the whole reply y (for an HF model the last hidden layer at
y's last token, what ``AutoModelForSequenceClassification`` reads). The head has no bias, as a transformers
classifier head has none: the loss reads differences, and the centring term (``algo.center_rewards_coefficient``)
fixes the offset. Each iteration draws ``train.batch_size`` pairs and
takes one step of

    L = −(1/B) Σ_i log σ(r(x_i, y⁺_i) − r(x_i, y⁻_i) − m_i)  +  c · (1/B) Σ_i (r⁺_i + r⁻_i)²

(:func:`rayseq.losses.preference.bradley_terry_loss`, TRL's ``RewardTrainer`` loss) on the generator's weights (or
its LoRA adapters) and the head, with several learners each on its rows (their gradients summed, as every
data-parallel update here). Chosen and rejected replies go through one pass of 2B rows.

Evaluation (``val/*`` every ``train.eval_every`` iterations, ``test/*`` at the end) scores every held-out pair:
``accuracy`` (the fraction with r⁺ > r⁻), ``margin`` (mean r⁺ − r⁻), ``loss`` (the Bradley–Terry term) and, beside
them, ``accuracy_longer``, the accuracy of the trivial rule "the longer reply is preferred" (ties count ½) — what
a model that only learns length gets. With ``train.best_metric=val/accuracy`` the run keeps its best validated model
in ``run_dir/best``; ``python -m rayseq.export`` writes an HF model as a sequence-classification folder.

References: Bradley & Terry (1952); Ouyang et al. (2022, Eq. 1); Touvron et al. (2023, Llama 2, Eq. 2, the margin);
Eisenstein et al. (2023, the centring term); TRL ``RewardTrainer``, OpenRLHF ``train_rm``.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import torch
from pydantic import Field
from torch import nn

from rayseq.algos.common import Algorithm, apply_gradients, grad_micro_batches, reduce_metrics
from rayseq.losses.preference import bradley_terry_loss
from rayseq.models.reward_head import reward_head, sequence_rewards
from rayseq.types import PreferenceBatch, to_torch

EVAL_ROWS = 64  # pairs per pass of an evaluation


def pair_rewards(policy, head: nn.Module, batch: PreferenceBatch, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(r⁺ (B,), r⁻ (B,)): the head on each reply's state at its <eos>, chosen and rejected in one pass of 2B rows."""
    src, src_len = to_torch(batch.src, device), to_torch(batch.src_len, device)
    tokens = torch.cat([to_torch(batch.chosen, device), to_torch(batch.rejected, device)])
    ends = torch.cat([to_torch(batch.chosen_len, device), to_torch(batch.rejected_len, device)])
    r = sequence_rewards(policy, head, src.repeat(2, 1), src_len.repeat(2), tokens, ends)
    return r[: len(src)], r[len(src) :]


def longer_accuracy(chosen_len: np.ndarray, rejected_len: np.ndarray) -> float:
    """The accuracy of "the longer reply is preferred" (ties ½): the trivial baseline of a reward model."""
    return float(np.mean(np.where(chosen_len > rejected_len, 1.0, np.where(chosen_len == rejected_len, 0.5, 0.0))))

@torch.no_grad()
def preference_figures(policy, head: nn.Module, task, split: str, device, use_margin: bool) -> tuple[dict, dict]:
    """``<split>/accuracy``, ``margin``, ``loss`` and ``accuracy_longer`` (module docstring) of the reward model
    (``policy``, ``head``) over every pair of the task's held-out ``split``, ``EVAL_ROWS`` pairs a pass; details: the
    split's size and its chance level."""
    batch = task.split_batch(split)
    was = policy.training
    policy.eval()
    pos, neg = [], []
    for a in range(0, len(batch), EVAL_ROWS):
        rows = np.arange(a, min(a + EVAL_ROWS, len(batch)))
        part = PreferenceBatch(*(getattr(batch, f)[rows] for f in batch.__dataclass_fields__))
        r_pos, r_neg = pair_rewards(policy, head, part, device)
        pos.append(r_pos.float().cpu())
        neg.append(r_neg.float().cpu())
    policy.train(was)
    r_pos, r_neg = torch.cat(pos), torch.cat(neg)
    margin = torch.as_tensor(batch.margin) if use_margin else None
    loss, stats = bradley_terry_loss(r_pos, r_neg, margin)
    return ({f"{split}/accuracy": float(stats.accuracy), f"{split}/margin": float(stats.margin),
             f"{split}/loss": float(loss), f"{split}/accuracy_longer": longer_accuracy(batch.chosen_len,
                                                                                       batch.rejected_len)},
            {"pairs": len(batch), "chance": 0.5})



class RewardModel(Algorithm):
    name = "reward_model"
    kind = "supervised"
    data_parallel = True
    fields = {
        "center_rewards_coefficient": (float | None, Field(
            None, ge=0.0, description="c of TRL's centring term c · mean((r⁺ + r⁻)²) (Eisenstein et al. 2023); "
            "None: none.")),
        "use_margin": (bool, Field(
            True, description="Subtract the data's margin column m from r⁺ − r⁻ (0 where a row has none).")),
    }
    own_task = "preferences"
    progress_metrics = {"loss/preference": "loss", "rm/accuracy": "acc"}
    carried = ()

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.task.name != cls.own_task:
            raise ValueError(f"algo.name=reward_model trains on preference pairs: set task.name=preferences (not "
                             f"{cfg.task.name})")
        if cfg.train.pretrain_iters:
            raise ValueError("algo.name=reward_model has no MLE pretraining on preference pairs: set "
                             "train.pretrain_iters=0")

    def build_modules(self, run_cfg, generator, task, device) -> dict:
        head = reward_head(generator.state_dim).to(device)
        return {"rm_head": head, "head_opt": torch.optim.Adam(head.parameters(), lr=run_cfg.algo.lr)}

    def config_lrs(self, run_cfg) -> dict:
        return {"head_opt": run_cfg.algo.lr}

    # -- the iteration ------------------------------------------------------------------------------
    def training_step(self, groups, step) -> dict:
        batch = step.task.sample_preferences(step.rng, step.batch_size)
        t0 = time.perf_counter()
        m = groups.learner.update_batch(batch, step.stage_iter)
        m["time/learn_s"] = time.perf_counter() - t0
        return m

    def update(self, state, batch: PreferenceBatch, iteration: int) -> dict:
        """One step of L (module docstring) on the generator (or its adapters) and the head. With several learners or
        ``learner.micro_batch_size`` below the batch's 2B rows, the gradient is accumulated over this rank's pairs in
        micro-batches of micro_batch_size // 2 pairs (a pair is two rows of the pass;
        :func:`~rayseq.algos.common.grad_micro_batches`): both terms of L are means over the pairs, so a micro-batch
        of B_m pairs scales its L_m by B_m / B and Σ_m (B_m / B) · L_m = L."""
        head = self.modules["rm_head"]
        length = batch.src.shape[1] + max(batch.chosen.shape[1], batch.rejected.shape[1])
        pieces = grad_micro_batches(state, len(batch), length, row_cost=2)
        state.gen_opt.zero_grad(set_to_none=True)
        self.modules["head_opt"].zero_grad(set_to_none=True)
        m: dict = defaultdict(float)
        for rows in [None] if pieces is None else pieces:  # None: the whole batch in one pass
            part, share = batch, 1.0
            if rows is not None:
                rows = rows.cpu().numpy()
                part = PreferenceBatch(*(getattr(batch, f)[rows] for f in batch.__dataclass_fields__))
                share = len(rows) / len(batch)
            r_pos, r_neg = pair_rewards(state.generator, head, part, state.device)
            margin = to_torch(part.margin, state.device) if self.cfg.use_margin else None
            loss, stats = bradley_terry_loss(r_pos, r_neg, margin, self.cfg.center_rewards_coefficient)
            (loss * share).backward()
            for k, v in (("loss/preference", loss.detach()), ("rm/accuracy", stats.accuracy),
                         ("rm/margin", stats.margin), ("rm/reward_mean", stats.reward_mean)):
                m[k] += float(v) * share
            del r_pos, r_neg, loss  # this micro-batch's graph, before the next one's
        grad_norm = apply_gradients(state.gen_opt, state.generator.parameters(), self.cfg.max_grad_norm, state.dp)
        apply_gradients(self.modules["head_opt"], head.parameters(), self.cfg.max_grad_norm, state.dp)
        return {**reduce_metrics(state, dict(m)), "policy/grad_norm": grad_norm}

    # -- evaluation ---------------------------------------------------------------------------------
    def evaluate_saved(self, location, generator, task, split, device) -> tuple[dict, dict]:
        """:func:`preference_figures` of a saved reward model: its policy and its head (read with the checkpoint's
        training state, from the learner's files or its shards: :func:`~rayseq.models.reward_head.trained_head`)."""
        from rayseq.checkpoint import load_checkpoint
        from rayseq.models.reward_head import trained_head

        head = trained_head(load_checkpoint(location), generator.state_dim).to(device)
        return preference_figures(generator, head, task, split, torch.device(device), self.cfg.use_margin)

    def evaluate(self, state, task, split: str = "val") -> tuple[dict, dict]:
        """:func:`preference_figures` of the model being trained."""
        return preference_figures(state.generator, self.modules["rm_head"], task, split, state.device,
                                  self.cfg.use_margin)
