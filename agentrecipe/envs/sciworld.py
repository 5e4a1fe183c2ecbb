"""ScienceWorld (Wang et al., 2022): 30 science tasks as text games, from the `scienceworld` package.

The family contract (see ``agentrecipe/envs/registry.py``):

- Levels are ScienceWorld task names (``boil``, ``find-non-living-thing``, ``power-component``, ...;
  `task_names()`, read from the package's tasks.json, so checking a level needs no Java).
- Splits are the package's own: our train / valid / test games draw from the task's
  train / dev / test variations (`get_variations_train/dev/test`), which never overlap, so a
  variation is never shared between splits. A split's variations are put in a fixed shuffled
  order; seed s takes variation ``s % N`` (consecutive seeds: distinct variations while at most
  N are asked for).
- A game is a JSON file: task, variation, the gold action sequence (`get_gold_action_sequence`)
  cut at the step where it wins (checked at build time) and its admissible commands (below).
- Expert: the gold sequence, as long as the agent has followed it (None once it strayed).

Admissible commands. The package's valid-action list holds 400-2900 strings per state, too
many for a prompt, costs 0.5-1 s to fetch, and often lacks the gold actions verbatim ("open
door to kitchen" works but is listed differently). Each game has one fixed list, written
into the game file at build time, sorted:

1. the game's relevant actions: every distinct action of its gold sequence. They are the same
   in every state and whoever plays, so they tell which actions matter but not when or in
   which order; they make every game winnable under admissible-constrained decoding;
2. ``look around`` and ``inventory``;
3. `N_SAMPLED` actions of the valid-action list of the start state, chosen by a fixed hash of
   (game seed, action): distractors, deterministic.

Reward: the game's score change (its score runs 0-100; max_score 100, so ``reward=dense``
with normalise gives score change / 100, what the papers use), from the score at the start
(some games score a few points for the start's own look around: those are no action's). A score below 0 ends the
episode as lost (the package marks it completed). An ambiguous command ("Ambiguous request:
Please enter the number ...") is resolved to the first reading, so the agent never has to
answer with a number.

Steps go to the simulator directly (`play`): the package's `step` also fetches the look,
the inventory and the valid-action list after every action, none of which is used here.

Needs a Java runtime (Debian: ``openjdk-17-jre-headless``); one JVM per environment (each
pool slot holds one: a few hundred MB), 3-10 s to start, a load 1-5 s, a step about 100 ms
(more on a busy machine).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
from functools import lru_cache
from itertools import groupby
from pathlib import Path
from typing import Any

from agentrecipe.envs.base import GameSpec, Observation

SPLIT_VARIATIONS = {"train": "get_variations_train", "valid": "get_variations_dev", "test": "get_variations_test"}
SIMPLIFICATION = ""
N_SAMPLED = 15
BASIC = ("look around", "inventory")
MAX_ACTION_CHARS = 200
AMBIGUOUS = "Ambiguous request"
NOT_UNDERSTOOD = "No known action matches"
AMBIGUOUS_REPLY = f"{AMBIGUOUS}: more than one thing has that name; name it in full, as the listed commands do."
READING = re.compile(r"^(\d+):\t(.*)$")  # one numbered reading of an ambiguous command
JAVA_PACKAGE = "openjdk-17-jre-headless"


# ------------------------------------------------------------------------ levels
@lru_cache(maxsize=1)
def task_names() -> tuple[str, ...]:
    from scienceworld.constants import TASK_PATH

    return tuple(t["task_name"] for t in json.loads(Path(TASK_PATH).read_text()))


def check_level(name: str) -> None:
    if name not in task_names():
        raise ValueError(f"unknown ScienceWorld task {name!r}; known: {', '.join(task_names())}")


def require_java() -> None:
    if shutil.which("java") is None:
        raise RuntimeError(f"ScienceWorld needs a Java runtime and `java` is not on PATH: install it, "
                           f"e.g. `apt-get install -y {JAVA_PACKAGE}` (Debian/Ubuntu)")


def start_engine():
    """A ScienceWorld simulator (starts a JVM); the episode length is ours to limit, not its."""
    require_java()
    from scienceworld import ScienceWorldEnv

    return ScienceWorldEnv("", envStepLimit=10**9)


# --------------------------------------------------------------------- games
def variations(engine, task: str, split: str) -> list[int]:
    """The task's variations of one split, in a fixed shuffled order."""
    engine.load(task, 0, SIMPLIFICATION, generateGoldPath=False)
    found = sorted(getattr(engine, SPLIT_VARIATIONS[split])())
    random.Random(f"sciworld/{task}/{split}").shuffle(found)
    return found


def restart(engine) -> str:
    """Back to the first move of the loaded game; the start text. What `ScienceWorldEnv.reset`
    does, without fetching the look, inventory and valid actions it does not need."""
    engine.server.reset()
    engine.lastStepScore = 0
    return engine.server.step("look around")


def play(engine, action: str) -> tuple[str, int, bool, bool]:
    """(text, score 0-100 or negative, completed, understood) after one action. The package's
    `step` minus the look / inventory / valid-action fetches.

    An ambiguous command takes the reading whose text sorts first. The simulator numbers the
    readings in an order that changes from reset to reset, so taking reading 0 made the same
    actions reach different states (and a worker's replay after a restart rebuild another game).
    Readings of the same text are taken as interchangeable, reading 0 as before (gold plans name
    five apple seeds in a jar so); where they are not (three wood cups of different paints all
    read "wood cup (in art studio)"), which one moves still changes from reset to reset. The
    admissible commands' long names are never ambiguous. Without readings to choose from, the
    command is cancelled, not understood."""
    text = engine.server.step(action)
    understood = not text.startswith(NOT_UNDERSTOOD)
    if text.startswith(AMBIGUOUS):
        readings = [m.groups() for line in text.splitlines() if (m := READING.match(line))]
        if readings:
            text = engine.server.step(min(readings, key=lambda r: (r[1], int(r[0])))[0])
        else:
            engine.server.step("")
            text, understood = AMBIGUOUS_REPLY, False
    score = current_score(engine)
    return text, score, bool(engine.server.getCompleted()) or score < 0, understood


def current_score(engine) -> int:
    """The game's score now, 0-100 (negative once the task has failed)."""
    return int(round(100 * engine.server.getScore()))


def winning_prefix(engine, gold: list[str]) -> list[str]:
    """The gold actions of the loaded game up to the one that wins (score 100); [] if none does."""
    restart(engine)
    for i, action in enumerate(gold):
        _, score, done, _ = play(engine, action)
        if score >= 100:
            return gold[: i + 1]
        if done:
            break
    return []


def sampled(valid: list[str], seed: int, k: int = N_SAMPLED) -> list[str]:
    """k valid actions in a fixed hash order of (seed, action)."""
    key = lambda a: hashlib.sha1(f"{seed}\x00{a}".encode()).hexdigest()  # noqa: E731
    return sorted(set(valid), key=key)[:k]


def game_pool(level: str, split: str, options: dict) -> tuple[tuple[str, int], ...]:
    """Game `seed` of a task and split is variation `pool[seed % len(pool)]` of the split's
    (task, variation) pairs; ScienceWorld's splits hold disjoint variations."""
    return tuple((level, v) for v in split_variations(level)[split])


@lru_cache(maxsize=None)
def split_variations(task: str) -> dict[str, tuple[int, ...]]:
    """Each split's variations of a task, in draw order (one JVM start per task and process)."""
    check_level(task)
    engine = start_engine()
    try:
        return {split: tuple(variations(engine, task, split)) for split in SPLIT_VARIATIONS}
    finally:
        engine.close()


def build_games(level: str, split: str, seeds: list[int], out_dir: str | Path, options: dict) -> list[GameSpec]:
    """One ``<level>-s<seed>.json`` per seed in out_dir (one JVM for the batch)."""
    if options:
        raise ValueError(f"ScienceWorld games take no build options, got {sorted(options)}")
    check_level(level)
    engine = start_engine()
    try:
        pool = variations(engine, level, split)
        if len({s % len(pool) for s in seeds}) < len(seeds):
            raise ValueError(f"ScienceWorld task {level} has {len(pool)} {split} variations; {len(seeds)} games "
                             f"were asked for (lower env.n_{split})")
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        games = []
        for seed in seeds:
            variation = pool[seed % len(pool)]
            engine.load(level, variation, SIMPLIFICATION, generateGoldPath=True)
            # Without the gold plans' answers to "which one do you mean?" (a number): play() answers
            # those itself, so the gold "0" after it was not understood, a wasted step that SFT taught.
            gold = [a for a in map(sanitize_action, engine.get_gold_action_sequence()) if not a.isdigit()]
            plan = winning_prefix(engine, gold)
            if not plan:
                raise RuntimeError(f"ScienceWorld {level} variation {variation}: its gold actions do not win")
            restart(engine)
            start_valid = [sanitize_action(a) for a in engine.get_valid_action_object_combinations()]
            admissible = sorted(set(plan) | set(BASIC) | set(sampled(start_valid, seed)))
            game = {"task": level, "variation": variation, "simplification": SIMPLIFICATION,
                    "expert_plan": plan, "admissible_commands": admissible}
            path = out_dir / f"{level}-s{seed}.json"
            path.write_text(json.dumps(game, indent=1) + "\n")
            games.append(GameSpec(path=str(path), level=level, env="sciworld", split=split, seed=seed,
                                  max_score=100.0, expert_plan=tuple(plan)))
        return games
    finally:
        engine.close()


# --------------------------------------------------------------------------- env
def sanitize_action(action: str) -> str:
    action = "".join(c if c.isprintable() else " " for c in str(action))
    return " ".join(action.lower().split())[:MAX_ACTION_CHARS]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip("\t"))


def _sorted_listing(lines: list[str], depth: int) -> list[str]:
    """Lines of one listing level sorted, each item kept with the deeper lines under it."""
    items: list[list[str]] = []
    for line in lines:
        if _indent(line) <= depth or not items:
            items.append([line])
        else:
            items[-1].append(line)
    return [line for item in sorted(([head, *_sorted_listing(rest, depth + 1)] for head, *rest in items))
            for line in item]


def clean_observation(text: str) -> str:
    """Trailing spaces off, and each tab-indented listing sorted (an item with the lines under it):
    the simulator lists things of the same name in an order that changes from reset to reset."""
    lines = [line.rstrip() for line in text.replace("\r", "").strip().split("\n")]
    out: list[str] = []
    for listing, run in groupby(lines, key=lambda line: line.startswith("\t")):
        out += _sorted_listing(list(run), 1) if listing else list(run)
    return "\n".join(out)


class SciWorldEnv:
    """Plays ScienceWorld game files one at a time on one simulator (JVM)."""

    def __init__(self) -> None:
        self._engine = start_engine()
        self._loaded: tuple | None = None
        self._obs: Observation | None = None

    def _observation(self, text: str, score: float, done: bool) -> Observation:
        won = score >= 100
        plan = self._game["expert_plan"]
        rest = tuple(plan[len(self._taken):]) if self._taken == plan[: len(self._taken)] and not done else ()
        return Observation(text=clean_observation(text), objective=self._objective,
                           admissible_commands=self._admissible, score=score, max_score=100.0,
                           won=won, lost=done and not won, expert_action=rest[0] if rest else None,
                           expert_plan=rest)

    def reset(self, game: GameSpec) -> Observation:
        self._game = json.loads(Path(game.path).read_text())
        key = (self._game["task"], self._game["variation"], self._game["simplification"])
        if key != self._loaded:
            self._loaded = None
            self._engine.load(*key, generateGoldPath=False)
            self._objective = self._engine.get_task_description().strip()
            self._loaded = key
        text = restart(self._engine)
        self._admissible = tuple(self._game["admissible_commands"])
        self._taken, self._done = [], False
        # the start's own "look around" can already score (8 of find-non-living-thing variation 0):
        # from 0 here, the first action was credited with those points, whatever it was
        self._obs = self._observation(text, float(current_score(self._engine)), False)
        return self._obs

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        if self._obs is None:
            raise RuntimeError("step() before reset()")
        command = sanitize_action(action)
        invalid = command not in self._admissible
        if self._done or not command:
            return self._obs, 0.0, self._done, {"invalid": True, "action": command}
        before = self._obs.score
        text, score, self._done, understood = play(self._engine, command)
        self._taken.append(command)
        self._obs = self._observation(text, float(score), self._done)
        return self._obs, self._obs.score - before, self._done, {"invalid": invalid or not understood, "action": command}

    def close(self) -> None:
        self._engine.close()
        self._loaded = self._obs = None


def make_env(options: dict) -> SciWorldEnv:
    if options:
        raise ValueError(f"unknown ScienceWorld env options {sorted(options)} (it takes none)")
    return SciWorldEnv()
