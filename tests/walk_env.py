"""A tiny game family for trainer tests: game `seed` is won after 1 + seed % 4 steps, whatever the agent does.

So a batch holds episodes of known lengths (1 to 4 turns); with a turn limit below 4 the long
ones are truncated. Texts and commands vary with (seed, turn), so history windows differ.
"""

from __future__ import annotations

from agentrecipe.envs.base import GameSpec, Observation

ROOMS = ("hall", "kitchen", "cellar", "attic", "garden")
COMMANDS = ("go north", "go south", "take lamp", "open box", "look")


def check_level(name: str) -> None:
    pass


def turns_to_win(seed: int) -> int:
    return 1 + seed % 4


def build_games(level: str, split: str, seeds: list[int], out_dir, options: dict) -> list[GameSpec]:
    return [GameSpec(path=f"walk-{seed}", level=level, env="walk", split=split, seed=seed, max_score=1.0)
            for seed in seeds]


class WalkEnv:
    def _obs(self, won: bool = False) -> Observation:
        room = ROOMS[(self.seed + self.t) % len(ROOMS)]
        cmds = COMMANDS[(self.seed + self.t) % 2:][:4]
        return Observation(text=f"You are in the {room} (step {self.t}).", objective="Walk to the end.",
                           admissible_commands=cmds, score=float(won), max_score=1.0, won=won)

    def reset(self, game: GameSpec) -> Observation:
        self.seed, self.t = game.seed, 0
        return self._obs()

    def step(self, action: str):
        self.t += 1
        won = self.t >= turns_to_win(self.seed)
        return self._obs(won), float(won), won, {"invalid": False}

    def close(self) -> None:
        pass


def make_env(options: dict) -> WalkEnv:
    return WalkEnv()
