"""The critic V_ψ(s_t) of actor-critic training (Keneshloo et al. survey Sec. III-B, Algorithm 3; Bahdanau et
al. 2017): an MLP on the *detached* decoder state s_t (the state that produces y_t's distribution), trained
by regression on TD(λ) targets so that its gradient never reaches the generator.

Because s_{t+1} has read y_t, V(s_{t+1}) is also the action value Q(Y_1:t−1, y_t) of the token just taken
(deterministic transitions): SeqGAN-critic uses r_t + γ V(s_{t+1}) in place of the Monte-Carlo Q.
"""

from __future__ import annotations

import torch
from torch import nn


class Critic(nn.Module):
    def __init__(self, state_dim: int, hidden: int = 128):
        super().__init__()
        self.net = (nn.Sequential(nn.Linear(state_dim, hidden), nn.Tanh(), nn.Linear(hidden, 1)) if hidden
                    else nn.Linear(state_dim, 1))
        last = self.net[-1] if hidden else self.net
        nn.init.zeros_(last.weight)  # V ≡ 0 before training: no advantage is invented at the start
        nn.init.zeros_(last.bias)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """states (B, T, H) -> V (B, T); the input is detached here."""
        return self.net(states.detach()).squeeze(-1).float()  # fp32 values whatever the compute precision
