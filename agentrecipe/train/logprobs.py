"""Per-token log-probs and entropy of a causal LM over padded sequences.

logprobs[b, t] = log p(input_ids[b, t] | input_ids[b, :t]); position 0 gets 0.
When constrained decoding produced the tokens, `allowed_mask` (B, T, V) bool
restricts the softmax at action positions to the ids that were allowed, so
training recomputes exactly the distribution that was sampled from.
"""

from __future__ import annotations

import torch


def pad_batch(seqs: list[list[int]], pad: int | float, dtype=torch.long) -> torch.Tensor:
    T = max(len(s) for s in seqs)
    out = torch.full((len(seqs), T), pad, dtype=dtype)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=dtype)
    return out


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    allowed_mask: torch.Tensor | None = None,
    with_entropy: bool = False,
):
    """(logprobs (B, T), entropy (B, T) or None) of each token given its prefix."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1, :].float()  # (B, T-1, V)
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    if allowed_mask is not None:
        logits = logits.masked_fill(~allowed_mask[:, 1:, :], float("-inf"))
    logp_all = torch.log_softmax(logits, dim=-1)
    target = input_ids[:, 1:]
    logp = torch.gather(logp_all, -1, target.unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    logp = torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1)  # (B, T)
    entropy = None
    if with_entropy:
        p = logp_all.exp()
        ent = -(p * torch.where(p > 0, logp_all, torch.zeros_like(logp_all))).sum(-1)
        entropy = torch.cat([torch.zeros_like(ent[:, :1]), ent], dim=1)
    return logp, entropy
