"""Step-indexed schedules of the RL stage: turn limit and level curriculum.

Both are piecewise-constant lookups: phase k = min(step // every, K - 1)
covers steps [k * every, (k + 1) * every), and the last phase lasts forever.
`every = 0` (the default) spreads the K phases over the run: floor(n_steps / K) steps each,
the last phase keeping the remainder (it starts before the run ends whenever n_steps >= K).
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


def phase_steps(every: int, n_phases: int, n_steps: int) -> int:
    """Steps per phase: `every`, or for 0 the run's steps split between the phases, floor(n_steps /
    n_phases), the last phase keeping the rest (25 steps, 3 phases: 8, so steps 0-7, 8-15, 16-24)."""
    if every < 0:
        raise ValueError(f"every must be >= 0, got {every}")
    return every if every else max(1, n_steps // max(1, n_phases))


def unreached_phases(key: str, n_phases: int, every: int, n_steps: int) -> str | None:
    """An error naming `key` (rl.turn_schedule_every, rl.curriculum_every) when a schedule of
    `n_phases` phases, moving every `every` steps, never reaches its last phase in `n_steps` steps:
    the last phase starts at step (n_phases - 1) * every. None when it does (or nothing is scheduled)."""
    steps = phase_steps(every, n_phases, n_steps)
    if n_phases <= 1 or n_steps <= 0 or (n_phases - 1) * steps < n_steps:
        return None
    if n_steps < n_phases:
        return (f"{key}: {n_phases} phases, but this run has only {n_steps} RL steps; raise budget.total_units "
                "or drop phases")
    return (f"{key}={every}: the last of the {n_phases} phases starts at step {(n_phases - 1) * steps}, "
            f"but this run has {n_steps} RL steps; set {key} to at most {(n_steps - 1) // (n_phases - 1)} "
            "(or 0, or raise budget.total_units)")
