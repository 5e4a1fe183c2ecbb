"""Environment families by name. Each family is a module exposing:

- ``check_level(name: str) -> None``: raise ValueError for a level it cannot build;
- ``build_games(level, split, seeds, out_dir, options) -> list[GameSpec]``:
  make (or import) the games of one level and split, in this process;
- ``make_env(options) -> Env``: an environment that can play its games;
- optionally ``game_pool(level, split, options) -> tuple | None``: where game ``seed`` of a level
  and split is game ``pool[seed % len(pool)]`` of a finite pool, that pool: one identity per game,
  equal wherever two levels or splits would draw the same game (build.check_pools refuses a split
  that repeats a game and a test or valid game that another level or split also draws);
- optionally ``level_key(name) -> str``: one name for level names that give the same games
  (``simple`` and ``simple-dense-detailed``), so config checks catch a level listed under two;
- optionally ``WHOLE_SPLITS = True``: a game depends on the other seeds of its split (SWE tasks
  skip the bugs of lower seeds), so the build gives each (level, split) one job, never batches;
- optionally ``PLAY_OPTIONS`` (the keys of ``options_of(options)``, its options merged over its
  defaults, that change the episodes ``make_env`` plays): a run and the env servers it plays
  through must agree on them (``play_options``; machine-local keys such as paths are not listed).

Modules are imported lazily, so TextWorld users never import ALFWorld.
"""

from __future__ import annotations

import importlib
from types import ModuleType

FAMILIES: dict[str, str] = {
    "textworld": "agentrecipe.envs.textworld_env",
    "alfworld": "agentrecipe.envs.alfworld",
    "babyai": "agentrecipe.envs.babyai",
    "sciworld": "agentrecipe.envs.sciworld",
    "textcraft": "agentrecipe.envs.textcraft",
    "swe": "agentrecipe.envs.swe",
}


def get_family(name: str) -> ModuleType:
    if name not in FAMILIES:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(sorted(FAMILIES))}")
    return importlib.import_module(FAMILIES[name])


def play_options(family: str, options: dict | None) -> dict:
    """The options of `family` that change its episodes (its PLAY_OPTIONS, with its defaults filled
    in), as a run or an env server would play them; {} for a family without such options."""
    module = get_family(family)
    keys = getattr(module, "PLAY_OPTIONS", ())
    if not keys:
        return {}
    merged = module.options_of(options or {})
    return {key: merged[key] for key in keys}


def option_differences(family: str, run: dict, served: dict) -> list[str]:
    """`env.<family>.<key>: this run X, the server Y` for each play option the two set apart."""
    return [f"env.{family}.{key}: this run {run.get(key)!r}, the server {served.get(key)!r}"
            for key in sorted(set(run) | set(served)) if run.get(key) != served.get(key)]
