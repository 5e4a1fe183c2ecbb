"""The PPO critic: the policy's transformer body with a scalar value head.

values[b, t] estimates the return from the state *before* token t is emitted
(computed from the hidden state at t - 1), aligned like `token_logprobs`. With `at`
(packed rows, see `logprobs.pack`) the head runs only on the gathered hidden states.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel


class ValueModel(nn.Module):
    def __init__(self, body: nn.Module, hidden_size: int):
        super().__init__()
        self.body = body
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: torch.dtype = torch.float32) -> "ValueModel":
        body = AutoModel.from_pretrained(folder, dtype=dtype)
        return cls(body, body.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None,
                at: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) values before each token; or, with `at` (N, 2) (row, node) pairs, the (N,) values
        after those nodes (the caller passes the node before the token whose value it wants)."""
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                           use_cache=False).last_hidden_state  # (B, T, H)
        if at is not None:
            return self.head(hidden[at[:, 0], at[:, 1]]).squeeze(-1).float()  # (N,)
        v = self.head(hidden).squeeze(-1).float()  # (B, T): value after token t
        return torch.cat([torch.zeros_like(v[:, :1]), v[:, :-1]], dim=1)  # (B, T): value before token t
