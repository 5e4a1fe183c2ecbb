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
  skip the bugs of lower seeds), so the build gives each (level, split) one job, never batches.

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
