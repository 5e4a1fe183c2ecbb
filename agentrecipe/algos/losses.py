"""Policy, value, KL and entropy terms over masked token sequences.

Shapes: B sequences padded to T tokens, vocabulary V. `action_mask` (B, T) is
1 only on tokens the policy generated; every term here counts only those
tokens. Masked-out positions are removed with `torch.where`, never by
multiplying, and `policy_loss` / `value_loss` remove them from their INPUTS
(a nan upstream of a masked output would still leak through the chain rule
as 0 * nan), so garbage (inf / nan) at prompt, observation or padding
positions can neither reach the loss nor the gradient: their gradient is
exactly zero. Per-token helpers without a mask (`kl_penalty`,
`entropy_from_logits`) expect finite inputs everywhere.

Log-probs are aligned to tokens: logprobs[b, t] = log p(x_t | x_<t), so a
model's logits must be shifted by the caller (logits[:, :-1] scores ids[:, 1:]).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
LOSS_AGGS: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


# ------------------------------------------------------------------ reductions
def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(x * m) / max(sum(m), 1), over all entries or along `dim`.

    An empty mask gives 0, not nan.
    """
    mask = mask.bool()
    total = torch.where(mask, x, torch.zeros_like(x))
    if dim is None:
        return total.sum() / mask.sum().clamp(min=1)
    return total.sum(dim) / mask.sum(dim).clamp(min=1)


def masked_var(x: Tensor, mask: Tensor) -> Tensor:
    """Population variance over masked entries: mean_m((x - mean_m(x))^2)."""
    mean = masked_mean(x, mask)
    return masked_mean((x - mean) ** 2, mask)


def aggregate(loss_mat: Tensor, mask: Tensor, loss_agg: LossAgg = "token-mean", share: Tensor | None = None) -> Tensor:
    """Reduce a per-token loss (B, T) to a scalar over masked tokens.

        token-mean:          sum_{b,t} m l   / sum_{b,t} m
        seq-mean-token-mean: sum_{b,t} m u l / sum_{b,t} m u
        seq-mean-token-sum:  sum_{b,t} m l   / sum_{b,t} m u

    u is each token's share of its EPISODE: 1 / (action tokens of that episode), so an episode's
    tokens together weigh 1 and sum m u counts the episodes (a fraction of one when a minibatch
    holds only some of an episode's turn sequences). Without `share` (B, T) every row is taken as
    one whole episode (u = 1 / its masked tokens): seq-mean-token-mean is then mean_b of the row
    means, seq-mean-token-sum mean_b of the row sums, over rows with a masked-in token.

    token-mean weighs every token alike (long episodes weigh more, as in DAPO, Yu et al. 2025);
    seq-mean-token-mean weighs every episode alike (the original GRPO, Shao et al. 2024), also
    when a history window splits an episode into one sequence per turn; seq-mean-token-sum drops
    the length normalisation (Dr. GRPO, Liu et al. 2025, up to a constant).
    """
    mask = mask.bool()
    if loss_agg == "token-mean":
        return masked_mean(loss_mat, mask)
    if loss_agg not in LOSS_AGGS:
        raise ValueError(f"unknown loss_agg {loss_agg!r}; use one of {LOSS_AGGS}")
    if share is None:
        share = (1.0 / mask.sum(-1, keepdim=True).clamp(min=1)).expand(mask.shape)
    zeros = torch.zeros_like(loss_mat)
    u = torch.where(mask, share.to(loss_mat.dtype), zeros)
    episodes = u.sum().clamp(min=1e-12) if bool(mask.any()) else torch.ones((), dtype=loss_mat.dtype)
    if loss_agg == "seq-mean-token-mean":
        return torch.where(mask, u * loss_mat, zeros).sum() / episodes
    return torch.where(mask, loss_mat, zeros).sum() / episodes


def aggregate_weight(mask: Tensor, loss_agg: LossAgg = "token-mean", share: Tensor | None = None) -> float:
    """The denominator `aggregate` divides by: masked tokens (token-mean) or episodes (sum m u).
    Across ranks, the mean over all of them weighs each rank's `aggregate` by this."""
    mask = mask.bool()
    if loss_agg == "token-mean" or not bool(mask.any()):
        return float(mask.sum())
    if share is None:
        share = (1.0 / mask.sum(-1, keepdim=True).clamp(min=1)).expand(mask.shape)
    return float(torch.where(mask, share.float(), torch.zeros((), dtype=torch.float32)).sum())


# -------------------------------------------------------------- token helpers
def logprobs_from_logits(logits: Tensor, token_ids: Tensor) -> Tensor:
    """log softmax(logits)[token]: (B, T, V), (B, T) -> (B, T).

    logits[:, t] must already be the distribution that token_ids[:, t] was drawn from.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    return logp.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(z) per position: (..., V) -> (...).

        H = -sum_v p_v log p_v = logsumexp(z) - sum_v p_v z_v
    """
    logits = logits.float()
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: Literal["k1", "k3"] = "k3") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi.

    With log r = log pi_ref(x) - log pi(x) (Schulman 2020, "Approximating KL
    Divergence", http://joschu.net/blog/kl-approx.html):

        k1 = -log r = log pi(x) - log pi_ref(x)      unbiased, can be < 0
        k3 = (r - 1) - log r                         unbiased, always >= 0

    log r is clamped to [-20, 20] in k3 so exp cannot overflow.
    """
    log_ratio = logprobs - ref_logprobs  # log pi - log pi_ref = -log r
    if estimator == "k1":
        return log_ratio
    if estimator == "k3":
        log_r = (-log_ratio).clamp(-20.0, 20.0)
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"unknown KL estimator {estimator!r}; use 'k1' or 'k3'")


# ---------------------------------------------------------------------- losses
def policy_loss(
    new_logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    clip_eps: float,
    loss_agg: LossAgg = "token-mean",
    share: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017), per token, aggregated.

        rho_t  = exp(clamp(log pi_new(x_t) - log pi_old(x_t), -20, 20))
        l_t    = max(-A_t rho_t, -A_t clip(rho_t, 1 - eps, 1 + eps))
        loss   = aggregate(l, mask, loss_agg, share)

    The log-ratio is clamped to [-20, 20] before exp (as veRL does): a large log-prob change
    would overflow exp to inf, and inf times the clip branch's zero gradient is nan.
    Used unchanged by PPO, GRPO, RLOO and REINFORCE++; only A differs.

    Returns (loss, stats) with detached scalars:
        clipfrac:  share of tokens whose gradient the clip removes
                   (rho > 1 + eps with A > 0, or rho < 1 - eps with A < 0)
        approx_kl: mean_t[(rho_t - 1) - log rho_t], the k3 estimate of
                   KL(pi_old || pi_new) (as logged by CleanRL)
    """
    mask = action_mask.bool()
    zeros = torch.zeros_like(new_logprobs)
    log_ratio = torch.where(mask, new_logprobs - old_logprobs, zeros).clamp(-20.0, 20.0)  # 0 off-mask
    ratio = torch.exp(log_ratio)
    adv = torch.where(mask, advantages, zeros)
    pg_losses = -adv * ratio
    pg_losses_clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    pg_loss_mat = torch.maximum(pg_losses, pg_losses_clipped)  # (B, T)
    pg_loss = aggregate(pg_loss_mat, mask, loss_agg, share)
    with torch.no_grad():
        clipped = pg_losses_clipped > pg_losses
        stats = {
            "clipfrac": masked_mean(clipped.float(), mask),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask),
        }
    return pg_loss, stats


def value_loss(
    new_values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    action_mask: Tensor,
    value_clip: float,
    loss_agg: LossAgg = "token-mean",
    share: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss of PPO (as in openai/baselines and CleanRL).

        V^clip_t = V_old,t + clip(V_t - V_old,t, -c, c)
        l_t      = 1/2 max((V_t - R_t)^2, (V^clip_t - R_t)^2)
        loss     = aggregate(l, mask, loss_agg, share)

    value_clip c <= 0 turns clipping off: l_t = 1/2 (V_t - R_t)^2.
    Returns (loss, {"vf_clipfrac": share of tokens where the clipped term wins}).
    """
    mask = action_mask.bool()
    zeros = torch.zeros_like(new_values)
    # Sanitise inputs (not just outputs): 0 * nan in the chain rule would still leak nan gradients.
    new_values = torch.where(mask, new_values, zeros)
    old_values = torch.where(mask, old_values, zeros)
    returns = torch.where(mask, returns, zeros)
    v_loss_unclipped = (new_values - returns) ** 2
    if value_clip > 0:
        v_clipped = old_values + torch.clamp(new_values - old_values, -value_clip, value_clip)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss_mat = 0.5 * torch.maximum(v_loss_unclipped, v_loss_clipped)
        clipped = v_loss_clipped > v_loss_unclipped
    else:
        v_loss_mat = 0.5 * v_loss_unclipped
        clipped = torch.zeros_like(mask)
    v_loss = aggregate(v_loss_mat, mask, loss_agg, share)
    with torch.no_grad():
        stats = {"vf_clipfrac": masked_mean(clipped.float(), mask)}
    return v_loss, stats


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """1 - Var[R - V] / Var[R] over masked tokens (nan when Var[R] = 0), as logged by CleanRL."""
    with torch.no_grad():
        var_r = masked_var(returns, mask)
        if var_r == 0:
            return torch.tensor(float("nan"))
        return 1.0 - masked_var(returns - values, mask) / var_r
