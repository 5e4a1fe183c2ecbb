"""Advantage estimators and policy / value losses: pure tensor functions.

`compute_advantages(cfg.algo, ...)` is the single entry point the trainer uses
to turn rewards into advantages; `policy_loss`, `value_loss`, `kl_penalty` and
`entropy_from_logits` are the loss terms it combines.
"""

from agentrecipe.algos.advantages import (
    add_kl_penalty,
    at_turn_starts,
    broadcast_to_tokens,
    compute_advantages,
    gigpo_advantages,
    grpo_advantages,
    join_whitening,
    masked_gae,
    masked_whiten,
    reinforce_pp_advantages,
    returns_to_go,
    rloo_advantages,
    step_ends,
    step_group_stats,
    token_rewards,
    turn_level_returns,
    turn_sums,
    zero_variance_fraction,
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
    "LOSS_AGGS",
    "add_kl_penalty",
    "aggregate",
    "at_turn_starts",
    "broadcast_to_tokens",
    "compute_advantages",
    "entropy_from_logits",
    "explained_variance",
    "gigpo_advantages",
    "grpo_advantages",
    "join_whitening",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_gae",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "policy_loss",
    "reinforce_pp_advantages",
    "returns_to_go",
    "rloo_advantages",
    "step_ends",
    "step_group_stats",
    "token_rewards",
    "turn_level_returns",
    "turn_sums",
    "value_loss",
    "zero_variance_fraction",
]
