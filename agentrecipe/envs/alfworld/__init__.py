"""ALFWorld: household tasks as text games (Shridhar et al., 2021).

The env family contract (see ``agentrecipe/envs/registry.py``):

- ``check_level(name)``: level names are ``<task>-rR-dD``: an ALFWorld task type
  (or ``any``: one drawn per game), R receptacles in the room, D distractor
  objects, e.g. ``pick_and_place_simple-r6-d2``, ``any-r8-d4``.
- ``build_games(level, split, seeds, out_dir, options)``: with the official data
  on disk (``options["data_dir"]`` or $ALFWORLD_DATA) import its games of the
  level's task type (importer.py); otherwise generate one game per seed from the
  floor plans shipped with alfworld (scene.py samples, pddl.py writes, the
  planner checks it is solvable; an unsolvable draw is resampled). Games go to
  ``out_dir/<task>-<object>-None-<parent>-<floor plan>/trial_*/`` as in ALFWorld's data.
- ``make_env(options)``: an ``AlfWorldEnv`` (env.py).

Options (``env.alfworld`` in params, all optional): see ``DEFAULTS``.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any, Mapping

from agentrecipe.envs.base import GameSpec

DEFAULTS: dict[str, Any] = {
    "floorplans": {"train": "seen", "valid": "seen", "test": "unseen"},
    # Generated games: floor plans each split draws from: seen (ALFRED's train rooms),
    # unseen (its test rooms), all, a list of numbers or "1-30,201-230".
    "expert": "handcoded",  # handcoded | planner | none: the expert Observation.expert_action follows
    "max_expert_steps": 200,  # the handcoded expert gives up after this many steps
    "max_plan_len": 60,  # generated games whose planner solution is longer are resampled
    "max_tries": 20,  # draws per seed before giving up on an unsolvable level
    "require_handcoded": True,  # keep only games the handcoded expert also wins within max_expert_steps
    # (the official data's `solvable` flag is the same check)
    "data_dir": "",  # official data root (holds json_2.1.1/); empty: $ALFWORLD_DATA, else generate
    "splits": {"train": "train", "valid": "valid_seen", "test": "valid_unseen"},  # our split -> official split
    "link": False,  # official games: symlink instead of copy
}


# The expert each observation's expert_action comes from (demonstrations, the expert baseline); the
# rest build or import the games.
PLAY_OPTIONS = ("expert", "max_expert_steps")


def options_of(options: Any) -> dict[str, Any]:
    """`options` (the env.alfworld dict, or an EnvConfig) merged over DEFAULTS; unknown keys refused."""
    if options is None:
        options = {}
    elif hasattr(options, "alfworld") and not isinstance(options, Mapping):
        options = options.alfworld
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"env.alfworld: unknown option(s) {unknown}; known: {sorted(DEFAULTS)}")
    opts = {**DEFAULTS, **dict(options)}
    for key in ("floorplans", "splits"):
        opts[key] = {**DEFAULTS[key], **dict(opts[key] or {})}
    # values too, here at the edge (before, a typo failed the build with a traceback naming no key)
    from agentrecipe.envs.alfworld.env import EXPERTS
    from agentrecipe.envs.alfworld.scene import parse_floorplans

    if opts["expert"] not in EXPERTS:
        raise ValueError(f"env.alfworld.expert: {opts['expert']!r} is not one of {', '.join(EXPERTS)}")
    for split, spec in opts["floorplans"].items():
        try:
            parse_floorplans(spec)
        except ValueError as e:
            raise ValueError(f"env.alfworld.floorplans.{split}: {e}") from None
    for key in ("max_expert_steps", "max_plan_len", "max_tries"):
        if not isinstance(opts[key], int) or isinstance(opts[key], bool) or opts[key] < 1:
            raise ValueError(f"env.alfworld.{key}: expected a positive integer, got {opts[key]!r}")
    return opts


def check_level(name: str) -> None:
    from agentrecipe.envs.alfworld.scene import parse_level

    parse_level(name)


def intermediate_reward(name: str) -> bool:
    """Dense ALFWorld reward is subgoal progress, which moves before the win on every level."""
    return True


def make_env(options: Any = None):
    from agentrecipe.envs.alfworld.env import AlfWorldEnv

    opts = options_of(options)
    return AlfWorldEnv(expert=opts["expert"], max_expert_steps=int(opts["max_expert_steps"]))


def game_pool(level: str, split: str, options: Any = None) -> tuple[Path, ...] | None:
    """With the official games: game `seed` is `pool[seed % len(pool)]` of the official split's games
    of the level's task type (their folders). R and D do not apply, so `any-r6-d3` and `any-r12-d8`
    draw the same pool, and `any`'s holds every task type's games. Generated games (no data_dir):
    None, every seed its own game."""
    from agentrecipe.envs.alfworld import importer

    opts = options_of(options)
    root = importer.find_data_root(opts["data_dir"])
    if root is None:
        return None
    split_dir = root / opts["splits"][split]
    if not split_dir.is_dir():
        raise FileNotFoundError(f"{split_dir}: official split {opts['splits'][split]!r} not found")
    return importer.game_order(split_dir, _parse(level)[0])


def build_games(level: str, split: str, seeds, out_dir, options: Any = None) -> list[GameSpec]:
    from agentrecipe.envs.alfworld import importer

    opts = options_of(options)
    task, _, _ = _parse(level)
    seeds = list(seeds)
    out_dir = Path(out_dir)
    root = importer.find_data_root(opts["data_dir"])
    if root is not None:
        # Official games of the level's task type (R and D do not apply), one per seed.
        found = importer.import_games(root, opts["splits"][split], task, seeds, out_dir, link=bool(opts["link"]))
        return [
            GameSpec(str(path), level, "alfworld", split, seed, 1.0, tuple(plan))
            for seed, (path, plan) in zip(seeds, found)
        ]
    return [generate_game(level, split, seed, out_dir, opts) for seed in seeds]


def generate_game(level: str, split: str, seed: int, out_dir: Path, opts: Mapping[str, Any]) -> GameSpec:
    """One solvable game for (level, seed), written under out_dir; deterministic."""
    from agentrecipe.envs.alfworld import pddl
    from agentrecipe.envs.alfworld.scene import sample_scene, select_floorplans

    task, n_recep, n_distr = _parse(level)
    floorplans = select_floorplans(opts["floorplans"][split])
    max_plan_len = int(opts["max_plan_len"])
    for attempt in range(int(opts["max_tries"])):
        scene = sample_scene(task, n_recep, n_distr, seed, floorplans, rng=random.Random(f"alfworld/{level}/{seed}/{attempt}"))
        game, traj = pddl.make_game(scene, level)
        plan = pddl.solve(game, max_plan_len=max_plan_len)
        if plan is None:
            continue
        game["solvable"], game["walkthrough"] = True, plan
        traj["generator"]["attempt"] = attempt
        if opts["require_handcoded"]:
            with tempfile.TemporaryDirectory() as tmp:
                spec = GameSpec(str(pddl.write_game(Path(tmp), game, traj)), level, "alfworld", split, seed)
                if expert_steps(spec, "handcoded", int(opts["max_expert_steps"])) is None:
                    continue
        path = pddl.write_game(out_dir / pddl.game_dirname(scene), game, traj)
        return GameSpec(str(path), level, "alfworld", split, seed, 1.0, tuple(plan))
    raise RuntimeError(f"ALFWorld level {level}: no solvable game in {opts['max_tries']} draws for seed {seed}")


_verifiers: dict = {}


def expert_steps(game: GameSpec, expert: str, max_steps: int) -> int | None:
    """Steps the expert takes to win `game` by following its own next action, or None if it fails."""
    from agentrecipe.envs.alfworld.env import AlfWorldEnv

    if (expert, max_steps) not in _verifiers:
        _verifiers[expert, max_steps] = AlfWorldEnv(expert=expert, max_expert_steps=max_steps)
    env = _verifiers[expert, max_steps]
    obs = env.reset(game)
    for n in range(1, max_steps + 1):
        if obs.expert_action is None:
            return None
        obs, _, done, _ = env.step(obs.expert_action)
        if done:
            env.forget()
            return n
    env.forget()
    return None


def _parse(level: str) -> tuple[str, int, int]:
    from agentrecipe.envs.alfworld.scene import parse_level

    return parse_level(level)


__all__ = ["DEFAULTS", "build_games", "check_level", "game_pool", "make_env", "options_of"]
