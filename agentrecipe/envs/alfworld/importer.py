"""Import the official ALFWorld games when they are on disk.

The official data (``alfworld-download``) is laid out as
``<root>/json_2.1.1/{train,valid_seen,valid_unseen}/<task>-<obj>-<mrecep>-<parent>-<scene>/<trial>/``
with ``game.tw-pddl`` and ``traj_data.json`` in each trial folder. Games are
listed in sorted path order and filtered as ``AlfredTWEnv`` does (solvable,
no movable-receptacle or sliced tasks, the wanted task types), then put in a
fixed shuffled order; seed s takes game ``s % N``. The same data and params
always give the same games, whatever the batching of seeds.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from agentrecipe.envs.alfworld.scene import TASK_TYPES
from agentrecipe.envs.base import GameSpec

OFFICIAL_SPLITS = ("train", "valid_seen", "valid_unseen")


def find_data_root(data_dir: str) -> Path | None:
    """The folder holding the official splits: `data_dir` (or $ALFWORLD_DATA) itself or its json_2.1.1/."""
    explicit = bool(data_dir)
    base = data_dir or os.environ.get("ALFWORLD_DATA", "")
    if not base:
        return None
    base_path = Path(os.path.expandvars(os.path.expanduser(base)))
    for cand in (base_path / "json_2.1.1", base_path):
        if any((cand / s).is_dir() for s in OFFICIAL_SPLITS):
            return cand
    if explicit:
        raise FileNotFoundError(
            f"alfworld.data_dir={data_dir!r} holds no official ALFWorld data "
            f"(expected json_2.1.1/{{{','.join(OFFICIAL_SPLITS)}}}/<task>/<trial>/game.tw-pddl); "
            "leave it empty to generate games"
        )
    return None  # $ALFWORLD_DATA set for other reasons (alfworld's cache) without the games


def list_games(split_dir: Path, task: str) -> Iterator[Path]:
    """Trial folders of one official split, in sorted order, filtered like AlfredTWEnv.collect_game_files."""
    wanted = set(TASK_TYPES) if task == "any" else {task}
    for traj_path in sorted(split_dir.glob("*/*/traj_data.json")):
        folder = traj_path.parent
        game_path = folder / "game.tw-pddl"
        if "movable" in str(folder) or "Sliced" in str(folder) or not game_path.exists():
            continue
        if folder.parent.name.split("-")[0] not in wanted:  # cheap check on the folder name first
            continue
        if json.loads(traj_path.read_text()).get("task_type") not in wanted:
            continue
        if not json.loads(game_path.read_text()).get("solvable"):
            continue
        yield folder


@lru_cache(maxsize=8)
def game_order(split_dir: Path, task: str) -> tuple[Path, ...]:
    """The split's games in a fixed shuffled order (sorted, then shuffled by a fixed seed), so
    a window of consecutive seeds draws across rooms and task types, not the first folders."""
    games = list(list_games(split_dir, task))
    random.Random(f"alfworld-import/{split_dir.name}/{task}").shuffle(games)
    return tuple(games)


def import_games(root: Path, official_split: str, task: str, seeds: list[int], out_dir: Path, link: bool = False) -> list[tuple[Path, list[str]]]:
    """Copy (or symlink) game ``seed % N`` of the split's N games for each seed under `out_dir`;
    returns (game file, walkthrough) per seed. A build's seeds are consecutive, so they get
    distinct games as long as there are at most N of them, however they are batched."""
    split_dir = root / official_split
    if not split_dir.is_dir():
        raise FileNotFoundError(f"{split_dir}: official split {official_split!r} not found")
    games = game_order(split_dir, task)
    if len(set(s % max(len(games), 1) for s in seeds)) < len(seeds) or not games:
        raise ValueError(f"{split_dir} holds {len(games)} {task} games; {len(seeds)} were asked for (lower env.n_*)")
    out = []
    for seed in seeds:
        folder = games[seed % len(games)]
        dest = out_dir / official_split / folder.relative_to(split_dir)
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("game.tw-pddl", "traj_data.json"):
            target = dest / name
            if target.is_symlink() or target.exists():
                target.unlink()
            if link:
                target.symlink_to((folder / name).resolve())
            else:
                shutil.copyfile(folder / name, target)
        walkthrough = json.loads((dest / "game.tw-pddl").read_text()).get("walkthrough") or []
        out.append((dest / "game.tw-pddl", list(walkthrough)))
    return out


def games_in_folder(folder: Path) -> list[GameSpec]:
    """Every ALFWorld game under `folder` (trial folders with ``game.tw-pddl``, at any depth: the
    official layout or a copy of part of it), as test games in sorted path order. The level is
    the task type from its traj_data.json (else from the task folder's name), the expert plan its
    walkthrough; games the official data marks unsolvable are left out."""
    games = []
    for path in sorted(Path(folder).rglob("game.tw-pddl")):
        data = json.loads(path.read_text())
        if data.get("solvable") is False:
            continue
        traj = path.with_name("traj_data.json")
        task = json.loads(traj.read_text()).get("task_type") if traj.exists() else None
        level = task or path.parent.parent.name.split("-")[0]
        games.append(GameSpec(str(path), level, "alfworld", "test", len(games), 1.0,
                              tuple(data.get("walkthrough") or ())))
    return games
