"""The loss menu side by side with TRL's own code: TRL's ``GRPOTrainer._compute_loss`` (and its experimental
``GMPOTrainer._compute_loss``) run on a minimal stand-in for the trainer, fed the per-token log-probs, old log-probs,
advantages, masks, entropies and vLLM importance weights rayseq's functions get, for every ``loss_type`` ×
``importance_sampling_level``: the losses and their gradients with respect to the log-probs agree.

The stand-in holds what ``_compute_loss`` reads of the trainer (its config values, an accelerator of one process,
a metrics dict) and returns the given log-probs and entropies from ``_get_per_token_logps_and_entropies``, the model
pass it makes; the rest is TRL's code path as it runs in training (one process, no gradient accumulation, one step
per generation, β = 0).

What each side is given the same way: GRPO's advantages one per reply (rayseq: on every counted token); TRL's
``top_entropy_quantile`` mask and rayseq's ``high_entropy_mask`` from the same entropies; vLLM's truncated
importance weights, which TRL multiplies into each token's loss and rayseq into each token's advantage.
"""

from __future__ import annotations

import types
import zlib
from collections import defaultdict
from functools import partial

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is not installed (pip install -e '.[peers]'): the side-by-side check of "
                                        "the loss menu against TRL's own loss code needs it")

from rayseq.algos.loss_menu import chosen  # noqa: E402
from rayseq.losses import high_entropy_mask  # noqa: E402
from rayseq.losses.menu import IMPORTANCE_SAMPLING_LEVELS  # noqa: E402

F64 = torch.float64
B, T, MAX_LEN = 6, 5, 7
EPS, EPS_HIGH, DELTA, CISPO_CAP = 0.2, 0.28, 1.5, 1.3
TRL_LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo")


class OneProcess:
    """TRL's accelerator, for one process."""

    num_processes = 1

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def batch(seed: int):
    """Replies of 1..T tokens, off-policy log-probs (so the clips bind), one advantage per reply, fp32 entropies as the
    policy's logits give them, truncated importance weights min(π_old / π_vllm, 2)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([1, 5, 3, 5, 2, 4])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)
    old = -torch.rand(B, T, generator=g, dtype=F64) * 2 - 0.05
    logp = old + 0.4 * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.randn(B, generator=g, dtype=F64)
    entropies = torch.rand(B, T, generator=g) * 3
    is_ratio = torch.exp(0.3 * torch.randn(B, T, generator=g, dtype=F64)).clamp(max=2.0)
    return logp, old, adv, mask, entropies, is_ratio


def trainer_stub(trainer_cls, logp: torch.Tensor, entropies: torch.Tensor, **values):
    """What ``trainer_cls._compute_loss`` reads of its trainer, the model pass returning ``logp`` and ``entropies``."""
    stub = types.SimpleNamespace(
        model=types.SimpleNamespace(training=True), accelerator=OneProcess(), beta=0.0, aux_loss_enabled=False,
        off_policy_mask_threshold=None, current_gradient_accumulation_steps=1, _entropy_bonus_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)), **values)
    stub._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logp, entropies, None)
    stub.get_high_entropy_mask = types.MethodType(trainer_cls.get_high_entropy_mask, stub)
    return stub


def trl_inputs(old, adv, mask, is_ratio=None) -> dict:
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
              "advantages": adv, "old_per_token_logps": old, "num_items_in_batch": mask.sum()}
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    return inputs


def run_trl_grpo(loss_type, level, logp, old, adv, mask, entropies, *, quantile=1.0, is_ratio=None):
    from trl import GRPOTrainer

    leaf = logp.detach().clone().requires_grad_(True)
    args = types.SimpleNamespace(delta=DELTA, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05,
                                 use_bias_correction_kl=False, steps_per_generation=1)
    stub = trainer_stub(GRPOTrainer, leaf, entropies, args=args, loss_type=loss_type, importance_sampling_level=level,
                        epsilon_low=EPS, epsilon_high=CISPO_CAP if loss_type == "cispo" else EPS_HIGH,
                        top_entropy_quantile=quantile, max_completion_length=MAX_LEN, use_vllm=is_ratio is not None,
                        vllm_importance_sampling_correction=is_ratio is not None)
    loss = GRPOTrainer._compute_loss(stub, None, trl_inputs(old, adv, mask, is_ratio))
    loss.backward()
    return loss.detach(), leaf.grad


def run_rayseq(loss_type, level, logp, old, adv, mask, entropies, *, quantile=1.0, is_ratio=None, **coefficients):
    """rayseq's variant as the algorithms bind it: advantages on the counted tokens (times the importance weights),
    the high-entropy tokens as ``keep``."""
    leaf = logp.detach().clone().requires_grad_(True)
    token_adv = adv[:, None] * mask * (1.0 if is_ratio is None else is_ratio)
    keep = None if quantile >= 1.0 else high_entropy_mask(entropies.to(F64), mask, quantile)
    fn = chosen(loss_type).loss
    if loss_type != "gmpo":
        coefficients["log_ratio"] = IMPORTANCE_SAMPLING_LEVELS[level]
    loss, _ = partial(fn, **coefficients)(leaf, old, token_adv, mask, keep=keep)
    loss.backward()
    return loss.detach(), leaf.grad


def coefficients(loss_type: str) -> dict:
    return {"cispo": {"eps_max": CISPO_CAP}, "sapo": {"tau_pos": 1.0, "tau_neg": 1.05},
            "dr_grpo": {"max_len": MAX_LEN, "eps": EPS, "eps_high": EPS_HIGH, "delta": DELTA}
            }.get(loss_type, {"eps": EPS, "eps_high": EPS_HIGH, "delta": DELTA})


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", TRL_LOSS_TYPES)
@pytest.mark.parametrize("setting", ["plain", "high_entropy_tokens_and_vllm_weights"])
def test_every_loss_type_and_level_agrees_with_trl(loss_type, level, setting):
    logp, old, adv, mask, entropies, is_ratio = batch(zlib.crc32(f"{loss_type} {level} {setting}".encode()))
    extra = {} if setting == "plain" else {"quantile": 0.4, "is_ratio": is_ratio}
    ours = run_rayseq(loss_type, level, logp, old, adv, mask, entropies, **extra, **coefficients(loss_type))
    theirs = run_trl_grpo(loss_type, level, logp, old, adv, mask, entropies, **extra)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-6, atol=1e-9)
    assert ours[1].abs().sum() > 0


@pytest.mark.parametrize("quantile", [1.0, 0.4])
def test_gmpo_agrees_with_trls_gmpo_trainer(quantile):
    from trl.experimental.gmpo import GMPOTrainer

    logp, old, adv, mask, entropies, _ = batch(11)
    leaf = logp.detach().clone().requires_grad_(True)
    stub = trainer_stub(GMPOTrainer, leaf, entropies, epsilon_low=0.4, epsilon_high=0.3,
                        top_entropy_quantile=quantile)
    theirs = GMPOTrainer._compute_loss(stub, None, trl_inputs(old, adv, mask))
    theirs.backward()
    ours = run_rayseq("gmpo", "token", logp, old, adv, mask, entropies, quantile=quantile, eps=0.4, eps_high=0.3)
    torch.testing.assert_close(ours[0], theirs.detach(), rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(ours[1], leaf.grad, rtol=1e-6, atol=1e-9)
