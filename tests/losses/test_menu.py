"""Hand-computed checks of the policy-loss menu (``rayseq.losses.menu``, ``rayseq.losses.aggregate``) and the
equivalences between its variants; every aggregation against a plain loop; every variant split over parts of its
batch (learner ranks, micro-batches) summing, share-weighted, to the whole.

References: Shao et al. 2024 (GRPO, Eq. 3), Yu et al. 2025 (DAPO), Liu et al. 2025 (Dr.GRPO), Zheng et al. 2025
(GSPO), MiniMax-M1 (CISPO), Gao et al. 2025 (SAPO), Zhao et al. 2025 (GMPO), Wang et al. 2025 (80/20 rule).
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from rayseq.losses import (
    LOSS_TYPES,
    cispo_loss,
    constant_length_mean,
    dapo_loss,
    dr_grpo_loss,
    gmpo_loss,
    grpo_loss,
    high_entropy_mask,
    luspo_loss,
    ppo_clip_loss,
    ppo_dynamic_loss,
    reinforce_loss,
    sapo_loss,
    sequence_log_ratio,
    sequence_mean,
    sequence_sum_mean,
    token_entropy,
    token_mean,
)
from rayseq.losses.menu import VERL_AGGREGATIONS

F64 = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def ratio_inputs(ratios):
    """old_logp, logp (leaf) such that ρ = exp(logp − old_logp) equals ``ratios``: π_old = 0.3 everywhere."""
    ratios = t(ratios)
    old_logp = torch.log(torch.full_like(ratios, 0.3))
    return (old_logp + torch.log(ratios)).detach().requires_grad_(True), old_logp


def loss_and_grad(fn, logp, *args, **kwargs):
    logp = logp.detach().clone().requires_grad_(True)
    loss, stats = fn(logp, *args, **kwargs)
    loss.backward()
    return loss.detach(), logp.grad, stats


# Two replies: row 0 has 3 tokens, A = +2, ratios 1.1, 1.5, 0.5; row 1 has 1 token, A = −1, ratio 1.1.
# PPO's objective min(ρA, clip(ρ, 0.8, 1.2)A) per token (ε = 0.2):
#   row 0: 1.1·2 = 2.2 (inside); min(3.0, 2.4) = 2.4 (clipped, no gradient); min(1.0, 1.6) = 1.0 (unclipped)
#   row 1: 1.1·(−1) = −1.1 (inside)
# token sums: row 0 = 5.6, row 1 = −1.1; gradient of each unclipped term wrt its logp: ρA
MASK = [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
RATIOS = [[1.1, 1.5, 0.5], [1.1, 1.0, 1.0]]
ADV = [[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]]
D_TERM = [[2.2, 0.0, 1.0], [-1.1, 0.0, 0.0]]  # ∂(objective)/∂logp per token


def _case():
    logp, old = ratio_inputs(RATIOS)
    return logp, old, t(ADV) * t(MASK), t(MASK)


@pytest.mark.parametrize("fn, kwargs, value, coef", [
    # dapo: Σ / 4 tokens = (5.6 − 1.1)/4 = 1.125; each token's weight 1/4
    (dapo_loss, {}, 4.5 / 4, [[1 / 4] * 3, [1 / 4] * 3]),
    # grpo: mean over replies of token means = (5.6/3 − 1.1)/2 = 0.38333; row 0 weighs 1/(2·3), row 1 1/(2·1)
    (grpo_loss, {}, (5.6 / 3 - 1.1) / 2, [[1 / 6] * 3, [1 / 2] * 3]),
    # dr_grpo, L = 4: Σ / (2 replies · 4) = 4.5/8; every token 1/8
    (dr_grpo_loss, {"max_len": 4}, 4.5 / 8, [[1 / 8] * 3, [1 / 8] * 3]),
    # luspo (per-token ratio: veRL's seq-mean-token-sum): (5.6 − 1.1)/2 replies; every token 1/2
    (luspo_loss, {}, 4.5 / 2, [[1 / 2] * 3, [1 / 2] * 3]),
])
def test_clip_variants_by_hand(fn, kwargs, value, coef):
    logp, old, adv, mask = _case()
    loss, grad, stats = loss_and_grad(fn, logp, old, adv, mask, eps=0.2, **kwargs)
    assert loss.item() == pytest.approx(-value)
    torch.testing.assert_close(grad, -t(coef) * t(D_TERM))  # masked tokens: D_TERM 0
    # clipped: ρ = 1.5 and 0.5 (row 0) of the 4 counted tokens
    assert stats.clipfrac.item() == pytest.approx(2 / 4)


def test_dapo_is_ppo_clip_loss_bit_for_bit():
    """dapo with its defaults computes the operations of Tuan et al. Eq. 3's loss: GRPO's default is unchanged."""
    torch.manual_seed(0)
    logp, old = -torch.rand(4, 6), -torch.rand(4, 6)
    adv, mask = torch.randn(4, 6), (torch.rand(4, 6) > 0.3).float()
    a = loss_and_grad(ppo_clip_loss, logp, old, adv, mask, eps=0.2, eps_high=0.28)
    b = loss_and_grad(dapo_loss, logp, old, adv, mask, eps=0.2, eps_high=0.28)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert all(torch.equal(x, y) for x, y in zip(a[2], b[2]))


def test_gspo_sequence_ratio_by_hand():
    # GSPO: log s_0 = (log 1.1 + log 1.5 + log 0.5)/3 = −0.0641 -> s_0 = 0.93790, inside [0.8, 1.2]: 2·s_0 per token
    # row 1 (one token): s_1 = 1.1. grpo at sequence level: −((1/3)·3·2 s_0 + (−1.1))/2
    logp, old, adv, mask = _case()
    s0 = math.exp((math.log(1.1) + math.log(1.5) + math.log(0.5)) / 3)
    log_s = sequence_log_ratio(logp, old, mask)
    torch.testing.assert_close(log_s.exp(), t([[s0] * 3, [1.1] * 3]))
    loss, grad, _ = loss_and_grad(grpo_loss, logp, old, adv, mask, log_ratio=sequence_log_ratio)
    assert loss.item() == pytest.approx(-(2 * s0 - 1.1) / 2)
    # ∂s_0/∂logp_0,t = s_0/3 -> ∂loss = −(1/2)·A·s_0/3 on each of row 0's tokens; row 1: −(1/2)·(−1)·1.1
    torch.testing.assert_close(grad, t([[-(2 * s0 / 3) / 2] * 3, [0.55, 0.0, 0.0]]))


def test_delta_caps_the_unclipped_ratio():
    # A = −1, ρ = 3, ε = 0.2: Eq. 3's min(3·(−1), 1.2·(−1)) = −3 with gradient −3; δ = 2: min(2·(−1), −1.2) = −2, and
    # min(ρ, δ) is constant above δ: no gradient
    logp, old = ratio_inputs([[3.0]])
    adv, mask = t([[-1.0]]), t([[1.0]])
    loss, grad, _ = loss_and_grad(dapo_loss, logp, old, adv, mask)
    assert loss.item() == pytest.approx(3.0) and grad.item() == pytest.approx(3.0)
    loss, grad, _ = loss_and_grad(dapo_loss, logp, old, adv, mask, delta=2.0)
    assert loss.item() == pytest.approx(2.0) and grad.item() == 0.0
    # below δ nothing changes
    logp, old = ratio_inputs([[1.5]])
    assert loss_and_grad(dapo_loss, logp, old, adv, mask, delta=2.0)[1].item() == pytest.approx(1.5)


def test_cispo_by_hand():
    # weights sg(min(ρ, 1.2)) = [1.1, 1.2, 0.5], [1.1]; objective w·A·log π over 4 tokens, log π = log(0.3ρ)
    logp, old, adv, mask = _case()
    loss, grad, stats = loss_and_grad(cispo_loss, logp, old, adv, mask, eps_max=1.2)
    w = [[1.1, 1.2, 0.5], [1.1, 0.0, 0.0]]
    lp = [[math.log(0.3 * r) for r in row] for row in RATIOS]
    expected = sum(w[i][j] * ADV[i][j] * lp[i][j] for i in range(2) for j in range(3) if MASK[i][j]) / 4
    assert loss.item() == pytest.approx(-expected)
    # the weight is a constant: ∂loss/∂logp = −w·A/4, on every token (none loses its gradient, unlike the clip)
    torch.testing.assert_close(grad, -t(w) * t(ADV) / 4)
    assert stats.clipfrac.item() == pytest.approx(1 / 4)  # ρ = 1.5 > 1.2


def test_sapo_by_hand():
    # one reply, A = +1, ratios 1 and 2, τ_pos = 1: f(ρ) = 4σ(ρ − 1): f(1) = 2, f(2) = 4σ(1) = 2.9242;
    # loss = −(2 + 2.9242)/2; f'(ρ)·ρ = ρ·4σ(1 − σ): 1 at ρ = 1, 2·4·0.73106·0.26894 = 1.57290 at ρ = 2
    logp, old = ratio_inputs([[1.0, 2.0]])
    adv, mask = t([[1.0, 1.0]]), t([[1.0, 1.0]])
    sig1 = 1 / (1 + math.exp(-1))
    loss, grad, stats = loss_and_grad(sapo_loss, logp, old, adv, mask)
    assert loss.item() == pytest.approx(-(2 + 4 * sig1) / 2)
    slope = 2 * 4 * sig1 * (1 - sig1)
    torch.testing.assert_close(grad, t([[-0.5, -slope / 2]]))
    # the share of the on-policy gradient the gate removes: (0 + (1 − slope/2))/2
    assert stats.clipfrac.item() == pytest.approx((1 - slope / 2) / 2)
    # A ≤ 0 takes τ_neg: f(1) = 2/τ_neg, and the slope at ρ = 1 is still 1
    loss, grad, _ = loss_and_grad(sapo_loss, logp[:, :1], old[:, :1], t([[-1.0]]), t([[1.0]]), tau_neg=1.05)
    assert loss.item() == pytest.approx(2 / 1.05) and grad.item() == pytest.approx(1.0)


def test_gmpo_by_hand():
    # ε = 0.4 in log space. Row 0, A = +1, log ρ = [0.1, 0.6]: clipped to [0.1, 0.4], A > 0 takes the min: [0.1, 0.4]
    # (0.4 has no gradient); mean 0.25. Row 1, A = −1, log ρ = [−0.6, 0.2]: the max of [−0.6, 0.2] and [−0.4, 0.2]:
    # [−0.4 (no gradient), 0.2]; mean −0.1. loss = −(e^0.25 − e^−0.1)/2
    logp, old = ratio_inputs([[math.exp(0.1), math.exp(0.6)], [math.exp(-0.6), math.exp(0.2)]])
    adv, mask = t([[1.0, 1.0], [-1.0, -1.0]]), t([[1.0, 1.0], [1.0, 1.0]])
    loss, grad, stats = loss_and_grad(gmpo_loss, logp, old, adv, mask, eps=0.4)
    assert loss.item() == pytest.approx(-(math.exp(0.25) - math.exp(-0.1)) / 2)
    # ∂ exp(mean ℓ)/∂logp_t = exp(mean)/2 for an unclipped token; loss = −(1/2) Σ_i A_i exp(·)
    torch.testing.assert_close(grad, t([[-math.exp(0.25) / 4, 0.0], [0.0, math.exp(-0.1) / 4]]))
    assert stats.clipfrac.item() == pytest.approx(2 / 4)  # |log ρ| = 0.6 twice


def test_high_entropy_mask_by_hand():
    # the 5 counted entropies sorted 0.1 0.3 0.5 0.7 0.9; ρ = 0.4 keeps those ≥ the 0.6-quantile: position 0.6·4 = 2.4
    # -> 0.5 + 0.4·(0.7 − 0.5) = 0.58: 0.9 and 0.7 (9.0 is not counted). Entropies in fp32, as token_entropy gives
    # them (the quantile is taken in fp32, as TRL takes it)
    h = torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.7, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    torch.testing.assert_close(high_entropy_mask(h, mask, 0.4), torch.tensor([[0.0, 0, 1], [0, 1, 0]]))
    assert high_entropy_mask(h, mask, 1.0).sum() == 5  # ρ = 1: every counted token
    torch.testing.assert_close(high_entropy_mask(h, mask, 0.0), torch.tensor([[0.0, 0, 1], [0, 0, 0]]))  # the top one
    # a part of a batch: the quantile of the whole population's tokens
    part = high_entropy_mask(h[1:], mask[1:], 0.4, population=(h, mask))
    torch.testing.assert_close(part, torch.tensor([[0.0, 1, 0]]))
    # uniform over 4 ids: log 4; one id: 0; a banned id (−inf) adds nothing
    logits = t([[[0.0, 0.0, 0.0, 0.0], [50.0, 0.0, 0.0, float("-inf")]]])
    torch.testing.assert_close(token_entropy(logits), torch.tensor([[math.log(4), 0.0]]), atol=1e-6, rtol=0)


def test_keep_drops_terms_not_denominators():
    # dapo with only row 0's first token kept: its term 2.2 over the 4 counted tokens (TRL's top_entropy_quantile)
    logp, old, adv, mask = _case()
    keep = t([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    loss, grad, _ = loss_and_grad(dapo_loss, logp, old, adv, mask, keep=keep)
    assert loss.item() == pytest.approx(-2.2 / 4)
    torch.testing.assert_close(grad, t([[-2.2 / 4, 0, 0], [0, 0, 0]]))


# -- the aggregations against plain loops ---------------------------------------------------------


def test_aggregations_against_plain_loops():
    torch.manual_seed(1)
    x, keep = torch.randn(5, 7, dtype=F64), (torch.rand(5, 7) > 0.4).to(F64)
    mask = (torch.rand(5, 7) > 0.3).to(F64)
    mask[2] = 0  # a reply with no counted token
    rows = [[(x[i, j] * keep[i, j]).item() for j in range(7) if mask[i, j]] for i in range(5)]
    assert token_mean(x, mask, keep).item() == pytest.approx(sum(map(sum, rows)) / sum(map(len, rows)))
    assert sequence_mean(x, mask, keep).item() == pytest.approx(sum(sum(r) / max(len(r), 1) for r in rows) / 5)
    assert sequence_sum_mean(x, mask, keep).item() == pytest.approx(sum(map(sum, rows)) / 5)
    assert constant_length_mean(x, mask, keep, max_len=9).item() == pytest.approx(sum(map(sum, rows)) / (5 * 9))
    logp, old = -torch.rand(5, 7, dtype=F64), -torch.rand(5, 7, dtype=F64)
    seq = sequence_log_ratio(logp, old, mask)
    for i in range(5):
        terms = [(logp[i, j] - old[i, j]).item() for j in range(7) if mask[i, j]]
        assert seq[i, 3].item() == pytest.approx(sum(terms) / max(len(terms), 1))
        assert (seq[i] == seq[i, 0]).all()  # one ratio for every token of the reply


# -- equivalences --------------------------------------------------------------------------------


def _random_batch(seed: int, B: int = 6, T: int = 5, lengths=None):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g) if lengths is None else torch.as_tensor(lengths)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)
    old = -torch.rand(B, T, generator=g, dtype=F64) - 0.1
    logp = old + 0.3 * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.randn(B, 1, generator=g, dtype=F64) * mask  # one advantage per reply, as GRPO's
    return logp, old, adv, mask


def assert_same(a, b):
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1], b[1])


def test_gspo_with_one_token_per_reply_is_grpo():
    """A reply of one token: its sequence ratio is its token ratio, so GSPO is GRPO (and every aggregation at
    sequence level is the same aggregation at token level)."""
    logp, old, adv, mask = _random_batch(0, lengths=[1] * 6)
    for fn in (grpo_loss, dapo_loss, luspo_loss, partial(dr_grpo_loss, max_len=5)):
        assert_same(loss_and_grad(fn, logp, old, adv, mask, log_ratio=sequence_log_ratio),
                    loss_and_grad(fn, logp, old, adv, mask))


def test_dr_grpo_is_verls_seq_mean_token_sum_norm():
    """Dr.GRPO = veRL's seq-mean-token-sum-norm: each reply's token sum over loss_scale_factor L, averaged over the
    replies (veRL's agg_loss), the names mapping to one variant."""
    logp, old, adv, mask = _random_batch(1)
    assert LOSS_TYPES[VERL_AGGREGATIONS["seq-mean-token-sum-norm"]] is LOSS_TYPES["dr_grpo"]
    loss, grad, _ = loss_and_grad(dr_grpo_loss, logp, old, adv, mask, max_len=7)

    def verl(lp):
        ratio = torch.exp(lp - old)
        per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)
        seq_losses = (per_token * mask).sum(-1) / 7  # token-sum, then / loss_scale_factor
        return seq_losses.sum() / len(seq_losses), None  # seq-mean over the batch

    assert_same((loss, grad), loss_and_grad(verl, logp))


def test_verl_names_map_to_the_same_variants():
    assert {k: LOSS_TYPES[v] for k, v in VERL_AGGREGATIONS.items()} == {
        "token-mean": LOSS_TYPES["dapo"], "seq-mean-token-mean": LOSS_TYPES["grpo"],
        "seq-mean-token-sum": LOSS_TYPES["luspo"], "seq-mean-token-sum-norm": LOSS_TYPES["dr_grpo"]}
    assert LOSS_TYPES["bnpo"].loss is dapo_loss  # one denominator, whatever the split (module docstring)


def test_aggregations_coincide_when_every_reply_has_one_length():
    """Replies of one length ℓ: grpo = dapo (a reply's mean over the batch's mean), dr_grpo with L = ℓ = dapo, luspo =
    ℓ · grpo; the length bias the variants differ on needs replies of different lengths."""
    logp, old, adv, mask = _random_batch(2, lengths=[4] * 6)
    dapo = loss_and_grad(dapo_loss, logp, old, adv, mask)
    assert_same(loss_and_grad(grpo_loss, logp, old, adv, mask), dapo)
    assert_same(loss_and_grad(dr_grpo_loss, logp, old, adv, mask, max_len=4), dapo)
    luspo = loss_and_grad(luspo_loss, logp, old, adv, mask)
    assert_same((luspo[0] / 4, luspo[1] / 4), dapo)
    # different lengths: they differ
    logp, old, adv, mask = _random_batch(3, lengths=[1, 2, 5, 5, 3, 1])
    assert not torch.allclose(loss_and_grad(grpo_loss, logp, old, adv, mask)[1],
                              loss_and_grad(dapo_loss, logp, old, adv, mask)[1])


def test_on_policy_every_variant_takes_its_aggregations_reinforce_step():
    """At ρ = 1 (the first minibatch of an update) no clip binds: dapo's and CISPO's gradients are REINFORCE's token
    mean; grpo's, SAPO's (f'(1) = 1) and GMPO's (∂ exp(mean log ρ) = mean ∂ log ρ) are its per-reply mean."""
    logp, _, adv, mask = _random_batch(4)
    old = logp.detach()
    per_token = loss_and_grad(reinforce_loss, logp, adv, mask)[1]
    per_reply = loss_and_grad(partial(reinforce_loss, aggregate=sequence_mean), logp, adv, mask)[1]
    torch.testing.assert_close(loss_and_grad(dapo_loss, logp, old, adv, mask)[1], per_token)
    torch.testing.assert_close(loss_and_grad(cispo_loss, logp, old, adv, mask, eps_max=5.0)[1], per_token)
    for fn in (grpo_loss, sapo_loss, gmpo_loss):
        torch.testing.assert_close(loss_and_grad(fn, logp, old, adv, mask)[1], per_reply)
    # PPO-dynamic's objective takes the aggregation it is given
    torch.testing.assert_close(loss_and_grad(ppo_dynamic_loss, logp, old, adv, mask, aggregate=sequence_mean)[1],
                               per_reply)


# -- a batch split over parts (learner ranks, micro-batches) ---------------------------------------


VARIANTS = {
    "dapo": partial(dapo_loss, eps_high=0.28, delta=1.6),
    "grpo": grpo_loss,
    "gspo": partial(grpo_loss, eps=0.05, log_ratio=sequence_log_ratio),
    "dr_grpo": partial(dr_grpo_loss, max_len=6),
    "luspo": partial(luspo_loss, log_ratio=sequence_log_ratio),
    "cispo": partial(cispo_loss, eps_max=1.1),
    "sapo": sapo_loss,
    "gmpo": gmpo_loss,
}


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("with_keep", [False, True])
def test_parts_of_a_batch_sum_to_the_whole(name, with_keep):
    """Rows split into parts of 2, 3 and 3: each part's loss times its share of the variant's denominator (its
    tokens, or its replies) sums to the whole batch's loss and gradient; the high-entropy tokens chosen over the
    whole batch (rayseq.algos.parallel: N learner ranks make the update of one)."""
    fn, per_reply = VARIANTS[name], LOSS_TYPES[name if name != "gspo" else "grpo"].per_reply
    logp, old, adv, mask = _random_batch(5, B=8, T=6)
    h = torch.rand(8, 6, generator=torch.Generator().manual_seed(9), dtype=F64)
    keep = high_entropy_mask(h, mask, 0.5) if with_keep else None
    whole_loss, whole_grad, _ = loss_and_grad(fn, logp, old, adv, mask, keep=keep)
    total, grad = 0.0, torch.zeros_like(logp)
    for rows in (slice(0, 2), slice(2, 5), slice(5, 8)):
        part_keep = None if keep is None else high_entropy_mask(h[rows], mask[rows], 0.5, population=(h, mask))
        lp = logp[rows].detach().clone().requires_grad_(True)
        loss, _ = fn(lp, old[rows], adv[rows], mask[rows], keep=part_keep)
        counted = (lambda m: torch.ones(len(m))) if per_reply else (lambda m: m)
        share = counted(mask[rows]).sum() / counted(mask).sum()
        (loss * share).backward()
        total += (loss * share).item()
        grad[rows] = lp.grad
    assert total == pytest.approx(whole_loss.item(), rel=1e-12, abs=1e-12)
    torch.testing.assert_close(grad, whole_grad)
