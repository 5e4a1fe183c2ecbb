"""DAPO dynamic sampling: train only on groups whose rollouts disagree.

A group (one game's `group_size` rollouts) whose episodes all earn the same
return gives every group baseline (GRPO, RLOO, GiGPO's episode term) a zero
advantage: it adds tokens to the loss and no signal. DAPO (Yu et al. 2025,
arXiv:2503.14476, "dynamic sampling") drops such groups and samples more
prompts until the batch is full of informative ones. Here:

    informative(g)  <=>  max_{i in g} R_i and min_{i in g} R_i are not equal (equal_returns)
                         over the group's episodes that did not fail (at least 2)

Each extra round plays up to `games_per_step` new games, until
`games_per_step` informative groups are kept or `max_extra_games` extra games
were played. When the cap is hit first, the batch is topped up with
zero-variance groups (first played first), so every step trains on
`games_per_step` groups. Failed episodes stay in their group (the batch
builder skips them). Every episode played, dropped groups included, is kept
in `played` for the step's `rollout/*` metrics and failure count: over the
kept groups alone, success would lean toward mixed groups and the
zero-variance share would be about 0 by construction.

Only for estimators where equal episode returns mean zero advantage (grpo,
rloo on R; the config refuses the others).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from agentrecipe.algos.advantages import equal_returns
from agentrecipe.envs.base import GameSpec
from agentrecipe.rollout.episode import Episode


@dataclass
class DynamicSample:
    episodes: list[Episode]
    """The kept groups' episodes, group after group."""
    group_of: list[int]
    """Group index (0 .. games_per_step - 1) of each episode."""
    played: list[Episode] = field(default_factory=list)
    """Every episode played this step, group after group, dropped groups included."""
    played_group_of: list[int] = field(default_factory=list)
    """Group index of each played episode (one per group played)."""
    stats: dict[str, float] = field(default_factory=dict)


def informative(returns: list[float]) -> bool:
    """The group's returns differ, by the test the group baselines use (in float32, as they do)."""
    return len(returns) >= 2 and not bool(equal_returns(torch.tensor(max(returns)), torch.tensor(min(returns))))


def dynamic_sampling(
    play: Callable[[list[GameSpec], int], list[Episode]],
    games: list[GameSpec],
    draw_games: Callable[[int], list[GameSpec]],
    group_size: int,
    max_extra_games: int,
    episode_return: Callable[[Episode], float],
) -> DynamicSample:
    """Play `games` (group_size rollouts each), then more until len(games) groups are informative.

    play(games, round) plays each listed game once and returns the episodes in
    order (round 0, 1, ... lets it seed each round's sampling differently);
    draw_games(k) draws k more games; episode_return(ep) is the return the
    advantages see (the shaped turn rewards summed).

    stats: dapo/dropped_groups (zero-variance groups played and not trained on),
    dapo/extra_games (games played beyond the first draw), dapo/topped_up_groups
    (zero-variance groups trained on because the cap was reached).
    """
    games_per_step = len(games)
    kept: list[list[Episode]] = []
    spare: list[list[Episode]] = []
    played: list[list[Episode]] = []
    extra, round_, pending = 0, 0, list(games)
    while True:
        episodes = play([g for g in pending for _ in range(group_size)], round_)
        for start in range(0, len(episodes), group_size):
            group = episodes[start : start + group_size]
            played.append(group)
            returns = [episode_return(ep) for ep in group if not ep.failed]
            (kept if informative(returns) else spare).append(group)
        need = games_per_step - len(kept)
        if need <= 0 or extra >= max_extra_games:
            break
        pending = draw_games(min(games_per_step, max_extra_games - extra))
        extra += len(pending)
        round_ += 1
    topped_up = spare[: max(games_per_step - len(kept), 0)]
    groups = kept[:games_per_step] + topped_up
    return DynamicSample(
        episodes=[ep for group in groups for ep in group],
        group_of=[g for g, group in enumerate(groups) for _ in group],
        played=[ep for group in played for ep in group],
        played_group_of=[g for g, group in enumerate(played) for _ in group],
        stats={
            "dapo/dropped_groups": float(len(spare) - len(topped_up)),
            "dapo/extra_games": float(extra),
            "dapo/topped_up_groups": float(len(topped_up)),
        },
    )
