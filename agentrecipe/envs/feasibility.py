"""Checks that a run can answer the question it asks, made from the games before any training.

- Turn limit vs expert plans: a game whose shortest known plan is longer than the
  turn limit cannot be won by any policy (the expert included), so a run on such
  games reports 0% for everyone without saying why.
- Reward density: dense reward is the score change per turn; on games whose score
  moves only at the win (TextWorld custom wW-oO-qQ without -pP, max score 1) dense equals sparse,
  so a sparse-vs-dense ablation there compares a setting with itself.

Functions take games and numbers and return messages; stages decide to print or stop.
"""

from __future__ import annotations

from collections import defaultdict

from agentrecipe.envs.base import GameSpec


class InfeasibleRun(ValueError):
    """No game of some level can be won within the turn limit."""


def turn_limit_warnings(games: list[GameSpec], max_turns: int, key: str) -> list[str]:
    """Messages for levels with games whose expert plan is longer than `max_turns`.

    Raises InfeasibleRun when every game of a level with known plans is out of reach;
    `key` names the param to raise in the message (e.g. ``rollout.max_turns``)."""
    by_level: dict[str, list[int]] = defaultdict(list)
    for g in games:
        if g.expert_plan:
            by_level[g.level].append(len(g.expert_plan))
    messages, hopeless = [], {}
    for level, plans in sorted(by_level.items()):
        too_long = sum(n > max_turns for n in plans)
        if too_long == len(plans):
            hopeless[level] = plans
        elif too_long:
            messages.append(f"warning: {key}={max_turns}: {too_long} of {len(plans)} {level} games need more turns "
                            f"than that (expert plans up to {max(plans)} steps); they cannot be won")
    if hopeless:
        levels = ", ".join(f"{lvl} (plans {min(p)}-{max(p)} steps)" for lvl, p in hopeless.items())
        need = max(min(p) for p in hopeless.values())
        raise InfeasibleRun(f"{key}={max_turns} is below the expert's plan length on every game of {levels}: "
                            f"every policy would score 0%. Raise {key} to at least {need}.")
    return messages


def check_feasible(games: list[GameSpec], limits: list[int], key: str) -> None:
    """Print the turn-limit warnings for every limit a run uses; exit with the message when the
    largest limit leaves a level unwinnable (for stages: called before any training or play)."""
    try:
        for limit in sorted(set(limits)):
            notes = turn_limit_warnings(games, limit, key) if limit == max(limits) else _soft(games, limit, key)
            for note in notes:
                print(note)
    except InfeasibleRun as e:
        raise SystemExit(f"error: {e}") from None


def _soft(games: list[GameSpec], limit: int, key: str) -> list[str]:
    """Warnings only: an early, shorter phase of a turn schedule may leave games out of reach."""
    try:
        return turn_limit_warnings(games, limit, key)
    except InfeasibleRun as e:
        return [f"warning: {e} (only in the phases with this limit)"]


def reward_density_warning(levels: list[str], family, reward_mode: str) -> str | None:
    """A message when dense reward is asked for on levels where it equals sparse.

    A family says whether a level's score can move before the game is won through an optional
    ``intermediate_reward(level) -> bool``; families without it are not checked. Its optional
    ``DENSE_HINT`` names its levels whose score does move."""
    judge = getattr(family, "intermediate_reward", None)
    if reward_mode != "dense" or judge is None:
        return None
    flat = [lvl for lvl in levels if not judge(lvl)]
    if not flat:
        return None
    hint = getattr(family, "DENSE_HINT", "")
    return (f"warning: reward=dense on {', '.join(flat)}: the score of these games only changes when the game "
            f"is won, so dense reward equals sparse there (up to the size of the win's score)."
            f"{' ' + hint if hint else ''}")
