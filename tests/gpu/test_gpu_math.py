"""The math layer on the device against the CPU: rollouts, the batched Monte-Carlo search and the fused
sampler exactly under shared uniforms (float64: a float32 matmul on another device may round a cdf differently in
the last bit, which flips a token when u lands on that boundary), sampling with the device's own random stream in
distribution (against the exact first-step distribution), and the discriminator's scores within float32 rounding."""

from __future__ import annotations

import pytest
import torch

from rayseq.models.discriminator import build_discriminator
from rayseq.models.generator import Seq2SeqGRU
from rayseq.models.sampling import sample_projected, sample_with_logp
from rayseq.models.transformer import TransformerGenerator
from rayseq.rewards.mc_search import draw_uniforms, mc_search, q_values

V, PAD, BOS, EOS = 40, 0, 1, 2


def policy(arch: str, conditional: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    if arch == "gru":
        m = Seq2SeqGRU(V, emb_dim=16, hidden_dim=24, cell="gru", conditional=conditional)
    elif arch == "lstm":
        m = Seq2SeqGRU(V, emb_dim=16, hidden_dim=24, cell="lstm", conditional=conditional, banned_ids=(0, 1, 2, 3))
    else:
        m = TransformerGenerator(V, hidden_dim=16, num_layers=2, n_heads=2, ff_dim=32, conditional=conditional)
    with torch.no_grad():
        m.out.bias[EOS] += 1.0  # some rows end early: the search must skip closed prefixes on both devices
    return m.double().eval()


def prompts(B: int, S: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, V, (B, S), generator=g), torch.randint(1, S + 1, (B,), generator=g)


@pytest.mark.parametrize("arch,conditional", [("gru", True), ("lstm", False), ("transformer", True)])
def test_mc_search_on_device_equals_cpu_under_shared_uniforms(device, arch, conditional):
    B, T, N = 6, 8, 4
    cpu = policy(arch, conditional)
    dev = policy(arch, conditional).to(device)
    src, src_len = prompts(B)
    s = cpu.sample(src, src_len, T, generator=torch.Generator().manual_seed(1))
    tokens = torch.nn.functional.pad(s.tokens, (0, T - s.tokens.shape[1]))
    mask = torch.nn.functional.pad(s.token_mask, (0, T - s.token_mask.shape[1]))
    u = draw_uniforms(B, T, N, torch.Generator().manual_seed(2)).double()
    on_cpu = mc_search(cpu, src, src_len, tokens, mask, N, u=u)
    on_dev = mc_search(dev, src.to(device), src_len.to(device), tokens.to(device), mask.to(device), N,
                       u=u.to(device))
    assert on_dev.tokens.device.type == device
    assert torch.equal(on_dev.tokens.cpu(), on_cpu.tokens)
    assert torch.equal(on_dev.lengths.cpu(), on_cpu.lengths)
    if arch != "lstm":  # (the oracle setting bans the end token: fixed length)
        assert (on_cpu.lengths < T).any()  # early-ended rows were part of the comparison


def test_fused_sampler_on_device_equals_cpu(device):
    g = torch.Generator().manual_seed(0)
    R, H = 3000, 32
    h, w = torch.randn(R, H, generator=g, dtype=torch.float64), torch.randn(5000, H, generator=g, dtype=torch.float64)
    bias = torch.randn(5000, generator=g, dtype=torch.float64)
    bias[:4] = float("-inf")  # banned ids
    u = torch.rand(R, generator=g, dtype=torch.float64)
    for temperature in (1.0, 0.7):
        cpu = sample_projected(h, w, bias, u, temperature)
        dev = sample_projected(h.to(device), w.to(device), bias.to(device), u.to(device), temperature)
        assert torch.equal(dev.cpu(), cpu) and (cpu >= 4).all()
        full, _ = sample_with_logp(h.to(device) @ w.to(device).T + bias.to(device), u.to(device), temperature)
        assert torch.equal(full.cpu(), cpu)


@pytest.mark.parametrize("arch", ["gru", "transformer"])
def test_rollouts_on_device_follow_the_policy(device, arch):
    """y_1 of 20,000 replies sampled on the device with its own generator: total variation to the exact π(y_1|x) of
    the CPU model below 0.03 (the expected TV of 20,000 draws over 40 ids is ≈ 0.02). The log-probs returned with the
    tokens are the CPU model's teacher-forced ones."""
    cpu = policy(arch).float()
    dev = policy(arch).float().to(device)
    src, src_len = prompts(1)
    n = 20_000
    s = dev.sample(src.to(device).expand(n, -1), src_len.to(device).expand(n), 6,
                   generator=torch.Generator(device=device).manual_seed(3))
    exact = cpu.first_step_logprobs(src, src_len).exp()[0].detach()
    freq = torch.bincount(s.tokens[:, 0].cpu(), minlength=V).double() / n
    assert 0.5 * (freq - exact.double()).abs().sum() < 0.03
    tf = cpu.logprobs(src.expand(64, -1), src_len.expand(64), s.tokens[:64].cpu()).logp.detach()
    assert torch.allclose((s.logp[:64].cpu() * s.token_mask[:64].cpu()), tf * s.token_mask[:64].cpu(), atol=1e-5)


def test_discriminator_scores_on_device_equal_cpu(device):
    torch.manual_seed(0)
    d_cpu = build_discriminator(V, emb_dim=16, filter_sizes=(1, 2, 3, 5), num_filters=(8, 8, 8, 8)).eval()
    d_dev = build_discriminator(V, emb_dim=16, filter_sizes=(1, 2, 3, 5), num_filters=(8, 8, 8, 8))
    d_dev.load_state_dict(d_cpu.state_dict())
    d_dev = d_dev.to(device).eval()
    B, T, N = 8, 10, 3
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(4, V, (B, T), generator=g)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    full_cpu = d_cpu.score(tokens, lengths)
    full_dev = d_dev.score(tokens.to(device), lengths.to(device))
    assert torch.allclose(full_dev.cpu(), full_cpu, atol=1e-5)
    # the prefix-shared scoring of Monte-Carlo continuations (what the scorer actors run), then Q
    cont = torch.randint(4, V, (B, T - 1, N, T), generator=g)
    for j in range(T - 1):  # continuation n of prefix j + 1 starts with that prefix of its base sequence
        cont[:, j, :, : j + 1] = tokens[:, None, : j + 1]
    cont_len = torch.full((B, T - 1, N), T)
    prefix_len = torch.arange(1, T)
    q_cpu = q_values(d_cpu.score_shared_prefix(tokens, lengths, cont, cont_len, prefix_len), full_cpu, lengths)
    d_cont = d_dev.score_shared_prefix(tokens.to(device), lengths.to(device), cont.to(device), cont_len.to(device),
                                       prefix_len.to(device))
    q_dev = q_values(d_cont, full_dev, lengths.to(device))
    assert q_dev.device.type == device and torch.allclose(q_dev.cpu(), q_cpu, atol=1e-5)
