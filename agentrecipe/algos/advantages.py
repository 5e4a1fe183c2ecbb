"""Advantage estimators for multi-turn episodes, as pure tensor functions.

Batch conventions. The trainer passes each episode's ACTION-TOKEN LAYOUT
(`RLBatch.ep_*`): row b is episode b, column t its t-th generated token in
order, i.e. the token sequence with every prompt and observation token
skipped (so B = episodes, T = the most action tokens of any episode):
    action_mask  (B, T)  1 on the episode's action tokens, 0 on padding (the
                         functions also accept full sequences with 0 on
                         prompt / observation tokens: recursions skip them)
    turn_ids     (B, T)  long, turn index n of each action token, -1 on padding
    turn_rewards (B, N)  one reward per turn; turn_mask (B, N) marks real turns
    group_ids    (B,)    long, episodes of the same game share an id
    values       (B, T)  critic values V(x_<=t) (PPO only)
    kl           (B, T)  per-token KL to the reference (only when kl_in_reward)
    anchor_ids   (B, N)  long, id of the state each turn started from (GiGPO only)

Discounting (`rl.discount`, one unit for every estimator):
  * token: gamma (and PPO's lambda) apply once per ACTION token; the
    recursions skip environment tokens.
  * turn:  gamma and lambda apply once per turn; inside a turn they are 1.
A turn's reward sits on its LAST action token. A per-turn return G_n (turn-
level baselines, GiGPO's step returns) is the token return-to-go at the FIRST
action token of turn n, so under `turn` it is G_n = sum_{k >= n} gamma^{k-n} r_k.
With gamma = 1 (the default) the unit changes nothing but PPO's lambda.

Credit at two granularities:
  * token level (PPO, REINFORCE++): per-token advantages.
  * episode / turn level (GRPO, RLOO, GiGPO, and REINFORCE++ with
    rl.turn_level_returns): one advantage per episode or per turn, broadcast
    to all of its action tokens.

KL in the reward (rl.kl_in_reward): PPO's critic learns the KL-shaped return.
The critic-free estimators normalise the TASK return first and subtract
beta times the KL return-to-go afterwards, so beta keeps setting the KL
term's scale (whitening KL noise on a batch without task signal would
otherwise turn it into unit-size advantages).

Group baselines must see whole groups: call `compute_advantages` on the full
step batch (every rollout of every game), never on a minibatch. Under a
launcher each rank plays whole groups, but the batch whitening (REINFORCE++,
PPO's rl.whiten_advantages) runs over every rank's batch: the trainer passes
`reduce` (statistics summed over the ranks), and a rank without a batch joins
with `join_whitening`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from agentrecipe.algos.losses import masked_mean, masked_var
from agentrecipe.config import RLConfig

Discount = Literal["token", "turn"]


# --------------------------------------------------------- rewards on tokens
def _turn_positions(action_mask: Tensor, turn_ids: Tensor, n_turns: int, reduce: str) -> Tensor:
    """(B, N) position of the first (reduce='amin') or last ('amax') action token of each turn, -1 if none."""
    B, T = action_mask.shape
    turn_ids = turn_ids.long()
    valid = action_mask.bool() & (turn_ids >= 0)  # (B, T)
    pos = torch.arange(T, device=action_mask.device).expand(B, T)
    fill = T if reduce == "amin" else -1
    out = torch.full((B, n_turns), fill, dtype=torch.long, device=action_mask.device)
    out.scatter_reduce_(1, turn_ids.clamp(min=0), torch.where(valid, pos, fill), reduce=reduce)
    return torch.where(out == T, -1, out)


def token_rewards(turn_rewards: Tensor, turn_mask: Tensor, action_mask: Tensor, turn_ids: Tensor) -> Tensor:
    """Place each turn's reward on the last action token of that turn: (B, N) -> (B, T).

        r_t = sum_n 1[t = last action token of turn n] r_n

    All other tokens get 0. A real turn (turn_mask = 1) without any action
    token is an error (its reward would be lost).
    """
    B, T = action_mask.shape
    last = _turn_positions(action_mask, turn_ids, turn_rewards.shape[1], "amax")  # (B, N)
    real = turn_mask.bool()
    if bool((real & (last < 0)).any()):
        b, n = torch.nonzero(real & (last < 0))[0].tolist()
        raise ValueError(f"turn {n} of sequence {b} is marked real but has no action token")
    placed = torch.where(real, turn_rewards, torch.zeros_like(turn_rewards))
    out = torch.zeros((B, T), dtype=turn_rewards.dtype, device=turn_rewards.device)
    return out.scatter_add_(1, last.clamp(min=0), placed)  # placed is 0 where last was clamped


def step_ends(action_mask: Tensor, turn_ids: Tensor, discount: Discount) -> Tensor:
    """(B, T) bool: the action tokens after which one discount step passes.

        token: every action token            turn: the last action token of each turn
    """
    mask = action_mask.bool()
    if discount == "token":
        return mask
    if discount != "turn":
        raise ValueError(f"rl.discount must be 'token' or 'turn', got {discount!r}")
    n_turns = int(turn_ids.max().item()) + 1 if turn_ids.numel() else 0
    last = _turn_positions(action_mask, turn_ids, max(n_turns, 1), "amax")  # (B, N)
    pos = torch.arange(mask.shape[1], device=mask.device).expand(mask.shape)
    return mask & (turn_ids >= 0) & (pos == last.gather(1, turn_ids.long().clamp(min=0)))


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


def at_turn_starts(per_token: Tensor, action_mask: Tensor, turn_ids: Tensor, n_turns: int) -> Tensor:
    """A per-token quantity read at the first action token of each turn: (B, T) -> (B, N); 0 for turns without one."""
    first = _turn_positions(action_mask, turn_ids, n_turns, "amin")
    return torch.where(first >= 0, per_token.gather(1, first.clamp(min=0)), torch.zeros_like(first, dtype=per_token.dtype))


# ------------------------------------------------------------ token level
@torch.no_grad()
def masked_gae(
    token_rewards: Tensor,
    values: Tensor,
    action_mask: Tensor,
    gamma: float,
    lam: float,
    step_end: Tensor | None = None,
    bootstrap_values: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over action tokens only (Schulman et al. 2016).

    Let t' be the next ACTION token after t (prompt / observation tokens are
    skipped: the environment's tokens are not decisions and carry no value
    target), and g_t = gamma, l_t = lam where `step_end` is set at t (default:
    every action token, i.e. rl.discount = token), else g_t = l_t = 1:

        delta_t = r_t + g_t V_{t'} - V_t
        A_t     = delta_t + g_t l_t A_{t'}
        R_t     = A_t + V_t                    (value target)

    After the last action token V_{t'} = `bootstrap_values` (B,), default 0.
    Pass 0 for an episode the game ended (terminal) and V(s_H), the critic's
    value of the state after the last action, for one cut by a turn or
    context limit that is not part of the task: such a time limit must
    bootstrap (Pardo et al. 2018, "Time Limits in Reinforcement Learning").
    The trainer passes it only with rl.bootstrap_truncated (see params).

    So the last action token of turn n bootstraps from the value at the first
    action token of turn n + 1. With step ends on turn ends only, every token
    t of turn n gets A_t = r_n + gamma V_{n+1} + gamma lam A_{n+1} - V_t
    (a turn-level lambda-return with a per-token baseline). A and R are 0
    off the action mask; rewards or values there are ignored. Inputs are
    treated as constants (no gradient). Returns (advantages, returns), both (B, T).
    """
    mask = action_mask.bool()
    values = values.to(token_rewards.dtype)
    ends = mask if step_end is None else step_end.bool()
    g = torch.where(ends, gamma, 1.0).to(token_rewards.dtype)  # (B, T)
    gl = torch.where(ends, gamma * lam, 1.0).to(token_rewards.dtype)
    B, T = token_rewards.shape
    advantages = torch.zeros_like(token_rewards)
    next_value = torch.zeros(B, dtype=token_rewards.dtype, device=token_rewards.device)
    if bootstrap_values is not None:
        next_value = bootstrap_values.to(next_value).reshape(B).clone()
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        m = mask[:, t]
        delta = token_rewards[:, t] + g[:, t] * next_value - values[:, t]
        gae = delta + gl[:, t] * lastgaelam
        advantages[:, t] = torch.where(m, gae, 0.0)
        lastgaelam = torch.where(m, gae, lastgaelam)  # non-action tokens carry the state through
        next_value = torch.where(m, values[:, t], next_value)
    returns = torch.where(mask, advantages + values, 0.0)
    return advantages, returns


def returns_to_go(token_rewards: Tensor, action_mask: Tensor, gamma: float, step_end: Tensor | None = None) -> Tensor:
    """G_t = r_t + g_t G_{t'} over action tokens (masked_gae with V = 0, lam = 1): (B, T), 0 off the mask."""
    return masked_gae(token_rewards, torch.zeros_like(token_rewards), action_mask, gamma, 1.0, step_end)[0]


Reduce = Callable[[Tensor, str], Tensor]
"""(float64 statistics, "sum" | "max") -> the same statistics over every process (agentrecipe.dist.all_reduce_tensor)."""


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-6, reduce: Reduce | None = None) -> Tensor:
    """(x - mean_m(x)) / (std_m(x) + eps) over masked entries (population std); 0 off the mask.
    Masked values that are all equal (`equal_returns`) give exact zeros, as in `_cell_flat`: a
    non-dyadic constant's float mean is not its value, and the division would blow the rounding up.
    reduce: mean, std and the equality check run over the masked entries of every process's `x`
    (float64, two passes); every process must call it then, one without entries too. None: this `x`."""
    mask = mask.bool()
    if reduce is not None:
        return _whiten_across(x, mask, eps, reduce)
    if not mask.any() or bool(equal_returns(x[mask].max(), x[mask].min())):
        return torch.zeros_like(x)
    whitened = (x - masked_mean(x, mask)) / (masked_var(x, mask).sqrt() + eps)
    return torch.where(mask, whitened, torch.zeros_like(whitened))


def _whiten_across(x: Tensor, mask: Tensor, eps: float, reduce: Reduce) -> Tensor:
    """`masked_whiten` with statistics over every process: the same collectives on every process
    (each takes the same branch, as each sees the same reduced numbers)."""
    v = x[mask].double()
    count, total = reduce(torch.stack([v.new_tensor(float(v.numel())), v.sum()]), "sum").tolist()
    none = v.new_tensor(-torch.inf)
    hi, neg_lo = reduce(torch.stack([v.max() if v.numel() else none, -v.min() if v.numel() else none]), "max")
    if not count or bool(equal_returns(hi, -neg_lo)):
        return torch.zeros_like(x)
    mean = total / count
    var = reduce(((v - mean) ** 2).sum().reshape(1), "sum")[0] / count
    whitened = ((x.double() - mean) / (var.sqrt() + eps)).to(x.dtype)
    return torch.where(mask, whitened, torch.zeros_like(whitened))


def whitens(algo: str, cfg: RLConfig) -> bool:
    """Whether `compute_advantages` whitens over the batch (REINFORCE++; PPO with rl.whiten_advantages)."""
    return algo == "reinforce_pp" or (algo == "ppo" and cfg.whiten_advantages)


def join_whitening(algo: str, cfg: RLConfig, reduce: Reduce) -> None:
    """On a process without a batch this step: the collectives that `compute_advantages`' whitening
    runs on the others (nothing where it does not whiten)."""
    if whitens(algo, cfg):
        masked_whiten(torch.zeros(0), torch.zeros(0, dtype=torch.bool), reduce=reduce)


@torch.no_grad()
def reinforce_pp_advantages(token_rewards: Tensor, action_mask: Tensor, gamma: float, eps: float = 1e-6,
                            step_end: Tensor | None = None) -> Tensor:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): returns-to-go, whitened over the batch.

        G_t = r_t + g_t G_{t'}     (t' = next action token; see `returns_to_go`)
        A_t = (G_t - mean(G)) / (std(G) + eps)

    mean and std run over every action token of the whole batch (global
    normalisation, not per group). `compute_advantages` passes the TASK
    rewards here and subtracts the KL term after whitening (see the module doc).
    """
    return masked_whiten(returns_to_go(token_rewards, action_mask, gamma, step_end), action_mask, eps)


# ------------------------------------------------------- episode / turn level
def turn_level_returns(turn_rewards: Tensor, turn_mask: Tensor, gamma: float) -> Tensor:
    """Per-turn returns-to-go: (B, N) -> (B, N), 0 on padded turns.

        G_n = r_n + gamma G_{n+1},   G_N = 0       (gamma once per turn)

    The trainer computes the same numbers as the token return-to-go at each
    turn's first action token with rl.discount = turn (`returns_to_go` with
    `step_ends(..., "turn")`, then `at_turn_starts`); this form is the formula.
    """
    real = turn_mask.bool()
    rewards = torch.where(real, turn_rewards, torch.zeros_like(turn_rewards))
    returns = torch.zeros_like(rewards)
    next_return = torch.zeros_like(rewards[:, 0])
    for n in reversed(range(rewards.shape[1])):
        next_return = rewards[:, n] + gamma * next_return
        returns[:, n] = next_return
    return torch.where(real, returns, torch.zeros_like(returns))


def _cells(group_ids: Tensor, shape: torch.Size, sub_ids: Tensor | None = None) -> tuple[Tensor, int]:
    """(numel,) cell index of every entry of a (B,) or (B, N) tensor, and the cell count.

    Cell = (group, column) without `sub_ids`; (group, sub_ids entry) with it (GiGPO's step groups)."""
    _, group = torch.unique(group_ids, return_inverse=True)  # (B,) in 0 .. G-1
    if len(shape) == 1:
        return group, int(group.max().item() + 1) if group.numel() else 0
    B, N = shape
    second = torch.arange(N, device=group.device).expand(B, N) if sub_ids is None else sub_ids.long()
    pairs = torch.stack([group.unsqueeze(1).expand(B, N), second], dim=-1).reshape(-1, 2)
    _, cell = torch.unique(pairs, dim=0, return_inverse=True)
    return cell, int(cell.max().item() + 1) if cell.numel() else 0


def _cell_sum(values: Tensor, cell: Tensor, n_cells: int) -> Tensor:
    return torch.zeros(n_cells, dtype=values.dtype, device=values.device).index_add_(0, cell, values)


# Returns that differ by no more than this share of their magnitude (at least 1) are equal: a
# cell (group) of them carries no signal. Relative, so that unnormalised scores (SciWorld's run to
# 100) summed in another order, a few float32 steps apart, still count as equal.
EQUAL_RETURNS_TOL = 1e-6


def equal_returns(hi: Tensor, lo: Tensor) -> Tensor:
    """Elementwise: the largest and smallest return of a group are equal (EQUAL_RETURNS_TOL).
    NaN is never equal (it stays visible); hi = -inf, lo = +inf (no return) is."""
    scale = torch.maximum(hi.abs(), lo.abs()).clamp(min=1.0)
    return (hi - lo) <= EQUAL_RETURNS_TOL * scale


def _cell_flat(x: Tensor, cell: Tensor, m: Tensor, n_cells: int) -> Tensor:
    """(n_cells,) True where a cell's masked values are all equal (`equal_returns`), or it has none.

    Group baselines must give such a cell exact zeros: its mean, computed in float, is not its
    value unless that is dyadic (8 returns of 0.7 in float32 leave deviations of ~6e-8, which
    the std normalisation blows up to +-0.06 with an arbitrary sign)."""
    inf = torch.tensor(torch.inf, dtype=x.dtype, device=x.device)
    hi = torch.full((n_cells,), -torch.inf, dtype=x.dtype, device=x.device)
    lo = torch.full((n_cells,), torch.inf, dtype=x.dtype, device=x.device)
    hi = hi.scatter_reduce(0, cell, torch.where(m, x, -inf), "amax")
    lo = lo.scatter_reduce(0, cell, torch.where(m, x, inf), "amin")
    return equal_returns(hi, lo)


def _cell_normalise(x: Tensor, cell: Tensor, m: Tensor, n_cells: int, divide_by_std: bool, eps: float) -> Tensor:
    """(x - mean_cell x) [/ (sample std_cell x + eps)] on masked entries (flat tensors); 0 elsewhere
    and on every entry of a cell whose values are all equal (`_cell_flat`)."""
    w = m.to(x.dtype)
    count = _cell_sum(w, cell, n_cells)
    mean = _cell_sum(x * w, cell, n_cells) / count.clamp(min=1)
    live = m & ~_cell_flat(x, cell, m, n_cells)[cell]
    dev = torch.where(live, x - mean[cell], torch.zeros_like(x))
    if not divide_by_std:
        return dev
    var = _cell_sum(dev**2, cell, n_cells) / (count - 1).clamp(min=1)
    return dev / (var.sqrt()[cell] + eps)


def _mask_of(returns: Tensor, mask: Tensor | None) -> Tensor:
    return torch.ones_like(returns, dtype=torch.bool) if mask is None else mask.bool().reshape(returns.shape)


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
    cell, n_cells = _cells(group_ids, returns.shape)
    adv = _cell_normalise(returns.reshape(-1), cell, _mask_of(returns, mask).reshape(-1), n_cells, True, eps)
    return adv.reshape(returns.shape)


@torch.no_grad()
def rloo_advantages(returns: Tensor, group_ids: Tensor, mask: Tensor | None = None) -> Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics").

        A_i = R_i - 1/(k - 1) sum_{j in g(i), j != i} R_j  =  k/(k - 1) (R_i - mean_g R)

    with k the group size; a group of one, or of equal returns, gets A = 0 (no
    baseline exists; no signal). (B, N) returns with `mask` give a per-turn-index
    baseline, as in `grpo_advantages`. Output has the shape of `returns`, 0 where mask = 0.
    """
    cell, n_cells = _cells(group_ids, returns.shape)
    x, m = returns.reshape(-1), _mask_of(returns, mask).reshape(-1)
    w = m.to(x.dtype)
    count = _cell_sum(w, cell, n_cells)[cell]
    total = _cell_sum(x * w, cell, n_cells)[cell]
    baseline = (total - x) / (count - 1).clamp(min=1)
    live = m & (count > 1) & ~_cell_flat(x, cell, m, n_cells)[cell]
    adv = torch.where(live, x - baseline, torch.zeros_like(x))
    return adv.reshape(returns.shape)


@torch.no_grad()
def gigpo_advantages(
    episode_returns: Tensor,
    step_returns: Tensor,
    turn_mask: Tensor,
    group_ids: Tensor,
    anchor_ids: Tensor,
    episode_weight: float = 1.0,
    step_weight: float = 1.0,
    norm: Literal["std", "none"] = "none",
    eps: float = 1e-6,
) -> Tensor:
    """Group-in-Group Policy Optimization (Feng et al. 2025, arXiv:2505.10978): (B, N) per-turn advantages.

    Episode level (the paper's eq. 3), over the episodes i of a group (same game):
        A^E_i    = (R_i - mean_g R) / F_norm(g),       R_i = sum_n r^i_n
    Step level (eq. 6-7): a step group S(g, s) holds every turn (i, n) of group g
    whose anchor state s^i_n (`anchor_ids`, the state the turn started from) is s;
    each turn's return G^i_n (`step_returns`, eq. 5: sum_{k >= n} gamma^{k-n} r^i_k)
    is compared with the others of its step group:
        A^S_{i,n} = (G^i_n - mean_S G) / F_norm(S)
    Combined (eq. 8; the paper weighs the step term by omega = 1):
        A_{i,n}  = w_E A^E_i + w_S A^S_{i,n}

    F_norm is 1 (norm='none', verl-agent's default mode=mean_norm) or the sample
    std + eps (norm='std', mode=mean_std_norm, as `grpo_advantages`). A group or
    step group of one gets 0 for its term. Output is 0 on padded turns (turn_mask = 0).
    """
    if anchor_ids.shape != step_returns.shape:
        raise ValueError(f"anchor_ids {tuple(anchor_ids.shape)} must match the per-turn returns {tuple(step_returns.shape)}")
    std = {"std": True, "none": False}[norm]
    m = turn_mask.bool()
    cell, n = _cells(group_ids, episode_returns.shape)
    episode_adv = _cell_normalise(episode_returns, cell, torch.ones_like(m[:, 0]), n, std, eps)  # (B,)
    cell, n = _cells(group_ids, step_returns.shape, sub_ids=anchor_ids)
    step_adv = _cell_normalise(step_returns.reshape(-1), cell, m.reshape(-1), n, std, eps).reshape(m.shape)
    combined = episode_weight * episode_adv.unsqueeze(1) + step_weight * step_adv
    return torch.where(m, combined, torch.zeros_like(combined))


def step_group_stats(group_ids: Tensor, anchor_ids: Tensor, turn_mask: Tensor) -> dict[str, float]:
    """GiGPO's step groups, for logging.

        gigpo/anchor_hit_rate:  fraction of real turns whose step group holds another turn
                                (their state was met again within the game's group)
        gigpo/step_group_size:  mean number of turns per step group
    """
    m = turn_mask.bool().reshape(-1)
    cell, n = _cells(group_ids, turn_mask.shape, sub_ids=anchor_ids)
    size = _cell_sum(m.float(), cell, n)  # (cells,) 0 for cells of padded turns only
    real_turns = float(m.sum())
    return {
        "gigpo/anchor_hit_rate": float((size[cell] > 1)[m].float().sum()) / max(real_turns, 1.0),
        "gigpo/step_group_size": float(size[size > 0].mean()) if bool((size > 0).any()) else 0.0,
    }


def zero_variance_fraction(returns: Tensor, group_ids: Tensor) -> float:
    """Fraction of groups whose episode returns (B,) are all equal (`_cell_flat`): no group signal.

    A group of one counts as zero-variance (it has no baseline)."""
    group, n = _cells(group_ids, returns.shape)
    if n == 0:
        return 0.0
    return float(_cell_flat(returns, group, torch.ones_like(returns, dtype=torch.bool), n).float().mean())


# ------------------------------------------------------------- entry point
BASELINES: dict[str, Callable[..., Tensor]] = {"grpo": grpo_advantages, "rloo": rloo_advantages}


def _kl_for_reward(kl: Tensor | None, cfg: RLConfig) -> Tensor | None:
    """The per-token KL to put into the reward, or None when the KL goes in the loss."""
    if not cfg.kl_in_reward or cfg.kl_coef == 0:
        return None
    if kl is None:
        raise ValueError("rl.kl_in_reward with rl.kl_coef > 0 needs the per-token kl tensor")
    return kl


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
    bootstrap_values: Tensor | None = None,
    anchor_ids: Tensor | None = None,
    reduce: Reduce | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The one entry point of the trainer: (advantages (B, T), returns (B, T) or None).

        ppo:          masked GAE on token rewards (- beta kl_t if kl_in_reward), V after the
                      last action = `bootstrap_values` (truncated episodes); whitened over the
                      batch if rl.whiten_advantages; returns = value targets
        reinforce_pp: token returns-to-go G_t (or per-turn G_n), whitened over the batch
        grpo, rloo:   group baseline on R = sum_n r_n (or on per-turn G_n with turn_level_returns)
        gigpo:        w_E A^E(R) + w_S A^S(G_n) over anchor-state step groups (`anchor_ids`)

    Discounting follows rl.discount (see the module doc). With rl.kl_in_reward
    (and kl_coef > 0) the critic-free estimators subtract beta * KL after
    normalising the task return: the KL return-to-go per token (reinforce_pp),
    per turn (turn-level, gigpo) or the episode's KL sum (grpo, rloo);
    otherwise the trainer adds kl_coef * KL to the loss. Advantages are 0 off
    the action mask and carry no gradient. Call on the whole step batch; under
    a launcher pass `reduce`, so the batch whitening runs over every rank's
    batch (see `masked_whiten`, `join_whitening`).
    """
    if algo == "ppo" and values is None:
        raise ValueError("ppo needs critic values (B, T)")
    mask, n_turns = action_mask.bool(), turn_rewards.shape[1]
    ends = step_ends(action_mask, turn_ids, cfg.discount)
    rewards = token_rewards(turn_rewards.float(), turn_mask, action_mask, turn_ids)  # (B, T) task reward
    kl_r = _kl_for_reward(kl, cfg)
    kl_r = None if kl_r is None else torch.where(mask, kl_r.to(rewards.dtype), torch.zeros_like(rewards))
    if algo == "ppo":
        shaped = rewards if kl_r is None else rewards - cfg.kl_coef * kl_r
        adv, ret = masked_gae(shaped, values, action_mask, cfg.gamma, cfg.lam, ends, bootstrap_values)
        return (masked_whiten(adv, mask, reduce=reduce) if cfg.whiten_advantages else adv), ret
    if algo not in ("reinforce_pp", "gigpo", *BASELINES):
        raise ValueError(f"unknown rl.algo {algo!r}; known: ppo, reinforce_pp, gigpo, {', '.join(BASELINES)}")
    # critic-free: per-turn estimators use G_n, the return-to-go at each turn's first action token
    per_turn = cfg.turn_level_returns or algo == "gigpo"
    G = returns_to_go(rewards, action_mask, cfg.gamma, ends)  # (B, T)
    G_turn = at_turn_starts(G, action_mask, turn_ids, n_turns)  # (B, N)
    episode_return = torch.where(turn_mask.bool(), turn_rewards.float(), 0.0).sum(1)  # (B,) R = sum_n r_n
    if algo == "reinforce_pp":
        adv = masked_whiten(broadcast_to_tokens(G_turn, turn_ids, action_mask) if per_turn else G, mask, reduce=reduce)
    elif algo == "gigpo":
        if anchor_ids is None:
            raise ValueError("gigpo needs anchor_ids (B, N): the state each turn started from")
        per_turn_adv = gigpo_advantages(episode_return, G_turn, turn_mask, group_ids, anchor_ids,
                                        cfg.gigpo_episode_weight, cfg.gigpo_step_weight, cfg.gigpo_norm)
        adv = broadcast_to_tokens(per_turn_adv, turn_ids, action_mask)
    elif per_turn:
        adv = broadcast_to_tokens(BASELINES[algo](G_turn, group_ids, mask=turn_mask), turn_ids, action_mask)
    else:
        adv = BASELINES[algo](episode_return, group_ids).unsqueeze(1).expand(mask.shape)
    if kl_r is not None:  # after the normalisation: beta sets the KL term's scale
        kl_to_go = returns_to_go(kl_r, action_mask, cfg.gamma, ends)  # (B, T)
        if per_turn:
            kl_term = broadcast_to_tokens(at_turn_starts(kl_to_go, action_mask, turn_ids, n_turns), turn_ids, action_mask)
        elif algo == "reinforce_pp":
            kl_term = kl_to_go
        else:
            kl_term = kl_r.sum(1, keepdim=True).expand(mask.shape)  # the episode's KL, beside R
        adv = adv - cfg.kl_coef * kl_term
    return torch.where(mask, adv, torch.zeros_like(adv)), None
