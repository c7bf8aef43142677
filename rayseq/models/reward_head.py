"""A reward model's scalar head on a policy (``algo.name=reward_model``): r(x, y) = wᵀ h(x, y), h the policy's state
after reading the prompt x and the whole reply y — its state at y's <eos> position (the state that predicts <eos>;
for an HF policy the last hidden layer at y's last token, what ``AutoModelForSequenceClassification`` reads). No
bias, as a sequence-classification head of transformers has none (Bradley–Terry reads differences).

Math layer: torch only.
"""

from __future__ import annotations

import torch
from torch import nn


def reward_head(state_dim: int) -> nn.Linear:
    """w: a bias-free (H → 1) linear map, initialised as transformers initialises a classifier head (std 1/√(H+1))."""
    head = nn.Linear(state_dim, 1, bias=False)
    nn.init.normal_(head.weight, std=1.0 / (state_dim + 1) ** 0.5)
    return head


def reply_states(policy, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(B, T, H) the policy's states at each reply position (the one that predicts token t has read y_<t): its
    ``reply_states`` when it has one (an HF policy: the last hidden layer, without the LM head), else its
    ``logprobs``' states."""
    own = getattr(policy, "reply_states", None)
    if own is not None:
        return own(src, src_len, tokens)
    return policy.logprobs(src, src_len, tokens).states


def sequence_rewards(policy, head: nn.Module, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor,
                     ends: torch.Tensor) -> torch.Tensor:
    """r (B,) of replies ``tokens`` (B, T) to prompts ``src`` (B, S) (lengths ``src_len``), each ending in <eos> at
    column ``ends`` (B,) (its length without <eos>)."""
    states = reply_states(policy, src, src_len, tokens)
    return head(states[torch.arange(len(ends), device=ends.device), ends].float()).squeeze(-1)
