"""A text game that lasts exactly T steps whatever the agent does (for benchmarks); level `tT`, e.g. `t8`.

Each observation is a TextWorld-like room description of about 60-100 words
with about 10 admissible commands, drawn deterministically from (seed, turn),
so every run of a benchmark sees the same text. Any action is accepted; the
episode ends (done, not won) after the given number of steps. Option `step_ms`
makes each step burn that much CPU time (as a real game engine does; TextWorld
takes 4-14 ms a step), so overlapping env steps with generation can be measured.

Register it before building a pool (workers import it by this module name,
so `bench/` must be on sys.path, as it is when a bench script runs):

    registry.FAMILIES["fixed"] = "fixed_turn_env"
"""

from __future__ import annotations

import random
import time

from agentrecipe.envs.base import GameSpec, Observation

OBJECTIVE = "Find the golden key, unlock the iron chest in the cellar and put the old map inside it."
ROOMS = ("kitchen", "pantry", "cellar", "attic", "library", "garden", "hallway", "study", "bedroom", "workshop")
ADJS = ("dusty", "wooden", "red", "small", "heavy", "shiny", "old", "broken", "blue", "iron")
THINGS = ("apple", "lamp", "book", "key", "coin", "box", "knife", "candle", "map", "bottle", "rope", "hat")
FURNITURE = ("table", "shelf", "counter", "chest", "cabinet", "bed", "desk", "crate")
DIRS = ("north", "south", "east", "west")
FILLER = (
    "The air smells faintly of smoke and old paper.",
    "A draught moves the cobwebs in the corner.",
    "You hear water dripping somewhere below you.",
    "The floorboards creak under your weight.",
    "Light falls through a narrow window onto the floor.",
    "Someone has scratched a few words into the wall, but you cannot read them.",
    "It is quiet here, almost too quiet.",
)


def check_level(name: str) -> None:
    if not (name.startswith("t") and name[1:].isdigit() and int(name[1:]) > 0):
        raise ValueError(f"fixed-turn level {name!r}: expected t<turns>, e.g. t8")


def build_games(level: str, split: str, seeds: list[int], out_dir, options: dict) -> list[GameSpec]:
    check_level(level)
    return [GameSpec(path=f"fixed-{seed}", level=level, env="fixed", split=split, seed=seed) for seed in seeds]


def room_text(seed: int, turn: int) -> tuple[str, tuple[str, ...]]:
    """(description of about 60-100 words, about 10 admissible commands) for one turn of one game."""
    rng = random.Random(seed * 1_000_003 + turn)
    room, exits = rng.choice(ROOMS), rng.sample(DIRS, 2)
    items = [f"{rng.choice(ADJS)} {t}" for t in rng.sample(THINGS, 3)]
    furn = [f"{rng.choice(ADJS)} {f}" for f in rng.sample(FURNITURE, 2)]
    text = (
        f"-= {room.title()} =- You are now in the {room}. It is a {rng.choice(ADJS)} room with a low ceiling. "
        f"You can see a {furn[0]} and a {furn[1]}. On the {furn[0]} you make out a {items[0]} and a {items[1]}. "
        f"The {furn[1]} is closed, but there is a {items[2]} lying next to it. "
        f"{' '.join(rng.sample(FILLER, rng.randint(2, 3)))} "
        f"There is an exit to the {exits[0]} and a door leading {exits[1]}."
    )
    commands = (
        [f"go {d}" for d in exits]
        + [f"take {i}" for i in items]
        + [f"open {furn[1]}", f"examine {furn[0]}", f"put {items[0]} on {furn[1]}", "look", "inventory"]
    )
    return text, tuple(commands)


class FixedTurnEnv:
    def __init__(self, step_ms: float = 0.0):
        self.step_ms = step_ms

    def _obs(self) -> Observation:
        text, commands = room_text(self.seed, self.t)
        return Observation(text=text, objective=OBJECTIVE, admissible_commands=commands, score=0.0, max_score=1.0)

    def reset(self, game: GameSpec) -> Observation:
        self.seed, self.t, self.turns = game.seed, 0, int(game.level[1:])
        return self._obs()

    def step(self, action: str):
        end = time.process_time() + self.step_ms / 1000
        while time.process_time() < end:  # busy: the CPU a real engine would use
            pass
        self.t += 1
        return self._obs(), 0.0, self.t >= self.turns, {"invalid": False}

    def close(self) -> None:
        pass


def make_env(options: dict) -> FixedTurnEnv:
    return FixedTurnEnv(float(options.get("step_ms", 0.0)))


def corpus(n_games: int = 50, turns: int = 16) -> list[str]:
    """Text an agent on these games reads and writes (for training a tokenizer)."""
    out = [OBJECTIVE]
    for seed in range(n_games):
        for t in range(turns + 1):
            text, commands = room_text(seed, t)
            out += [text, ", ".join(commands), *commands]
    return out
