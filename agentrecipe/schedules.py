"""Step-indexed schedules of the RL stage: turn limit and level curriculum.

Both are piecewise-constant lookups: phase k = min(step // every, K - 1)
covers steps [k * every, (k + 1) * every), and the last phase lasts forever.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def _phase(step: int, phases: list[T], every: int) -> T:
    """phases[min(step // every, len(phases) - 1)]."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    return phases[min(step // every, len(phases) - 1)]


def turn_limit(step: int, schedule: list[int], every: int, default: int) -> int:
    """Turn limit of the episodes rolled out at RL step `step`.

        h(step) = h_k,  k = min(step // every, K - 1)

    ScalingInter-RL (Xi et al., 2025, "AgentGym-RL"): start with a short
    horizon h_0 < h_1 < ... < h_{K-1} so the policy first learns to exploit
    short interactions, then allow longer ones. An empty schedule means a
    fixed limit `default` (rollout.max_turns) throughout.
    """
    if not schedule:
        return default
    return _phase(step, schedule, every)


def curriculum_levels(step: int, phases: list[list[str]], every: int, default: list[str]) -> list[str]:
    """Levels whose games are sampled at RL step `step`.

        levels(step) = phases[min(step // every, K - 1)]

    An empty curriculum means `default` (env.levels) throughout. Returns a
    new list, so callers may mutate it.
    """
    if not phases:
        return list(default)
    return list(_phase(step, phases, every))
