"""A fake environment family for pool tests: the actions "raise", "hang" and "crash" misbehave,
"slow" takes 0.4 s (healthy, under a 1 s timeout; four of them are not),
and so does a game whose path ends in "corrupt" (its reset kills the process, as a truncated
story file kills the TextWorld interpreter)."""

from __future__ import annotations

import os
import time

from agentrecipe.envs.base import GameSpec, Observation


def check_level(name: str) -> None:
    pass


def build_games(level: str, split: str, seeds: list[int], out_dir, options: dict) -> list[GameSpec]:
    if level == "crash":  # the build worker dies, as on a game that kills its interpreter
        os._exit(1)
    # Level "unwinnable": no game's stored plan wins; level "mixed": those of even seeds do not.
    losing = {s for s in seeds if level == "unwinnable" or (level == "mixed" and s % 2 == 0)}
    return [GameSpec(path=f"{out_dir}/{seed}", level=level, env="fake", split=split, seed=seed,
                     expert_plan=("look",) if seed in losing else ("win",))
            for seed in seeds]


class FakeEnv:
    def reset(self, game: GameSpec) -> Observation:
        if game.path.endswith("corrupt"):
            os.write(2, b"Fatal error: Story file read error\n")
            os._exit(1)
        self.game, self.t = game, 0
        return Observation(text=f"start {game.seed}", objective="say win", admissible_commands=("win",),
                           score=0.0, max_score=1.0)

    def step(self, action: str):
        if action == "raise":
            raise RuntimeError("fake env error")
        if action == "hang":
            time.sleep(3600)
        if action == "crash":
            os._exit(3)
        if action == "slow":
            time.sleep(0.4)
        self.t += 1
        won = action == "win"
        obs = Observation(text=f"{action} {self.t} in game {self.game.seed}", objective="say win",
                          admissible_commands=("win",), score=float(won), max_score=1.0, won=won)
        return obs, float(won), won, {"invalid": not won}

    def close(self) -> None:
        pass


def make_env(options: dict) -> FakeEnv:
    return FakeEnv()
