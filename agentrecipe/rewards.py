"""Turn rewards of one episode from what the game reported.

The game only reports raw score changes (see `agentrecipe.envs.base`); the
reward *mode* is applied here, once per finished episode, following the
reward pillar of Wang & Ammanabrolu (2025), "A Practitioner's Guide to
Multi-turn Agentic RL": a sparse outcome reward versus a dense turn-level one,
optionally with a per-turn cost and a cost for invalid commands.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrecipe.config import RewardConfig


def turn_rewards(
    score_deltas: Sequence[float],
    won: bool,
    invalid: Sequence[bool],
    max_score: float,
    cfg: RewardConfig,
) -> list[float]:
    """One reward per turn n = 0 .. N-1 of an episode.

        sparse:  r_n = 1[n = N-1 and won]
        dense:   r_n = d_n / S_max   (cfg.normalize)   or   d_n   (otherwise)
        then     r_n -= step_penalty + invalid_penalty * 1[invalid_n]

    where d_n is the game's score change on turn n and S_max the game's max
    score. With `normalize`, the dense rewards of a won game sum to (its final
    score - its score at the start) / S_max (before penalties): 1 where winning
    means reaching the max score from 0 (TextWorld, ALFWorld, TextCraft, most
    ScienceWorld games), the same scale as the sparse reward; less on a
    ScienceWorld game that scores at the start (0.92 on find-non-living-thing
    variation 0) and on BabyAI, whose score is its own reward 1 - 0.9 steps / max_steps.

    Args:
        score_deltas: (N,) raw score change of each turn.
        won: whether the episode ended in a win.
        invalid: (N,) whether the command of each turn was invalid
            (not admissible / not understood by the game).
        max_score: the game's maximum score (> 0 when dense and normalised).
        cfg: reward mode and penalties.
    """
    n_turns = len(score_deltas)
    if len(invalid) != n_turns:
        raise ValueError(f"invalid has {len(invalid)} entries but the episode has {n_turns} turns")
    if cfg.mode == "sparse":
        rewards = [0.0] * n_turns
        if won and n_turns > 0:
            rewards[-1] = 1.0
    elif cfg.mode == "dense":
        if cfg.normalize and not max_score > 0:
            raise ValueError(f"dense rewards with normalize need max_score > 0, got {max_score}")
        scale = 1.0 / max_score if cfg.normalize else 1.0
        rewards = [float(d) * scale for d in score_deltas]
    else:
        raise ValueError(f"unknown reward mode {cfg.mode!r}; use 'sparse' or 'dense'")
    return [r - cfg.step_penalty - cfg.invalid_penalty * float(bad) for r, bad in zip(rewards, invalid)]
