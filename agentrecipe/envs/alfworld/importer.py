"""Import the official ALFWorld games when they are on disk.

The official data (``alfworld-download``) is laid out as
``<root>/json_2.1.1/{train,valid_seen,valid_unseen}/<task>-<obj>-<mrecep>-<parent>-<scene>/<trial>/``
with ``game.tw-pddl`` and ``traj_data.json`` in each trial folder. Games are
listed in sorted path order and filtered as ``AlfredTWEnv`` does (solvable,
no movable-receptacle or sliced tasks, the wanted task types), so the same data
and params always give the same games.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from agentrecipe.envs.alfworld.scene import TASK_TYPES

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


def list_games(split_dir: Path, task: str) -> list[Path]:
    """Trial folders of one official split, sorted, filtered like AlfredTWEnv.collect_game_files."""
    wanted = set(TASK_TYPES) if task == "any" else {task}
    games = []
    for traj_path in sorted(split_dir.glob("*/*/traj_data.json")):
        folder = traj_path.parent
        game_path = folder / "game.tw-pddl"
        if "movable" in str(folder) or "Sliced" in str(folder) or not game_path.exists():
            continue
        if json.loads(traj_path.read_text()).get("task_type") not in wanted:
            continue
        if not json.loads(game_path.read_text()).get("solvable"):
            continue
        games.append(folder)
    return games


def import_games(root: Path, official_split: str, task: str, n: int, out_dir: Path, link: bool = False) -> list[tuple[Path, list[str]]]:
    """Copy (or symlink) the first `n` games of a split under `out_dir`; returns (game file, walkthrough)."""
    split_dir = root / official_split
    if not split_dir.is_dir():
        raise FileNotFoundError(f"{split_dir}: official split {official_split!r} not found")
    out = []
    for folder in list_games(split_dir, task)[:n]:
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
