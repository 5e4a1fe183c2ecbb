"""Advantage estimators and policy / value losses: pure tensor functions.

`compute_advantages(cfg.algo, ...)` is the single entry point the trainer uses
to turn rewards into advantages; `policy_loss`, `value_loss`, `kl_penalty` and
`entropy_from_logits` are the loss terms it combines.
"""

from agentrecipe.algos.advantages import (
    ADVANTAGE_FNS,
    add_kl_penalty,
    broadcast_to_tokens,
    compute_advantages,
    grpo_advantages,
    masked_gae,
    masked_whiten,
    reinforce_pp_advantages,
    rloo_advantages,
    token_rewards,
    turn_level_returns,
    turn_sums,
)
from agentrecipe.algos.losses import (
    LOSS_AGGS,
    aggregate,
    entropy_from_logits,
    explained_variance,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    policy_loss,
    value_loss,
)

__all__ = [
    "ADVANTAGE_FNS",
    "LOSS_AGGS",
    "add_kl_penalty",
    "aggregate",
    "broadcast_to_tokens",
    "compute_advantages",
    "entropy_from_logits",
    "explained_variance",
    "grpo_advantages",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_gae",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "token_rewards",
    "turn_level_returns",
    "turn_sums",
    "value_loss",
]
