"""`agentrecipe check-envs`: does every installed environment family still behave?

For each family and each of its check levels (`CHECK_LEVELS`, small and quick ones) it builds
a few test games, replays each game's expert plan (every one must win), resets each game twice
and compares the two first observations (determinism), and times the steps. A changed
environment package shows up here: AgentGym issue 41 saw ALFWorld success fall to 0.09 after
an alfworld upgrade, silently.

    rows = check_families(["babyai"], games=2)
    print(format_table(rows)); ok = all(r.ok for r in rows)
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from agentrecipe.envs import registry

CHECK_LEVELS: dict[str, tuple[str, ...]] = {
    "textworld": ("w1-o2-q1", "simple-dense-detailed"),
    "alfworld": ("pick_and_place_simple-r4-d1",),
    "babyai": ("GoToRedBall", "PickupLoc"),
    "sciworld": ("find-non-living-thing",),
    "textcraft": ("depth1", "depth2"),
    "swe": ("op-f1",),
}
"""Levels each family is checked on; families missing here are not checked."""
REQUIRES: dict[str, tuple[str, ...]] = {
    "textworld": ("textworld",),
    "alfworld": ("alfworld", "fast_downward"),
    "babyai": ("minigrid",),
    "sciworld": ("scienceworld",),
    "textcraft": ("textcraft",),
    "swe": ("pytest",),
}
"""Packages a family needs: a family whose packages are missing is reported as not installed."""
PROGRAMS: dict[str, tuple[str, ...]] = {"sciworld": ("java",)}
"""Programs on PATH a family needs (ScienceWorld: a Java runtime, Debian openjdk-17-jre-headless)."""
FIRST_SEED = 1


@dataclass
class LevelCheck:
    family: str
    level: str
    games: int = 0
    expert_wins: int = 0
    deterministic: int = 0
    """Games whose two resets gave the same observation."""
    steps: int = 0
    step_seconds: float = 0.0
    build_seconds: float = 0.0
    error: str = ""
    skipped: str = ""
    """Why the family was not checked (its packages are not installed)."""
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.skipped) or (not self.error and self.games > 0 and self.expert_wins == self.games
                                      and self.deterministic == self.games)

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.step_seconds if self.step_seconds > 0 else 0.0


def missing(family: str) -> list[str]:
    """What the family needs and this machine lacks (packages, programs); [] when it is installed."""
    return ([p for p in REQUIRES.get(family, ()) if importlib.util.find_spec(p) is None]
            + [p for p in PROGRAMS.get(family, ()) if shutil.which(p) is None])


def resolve(families: list[str] | None, levels: list[str] | None = None) -> dict[str, tuple[str, ...]]:
    """{family: levels} to check; ValueError naming the known ones for an unknown family or level,
    before anything is built. Default: every family with check levels."""
    names = families or list(CHECK_LEVELS)
    for name in names:
        if name not in registry.FAMILIES or name not in CHECK_LEVELS:
            raise ValueError(f"unknown environment {name!r} for check-envs; known: {', '.join(CHECK_LEVELS)}")
    if levels:
        if len(names) != 1:
            raise ValueError("check-envs: --levels needs exactly one --env")
        family = registry.get_family(names[0])
        for level in levels:
            family.check_level(level)  # ValueError listing the family's levels
    return {name: tuple(levels) if levels else CHECK_LEVELS[name] for name in names}


def check_level(family_name: str, level: str, n_games: int, root: Path) -> LevelCheck:
    """Build n_games test games of one level, replay their experts, reset each twice."""
    row = LevelCheck(family_name, level)
    family = registry.get_family(family_name)
    try:
        start = time.perf_counter()
        games = family.build_games(level, "test", list(range(FIRST_SEED, FIRST_SEED + n_games)), root / level, {})
        row.build_seconds = time.perf_counter() - start
        row.games = len(games)
        env = family.make_env({})
        try:
            for game in games:
                first = env.reset(game)
                obs = first
                for action in game.expert_plan:
                    start = time.perf_counter()
                    obs, _, done, _ = env.step(action)
                    row.step_seconds += time.perf_counter() - start
                    row.steps += 1
                    if done:
                        break
                row.expert_wins += bool(obs.won)
                if not obs.won:
                    row.failures.append(f"{Path(game.path).name}: expert plan did not win ({obs.text[-120:]!r})")
                again = env.reset(game)
                row.deterministic += again == first
                if again != first:  # text, objective, admissible commands, score, expert's next action, ...
                    row.failures.append(f"{Path(game.path).name}: a second reset gave another observation")
        finally:
            env.close()
    except Exception as e:  # noqa: BLE001 - reported in the table, the command exits non-zero
        row.error = f"{type(e).__name__}: {e}"
    return row


def check_families(families: list[str] | None = None, games: int = 2, levels: list[str] | None = None,
                   progress=None) -> list[LevelCheck]:
    plan = resolve(families, levels)
    rows = []
    with tempfile.TemporaryDirectory(prefix="check-envs-") as tmp:
        for name, names in plan.items():
            if missing(name):
                why = f"not installed (no {', '.join(missing(name))})"
                # asked for by name: a failure; otherwise skipped
                rows.append(LevelCheck(name, "-", error=why) if families else LevelCheck(name, "-", skipped=why))
                continue
            for level in names:
                rows.append(check_level(name, level, games, Path(tmp) / name))
                if progress:
                    progress(rows[-1])
    return rows


def format_table(rows: list[LevelCheck]) -> str:
    lines = ["| family | level | games | expert wins | deterministic | build s/game | steps/s | status |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.skipped:
            lines.append(f"| {r.family} | - | - | - | - | - | - | skipped: {r.skipped} |")
            continue
        status = "ok" if r.ok else "FAIL" + (f": {r.error}" if r.error else "")
        per_game = r.build_seconds / r.games if r.games else 0.0
        lines.append(f"| {r.family} | {r.level} | {r.games} | {r.expert_wins}/{r.games} | {r.deterministic}/{r.games} "
                     f"| {per_game:.2f} | {r.steps_per_second:.0f} | {status} |")
    for r in rows:
        lines += [f"  {r.family} {r.level}: {f}" for f in r.failures]
    return "\n".join(lines)
