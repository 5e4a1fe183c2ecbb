"""Advantage estimators for multi-turn episodes, as pure tensor functions.

Batch conventions (produced by the rollout engine):
    action_mask  (B, T)  1 on tokens the policy generated, 0 on prompt /
                         observation / padding tokens
    turn_ids     (B, T)  long, turn index n of each generated token, -1 elsewhere
    turn_rewards (B, N)  one reward per turn; turn_mask (B, N) marks real turns
    group_ids    (B,)    long, episodes of the same game share an id
    values       (B, T)  critic values V(x_<=t) (PPO only)
    kl           (B, T)  per-token KL to the reference (only when kl_in_reward)

Credit at two granularities:
  * token level (PPO, REINFORCE++): a turn's reward sits on its LAST action
    token; the recursions run over action tokens only, skipping environment
    tokens, so gamma and lambda are applied once per action token.
  * episode / turn level (GRPO, RLOO, and REINFORCE++ with
    rl.turn_level_returns): returns are computed per turn,
    G_n = sum_{k >= n} gamma^{k - n} r_k, with gamma applied once per turn,
    and the advantage of a turn is broadcast to all of its action tokens.

Group baselines must see whole groups: call `compute_advantages` on the full
step batch (every rollout of every game), never on a minibatch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from agentrecipe.algos.losses import masked_mean, masked_var
from agentrecipe.config import RLConfig


# --------------------------------------------------------- rewards on tokens
def token_rewards(turn_rewards: Tensor, turn_mask: Tensor, action_mask: Tensor, turn_ids: Tensor) -> Tensor:
    """Place each turn's reward on the last action token of that turn: (B, N) -> (B, T).

        r_t = sum_n 1[t = last action token of turn n] r_n

    All other tokens get 0. A real turn (turn_mask = 1) without any action
    token is an error (its reward would be lost).
    """
    B, T = action_mask.shape
    turn_ids = turn_ids.long()
    valid = action_mask.bool() & (turn_ids >= 0)  # (B, T)
    pos = torch.arange(T, device=action_mask.device).expand(B, T)
    last = torch.full(turn_rewards.shape, -1, dtype=torch.long, device=action_mask.device)  # (B, N)
    last.scatter_reduce_(1, turn_ids.clamp(min=0), torch.where(valid, pos, -1), reduce="amax")
    real = turn_mask.bool()
    if bool((real & (last < 0)).any()):
        b, n = torch.nonzero(real & (last < 0))[0].tolist()
        raise ValueError(f"turn {n} of sequence {b} is marked real but has no action token")
    placed = torch.where(real, turn_rewards, torch.zeros_like(turn_rewards))
    out = torch.zeros((B, T), dtype=turn_rewards.dtype, device=turn_rewards.device)
    return out.scatter_add_(1, last.clamp(min=0), placed)  # placed is 0 where last was clamped


def add_kl_penalty(token_rewards: Tensor, kl: Tensor, action_mask: Tensor, kl_coef: float) -> Tensor:
    """KL in the reward (Ziegler et al. 2019; Ouyang et al. 2022): r'_t = r_t - beta kl_t on action tokens."""
    mask = action_mask.bool()
    return token_rewards - kl_coef * torch.where(mask, kl, torch.zeros_like(kl))


def turn_sums(token_values: Tensor, turn_ids: Tensor, action_mask: Tensor, n_turns: int) -> Tensor:
    """Sum a per-token quantity over each turn's action tokens: (B, T) -> (B, N).

        s_n = sum_t 1[turn_ids_t = n, m_t = 1] x_t
    """
    turn_ids = turn_ids.long()
    valid = action_mask.bool() & (turn_ids >= 0)
    src = torch.where(valid, token_values, torch.zeros_like(token_values))
    out = torch.zeros((token_values.shape[0], n_turns), dtype=token_values.dtype, device=token_values.device)
    return out.scatter_add_(1, turn_ids.clamp(min=0), src)


def broadcast_to_tokens(per_turn: Tensor, turn_ids: Tensor, action_mask: Tensor) -> Tensor:
    """Give every action token its turn's value: (B, N) -> (B, T); 0 off the action mask.

        x_t = v_{turn_ids_t} if m_t = 1 else 0
    """
    turn_ids = turn_ids.long()
    valid = action_mask.bool() & (turn_ids >= 0)
    gathered = per_turn.gather(1, turn_ids.clamp(min=0))
    return torch.where(valid, gathered, torch.zeros_like(gathered))


# ------------------------------------------------------------ token level
@torch.no_grad()
def masked_gae(
    token_rewards: Tensor, values: Tensor, action_mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over action tokens only (Schulman et al. 2016).

    Let t' be the next ACTION token after t (prompt / observation tokens are
    skipped: the environment's tokens are not decisions and carry no value
    target), with V_{t'} = 0 after the last one (episode end is terminal):

        delta_t = r_t + gamma V_{t'} - V_t
        A_t     = delta_t + gamma lam A_{t'}
        R_t     = A_t + V_t                    (value target)

    So the last action token of turn n bootstraps from the value at the first
    action token of turn n + 1. A and R are 0 off the action mask; rewards or
    values there are ignored. Inputs are treated as constants (no gradient).
    Returns (advantages, returns), both (B, T).
    """
    mask = action_mask.bool()
    values = values.to(token_rewards.dtype)
    B, T = token_rewards.shape
    advantages = torch.zeros_like(token_rewards)
    next_value = torch.zeros(B, dtype=token_rewards.dtype, device=token_rewards.device)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        gae = delta + gamma * lam * lastgaelam
        advantages[:, t] = torch.where(m, gae, 0.0)
        lastgaelam = torch.where(m, gae, lastgaelam)  # non-action tokens carry the state through
        next_value = torch.where(m, values[:, t], next_value)
    returns = torch.where(mask, advantages + values, 0.0)
    return advantages, returns


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-6) -> Tensor:
    """(x - mean_m(x)) / (std_m(x) + eps) over masked entries (population std); 0 off the mask."""
    mask = mask.bool()
    whitened = (x - masked_mean(x, mask)) / (masked_var(x, mask).sqrt() + eps)
    return torch.where(mask, whitened, torch.zeros_like(whitened))


@torch.no_grad()
def reinforce_pp_advantages(token_rewards: Tensor, action_mask: Tensor, gamma: float, eps: float = 1e-6) -> Tensor:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): returns-to-go, whitened over the batch.

        G_t = r_t + gamma G_{t'}     (t' = next action token; = masked_gae with V = 0, lam = 1)
        A_t = (G_t - mean(G)) / (std(G) + eps)

    mean and std run over every action token of the whole batch (global
    normalisation, not per group). `token_rewards` should already include the
    KL penalty (`add_kl_penalty`), as in the paper.
    """
    returns_to_go, _ = masked_gae(token_rewards, torch.zeros_like(token_rewards), action_mask, gamma, 1.0)
    return masked_whiten(returns_to_go, action_mask, eps)


# ------------------------------------------------------- episode / turn level
def turn_level_returns(turn_rewards: Tensor, turn_mask: Tensor, gamma: float) -> Tensor:
    """Per-turn returns-to-go: (B, N) -> (B, N), 0 on padded turns.

        G_n = r_n + gamma G_{n+1},   G_N = 0       (gamma once per turn)
    """
    real = turn_mask.bool()
    rewards = torch.where(real, turn_rewards, torch.zeros_like(turn_rewards))
    returns = torch.zeros_like(rewards)
    next_return = torch.zeros_like(rewards[:, 0])
    for n in reversed(range(rewards.shape[1])):
        next_return = rewards[:, n] + gamma * next_return
        returns[:, n] = next_return
    return torch.where(real, returns, torch.zeros_like(returns))


def _group_cells(returns: Tensor, group_ids: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, int]:
    """Flatten (B,) or (B, N) returns into cells: one cell per (group, column). -> x, cell, m, n_cells."""
    x = returns if returns.dim() == 2 else returns.unsqueeze(1)  # (B, N)
    m = torch.ones_like(x, dtype=torch.bool) if mask is None else mask.bool().reshape(x.shape)
    _, group = torch.unique(group_ids, return_inverse=True)  # (B,) in 0 .. G-1
    n_cols = x.shape[1]
    cell = group.unsqueeze(1) * n_cols + torch.arange(n_cols, device=x.device)  # (B, N)
    n_cells = int(group.max().item() + 1) * n_cols if group.numel() else 0
    return x.reshape(-1), cell.reshape(-1), m.reshape(-1), n_cells


def _cell_sum(values: Tensor, cell: Tensor, n_cells: int) -> Tensor:
    return torch.zeros(n_cells, dtype=values.dtype, device=values.device).index_add_(0, cell, values)


@torch.no_grad()
def grpo_advantages(returns: Tensor, group_ids: Tensor, eps: float = 1e-6, mask: Tensor | None = None) -> Tensor:
    """Group-normalised advantage of GRPO (Shao et al. 2024, "DeepSeekMath").

        A_i = (R_i - mean_{j in g(i)} R_j) / (std_{j in g(i)} R_j + eps)

    std is the sample std (Bessel-corrected, as TRL's GRPOTrainer); a group of
    one gets A = 0.

    returns (B,): one return per episode. returns (B, N) with `mask` (B, N):
    per-turn returns; the statistics then run over the episodes of the group
    that have a turn at the same index n (turn-level baseline), so turn n of
    episode i is compared with turn n of its siblings, not with the episode
    sum. Output has the shape of `returns`, 0 where mask = 0.
    """
    x, cell, m, n_cells = _group_cells(returns, group_ids, mask)
    w = m.to(x.dtype)
    count = _cell_sum(w, cell, n_cells)
    mean = _cell_sum(x * w, cell, n_cells) / count.clamp(min=1)
    dev = torch.where(m, x - mean[cell], torch.zeros_like(x))
    var = _cell_sum(dev**2, cell, n_cells) / (count - 1).clamp(min=1)
    adv = dev / (var.sqrt()[cell] + eps)
    return adv.reshape(returns.shape)


@torch.no_grad()
def rloo_advantages(returns: Tensor, group_ids: Tensor, mask: Tensor | None = None) -> Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics").

        A_i = R_i - 1/(k - 1) sum_{j in g(i), j != i} R_j  =  k/(k - 1) (R_i - mean_g R)

    with k the group size; a group of one gets A = 0 (no baseline exists).
    (B, N) returns with `mask` give a per-turn-index baseline, as in
    `grpo_advantages`. Output has the shape of `returns`, 0 where mask = 0.
    """
    x, cell, m, n_cells = _group_cells(returns, group_ids, mask)
    w = m.to(x.dtype)
    count = _cell_sum(w, cell, n_cells)[cell]
    total = _cell_sum(x * w, cell, n_cells)[cell]
    baseline = (total - x) / (count - 1).clamp(min=1)
    adv = torch.where(m & (count > 1), x - baseline, torch.zeros_like(x))
    return adv.reshape(returns.shape)


# ----------------------------------------------------------------- registry
AdvantageOut = tuple[Tensor, Tensor | None]


def _kl_for_reward(kl: Tensor | None, cfg: RLConfig) -> Tensor | None:
    """The per-token KL to put into the reward, or None when the KL goes in the loss."""
    if not cfg.kl_in_reward or cfg.kl_coef == 0:
        return None
    if kl is None:
        raise ValueError("rl.kl_in_reward with rl.kl_coef > 0 needs the per-token kl tensor")
    return kl


def _shaped_token_rewards(turn_rewards, turn_mask, action_mask, turn_ids, kl, cfg) -> Tensor:
    """(B, T) token rewards, minus beta * kl_t on action tokens when the KL is in the reward."""
    rewards = token_rewards(turn_rewards, turn_mask, action_mask, turn_ids)
    kl_r = _kl_for_reward(kl, cfg)
    return rewards if kl_r is None else add_kl_penalty(rewards, kl_r, action_mask, cfg.kl_coef)


def _shaped_turn_rewards(turn_rewards, turn_mask, action_mask, turn_ids, kl, cfg) -> Tensor:
    """(B, N) turn rewards, minus beta * sum_{t in turn n} kl_t when the KL is in the reward."""
    kl_r = _kl_for_reward(kl, cfg)
    if kl_r is None:
        return turn_rewards
    return turn_rewards - cfg.kl_coef * turn_sums(kl_r, turn_ids, action_mask, turn_rewards.shape[1])


def _ppo(*, turn_rewards, turn_mask, action_mask, turn_ids, group_ids, values, kl, cfg) -> AdvantageOut:
    if values is None:
        raise ValueError("ppo needs critic values (B, T)")
    if cfg.turn_level_returns:
        raise ValueError(
            "rl.turn_level_returns applies to grpo, rloo and reinforce_pp; ppo's critic assigns credit per token"
        )
    rewards = _shaped_token_rewards(turn_rewards, turn_mask, action_mask, turn_ids, kl, cfg)
    return masked_gae(rewards, values, action_mask, cfg.gamma, cfg.lam)


def _group_baseline(adv_fn: Callable[..., Tensor]):
    """Wrap grpo/rloo: trajectory return R = sum_n r_n, or per-turn G_n with rl.turn_level_returns."""

    def fn(*, turn_rewards, turn_mask, action_mask, turn_ids, group_ids, values, kl, cfg) -> AdvantageOut:
        rewards = _shaped_turn_rewards(turn_rewards, turn_mask, action_mask, turn_ids, kl, cfg)
        if cfg.turn_level_returns:
            per_turn = adv_fn(turn_level_returns(rewards, turn_mask, cfg.gamma), group_ids, mask=turn_mask)
            return broadcast_to_tokens(per_turn, turn_ids, action_mask), None
        episode_return = torch.where(turn_mask.bool(), rewards, torch.zeros_like(rewards)).sum(1)  # (B,)
        adv = adv_fn(episode_return, group_ids)  # (B,)
        mask = action_mask.bool()
        return torch.where(mask, adv.unsqueeze(1).expand(mask.shape), 0.0).to(rewards.dtype), None

    fn.__doc__ = adv_fn.__doc__
    return fn


def _reinforce_pp(*, turn_rewards, turn_mask, action_mask, turn_ids, group_ids, values, kl, cfg) -> AdvantageOut:
    if cfg.turn_level_returns:
        rewards = _shaped_turn_rewards(turn_rewards, turn_mask, action_mask, turn_ids, kl, cfg)
        per_token = broadcast_to_tokens(turn_level_returns(rewards, turn_mask, cfg.gamma), turn_ids, action_mask)
        return masked_whiten(per_token, action_mask), None
    rewards = _shaped_token_rewards(turn_rewards, turn_mask, action_mask, turn_ids, kl, cfg)
    return reinforce_pp_advantages(rewards, action_mask, cfg.gamma), None


ADVANTAGE_FNS: dict[str, Callable[..., AdvantageOut]] = {
    "ppo": _ppo,
    "grpo": _group_baseline(grpo_advantages),
    "rloo": _group_baseline(rloo_advantages),
    "reinforce_pp": _reinforce_pp,
}


@torch.no_grad()
def compute_advantages(
    algo: str,
    *,
    turn_rewards: Tensor,
    turn_mask: Tensor,
    action_mask: Tensor,
    turn_ids: Tensor,
    group_ids: Tensor,
    cfg: RLConfig,
    values: Tensor | None = None,
    kl: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The one entry point of the trainer: (advantages (B, T), returns (B, T) or None).

        ppo:          masked GAE on token rewards (+ KL if kl_in_reward); returns = value targets
        grpo, rloo:   group baseline on R = sum_n r_n (or on per-turn G_n with
                      turn_level_returns), broadcast to the action tokens
        reinforce_pp: token returns-to-go (or per-turn G_n), globally whitened

    With rl.kl_in_reward (and kl_coef > 0) the per-token `kl` is subtracted
    from the reward (summed per turn for turn/episode-level methods);
    otherwise the trainer adds kl_coef * KL to the loss. Advantages are 0 off
    the action mask and carry no gradient. Call on the whole step batch so
    every group is complete.
    """
    if algo not in ADVANTAGE_FNS:
        raise ValueError(f"unknown rl.algo {algo!r}; known: {', '.join(ADVANTAGE_FNS)}")
    return ADVANTAGE_FNS[algo](
        turn_rewards=turn_rewards.float(),
        turn_mask=turn_mask,
        action_mask=action_mask,
        turn_ids=turn_ids,
        group_ids=group_ids,
        values=values,
        kl=kl,
        cfg=cfg,
    )
