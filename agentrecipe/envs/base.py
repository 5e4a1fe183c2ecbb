"""The environment protocol every text environment implements.

An environment plays one game at a time:

    obs = env.reset(game)                 # Observation
    obs, reward, done, info = env.step(action)

`reward` is the raw score change of the step (what the game awards); the
reward *mode* (sparse / dense / penalties) is applied later by
`agentrecipe.rewards`, never inside the game.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class GameSpec:
    """One playable game: where its file lies and what it is."""

    path: str
    """Game file (TextWorld .z8/.ulx, ALFWorld game.tw-pddl)."""
    level: str
    """Curriculum level name, e.g. ``w2-o3-q4``."""
    env: str = "textworld"
    """Environment family that can play it (a key of the env registry)."""
    split: str = "train"
    seed: int = 0
    max_score: float = 1.0
    expert_plan: tuple[str, ...] = ()
    """A plan that wins the game from its start (may be empty if unknown)."""


@dataclass(frozen=True)
class Observation:
    """What the agent sees after reset or a step. All text is cleaned."""

    text: str
    """Feedback of the last command (or the room description after reset)."""
    objective: str
    admissible_commands: tuple[str, ...]
    score: float
    max_score: float
    won: bool = False
    lost: bool = False
    expert_action: str | None = None
    """Next action of the expert from this state (None when unknown)."""
    expert_plan: tuple[str, ...] = ()
    """Remaining expert plan from this state."""
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    """A text game environment playing one game at a time."""

    def reset(self, game: GameSpec) -> Observation: ...

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]: ...

    def close(self) -> None: ...
