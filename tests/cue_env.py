"""A tiny deterministic text game for learning tests: follow the signs.

Each game (seed) is a fixed sequence of TURNS signs pointing east or west.
Going the way the sign points scores 1 and shows the next sign; the other way
loses. Following every sign wins (max score = TURNS). An untrained greedy
policy ignores the signs and wins about 1 / 2**TURNS of the games.
"""

from __future__ import annotations

import random

from agentrecipe.envs.base import GameSpec, Observation

TURNS = 2
COMMANDS = ("go east", "go west")


def check_level(name: str) -> None:
    pass


def signs(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(["east", "west"]) for _ in range(TURNS)]


def build_games(level: str, split: str, seeds: list[int], out_dir, options: dict) -> list[GameSpec]:
    return [
        GameSpec(path=f"cue-{seed}", level=level, env="cue", split=split, seed=seed, max_score=float(TURNS),
                 expert_plan=tuple(f"go {s}" for s in signs(seed)))
        for seed in seeds
    ]


class CueEnv:
    def _obs(self, text: str, won=False, lost=False) -> Observation:
        plan = tuple(f"go {s}" for s in self.signs[self.t:])
        return Observation(text=text, objective="Follow the signs.", admissible_commands=COMMANDS, score=float(self.t),
                           max_score=float(TURNS), won=won, lost=lost, expert_action=plan[0] if plan else None,
                           expert_plan=plan)

    def reset(self, game: GameSpec) -> Observation:
        self.signs, self.t = signs(game.seed), 0
        return self._obs(f"A sign points {self.signs[0]}.")

    def step(self, action: str):
        if action == f"go {self.signs[self.t]}":
            self.t += 1
            if self.t == TURNS:
                return self._obs("You made it!", won=True), 1.0, True, {"invalid": False}
            return self._obs(f"A sign points {self.signs[self.t]}."), 1.0, False, {"invalid": False}
        return self._obs("You fall into a pit.", lost=True), 0.0, True, {"invalid": action not in COMMANDS}

    def close(self) -> None:
        pass


def make_env(options: dict) -> CueEnv:
    return CueEnv()
