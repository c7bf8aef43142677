"""The GAN discriminator objective.

References
- Yu, Zhang, Wang, Yu (2017), "SeqGAN: Sequence Generative Adversarial Nets with Policy Gradient",
  Eq. 5: min_φ −E_{Y∼p_data}[log D_φ(Y)] − E_{Y∼G_θ}[log(1 − D_φ(Y))].
- The SeqGAN code (github.com/LantaoYu/SeqGAN, ``discriminator.py``): mean cross-entropy plus
  ``l2_reg_lambda · l2_loss`` with ``l2_reg_lambda = 0.2`` and ``l2_loss = tf.nn.l2_loss(W) +
  tf.nn.l2_loss(b)`` of the output layer only, where ``tf.nn.l2_loss(w) = sum(w²) / 2``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import torch
import torch.nn.functional as F


class DiscStats(NamedTuple):
    accuracy: torch.Tensor  # share of the B1 + B2 examples on the right side of D = 0.5
    d_real: torch.Tensor  # mean D(Y) on real examples
    d_fake: torch.Tensor  # mean D(Y) on generated examples


def discriminator_loss(
    logits_real: torch.Tensor,
    logits_fake: torch.Tensor,
    l2_reg: float = 0.0,
    params: Iterable[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, DiscStats]:
    """Binary cross-entropy of the discriminator, SeqGAN Eq. 5, plus an optional L2 penalty.

    logits_real (B1,) z = logit D(Y) of real sequences (label 1), logits_fake (B2,) of generated
    ones (label 0), D = σ(z):

        loss = −[Σ_real log σ(z) + Σ_fake log(1 − σ(z))] / (B1 + B2) + l2_reg · Σ_p ‖p‖² / 2

    The mean runs over all B1 + B2 examples; with B1 = B2 (SeqGAN balances them) it is Eq. 5 times
    1/2. The L2 term uses ``tf.nn.l2_loss``'s ‖p‖²/2 so that ``l2_reg`` means what the SeqGAN code's
    ``l2_reg_lambda`` (0.2) means; that code applies it to the output layer only, i.e.
    ``params=disc.out.parameters()``. Accuracy counts real as correct when D > 0.5 and generated as
    correct when D ≤ 0.5 (the code's argmax over [fake, real] picks fake on a tie).
    """
    logits = torch.cat([logits_real, logits_fake])
    labels = torch.cat([torch.ones_like(logits_real), torch.zeros_like(logits_fake)])
    loss = F.binary_cross_entropy_with_logits(logits, labels)
    if l2_reg and params is not None:
        loss = loss + l2_reg * sum(p.pow(2).sum() for p in params) / 2
    with torch.no_grad():
        correct = torch.cat([logits_real > 0, logits_fake <= 0]).to(logits.dtype)
        stats = DiscStats(
            accuracy=correct.mean(),
            d_real=torch.sigmoid(logits_real).mean(),
            d_fake=torch.sigmoid(logits_fake).mean(),
        )
    return loss, stats
