"""The games manifest: one JSON line per game, written by the curriculum build.

Every later stage finds its games through the manifest, never by listing
folders. Rows are sorted (level, split, seed) so the same params give a
byte-identical file. Paths are relative to the manifest's folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from agentrecipe.envs.base import GameSpec

SPLITS = ("train", "valid", "test")
MANIFEST_NAME = "manifest.jsonl"
"""The manifest's file name in a games folder (build_envs' output)."""
REQUIRED = ("path", "level", "env", "split", "seed", "max_score")
"""The fields every manifest row must have (`expert_plan` may be null: no known plan)."""


def game_to_row(game: GameSpec, root: Path) -> dict:
    row = asdict(game)
    try:  # a linked game (env.alfworld.link) stays where it was put: not resolved into the official data
        rel = Path(os.path.abspath(game.path)).relative_to(os.path.abspath(root))
    except ValueError:
        rel = Path(game.path).resolve().relative_to(Path(root).resolve())
    row["path"] = str(rel)
    row["expert_plan"] = list(game.expert_plan)
    row["plan_len"] = len(game.expert_plan)
    return row


def write_manifest(games: list[GameSpec], path: str | Path) -> Path:
    path = Path(path)
    rows = [game_to_row(g, path.parent) for g in games]
    rows.sort(key=lambda r: (r["level"], SPLITS.index(r["split"]), r["seed"]))
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return path


def read_manifest(path: str | Path, split: str | None = None, levels: list[str] | None = None) -> list[GameSpec]:
    """Games of the manifest (its file, or the games folder holding it), optionally only one split
    and some levels; paths made absolute."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    if not path.exists():
        raise FileNotFoundError(f"{path}: games manifest not found (run the build_envs stage first)")
    games = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: corrupt manifest row: {e}") from None
        missing = [k for k in REQUIRED if k not in row]
        unknown = sorted(set(row) - set(GameSpec.__dataclass_fields__) - {"plan_len"})
        if missing or unknown:  # a hand-edited or foreign row: never a default (max_score 1.0 would
            # scale a ScienceWorld game's dense reward 100 times)
            raise ValueError(f"{path}:{n}: manifest row " + "; ".join(
                ([f"lacks {', '.join(missing)}"] if missing else []) + ([f"has unknown {', '.join(unknown)}"] if unknown else []))
                + " (build_envs writes every field: rebuild the games)")
        row.pop("plan_len", None)
        row["path"] = str(path.parent / row["path"])
        row["expert_plan"] = tuple(row.get("expert_plan") or ())  # null: no known plan
        game = GameSpec(**row)
        if (split is None or game.split == split) and (levels is None or game.level in levels):
            games.append(game)
    return games
