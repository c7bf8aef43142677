"""Value baseline b(s_t) of Ranzato et al. (2015), as used by Tuan et al. (Supplement C).

A linear regressor on the *detached* decoder state predicting the return; trained by MSE so that its
gradient never reaches the generator. Advantage A_t = R_t − b(s_t) (Tuan et al., Eq. 1).
"""

from __future__ import annotations

import torch
from torch import nn


class ValueBaseline(nn.Module):
    def __init__(self, hidden_dim: int):
        super().__init__()
        self.linear = nn.Linear(hidden_dim, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """states (B, T, H) decoder states -> (B, T) predicted returns; the input is detached here."""
        return self.linear(states.detach()).squeeze(-1).float()  # fp32 values whatever the compute precision
