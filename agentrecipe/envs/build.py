"""The curriculum build: every level's train / valid / test games, checked, plus a manifest.

Game i of split S uses seed ``seed_S + i``, the test split's shifted by ``test_draw``
draws of n_test (`EnvConfig.split_seeds`; EnvConfig keeps the three ranges apart);
ood levels get test games only. Games go to ``out_dir/<level>/<split>/`` and are made
by `env_cfg.workers` processes, each building a batch of games (one interpreter start
per batch, not per game). Every expert plan is replayed and must win its game: a game whose
plan does not win (a generator defect: TextWorld made w4-o6-q8 test seed 60 with a walkthrough
whose last object the parser cannot see) is left out of the manifest with a warning naming it,
its files removed, and the build fails only when a level's split is left with no game. A split's
folder is emptied before its games are built, so it holds the manifest's games of that split and
no others (a folder evaluation, `games_from_folder`, plays every game file it finds); the folders
of levels and splits an earlier build into the same place had and this one has not stay (under
DVC, which empties the stage's output first, there are none).
"""

from __future__ import annotations

import importlib
import itertools
import multiprocessing as mp
import shutil
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
import warnings
from pathlib import Path

from tqdm import tqdm

from agentrecipe.config import EnvConfig
from agentrecipe.envs import registry
from agentrecipe.envs.base import GameSpec
from agentrecipe.envs.manifest import MANIFEST_NAME, SPLITS, write_manifest
from agentrecipe.envs.pool import main_module_hidden

Job = tuple[str, str, str, list[int], str, dict]  # family module, level, split, seeds, folder, options


def check_plan(env, game: GameSpec) -> None:
    """Replay the expert plan; RuntimeError naming the game unless it wins at its last step."""
    obs = env.reset(game)
    for i, action in enumerate(game.expert_plan):
        obs, _, done, _ = env.step(action)
        if done and i < len(game.expert_plan) - 1:
            break
    if not obs.won:
        raise RuntimeError(
            f"expert plan does not win {game.path} (level {game.level}, {game.split} seed {game.seed}): "
            f"{' > '.join(game.expert_plan)}; the game says: {obs.text[-200:]!r}"
        )


def game_files(game: GameSpec, split_folder: str | Path) -> list[Path]:
    """The files of a game built into `split_folder`: ``<level>-s<seed>.*`` beside its path
    (TextWorld, BabyAI, ScienceWorld, TextCraft), else the folder of its own its file lies in (an
    SWE task folder, an ALFWorld trial folder), else its path alone."""
    path = Path(game.path)
    if path.stem == f"{game.level}-s{game.seed}":
        return sorted(path.parent.glob(f"{path.stem}.*"))
    return [path] if path.parent.resolve() == Path(split_folder).resolve() else [path.parent]


def build_batch(job: Job) -> tuple[list[GameSpec], list[str]]:
    """Build one batch of games of one level and split and check their plans (runs in a worker):
    (the games whose plan wins, why each other game was left out; their files are removed)."""
    module, level, split, seeds, folder, options = job
    family = importlib.import_module(module)
    games = family.build_games(level, split, seeds, folder, options)
    env = family.make_env(options)
    kept, left_out, dropped = [], [], []
    try:
        for game in games:
            try:
                check_plan(env, game)
                kept.append(game)
            except RuntimeError as e:
                left_out.append(str(e))
                dropped.append(game)
    finally:
        env.close()
    for path in (p for game in dropped for p in game_files(game, folder)):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    return kept, left_out


def wanted_splits(env_cfg: EnvConfig) -> list[tuple[str, str, list[int]]]:
    """(level, split, game seeds) of every split a run builds: each level's train, valid and test
    split, each out-of-domain level's test split."""
    seeds = env_cfg.split_seeds()
    return [*((level, split, list(seeds[split])) for level in env_cfg.levels for split in SPLITS),
            *((level, "test", list(seeds["test"])) for level in env_cfg.ood_levels)]


def plan_jobs(env_cfg: EnvConfig, out_dir: Path, options: dict) -> list[Job]:
    """Batches of seeds: about four per worker, so a slow level does not leave workers idle; one
    per split for a family whose games depend on their split's other seeds (registry: WHOLE_SPLITS)."""
    wanted = wanted_splits(env_cfg)
    total = sum(len(seeds) for *_, seeds in wanted)
    size = max(1, -(-total // (4 * env_cfg.workers)))
    if getattr(registry.get_family(env_cfg.name), "WHOLE_SPLITS", False):
        size = max([1] + [len(seeds) for *_, seeds in wanted])
    return [
        (registry.FAMILIES[env_cfg.name], level, split, seeds[i : i + size], str(out_dir / level / split), options)
        for level, split, seeds in wanted
        for i in range(0, len(seeds), size)
    ]


def _batches(workers: int, jobs: list[Job]):
    """Built batches as they finish; one worker builds in this process.

    A worker that dies (a game that kills its interpreter) fails the build with an error naming
    the batch it was building; multiprocessing.Pool would wait for that batch forever."""
    if workers == 1 or len(jobs) <= 1:
        yield from map(build_batch, jobs)
        return
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=mp.get_context("spawn")) as pool:
        with main_module_hidden():  # the workers start at the first submit
            futures = {pool.submit(build_batch, job): job for job in jobs}
        try:
            for future in as_completed(futures):
                try:
                    yield future.result()
                except BrokenProcessPool:
                    unfinished = [f"{job[1]} {job[2]} seeds {job[3][0]}..{job[3][-1]} ({job[4]})"
                                  for f, job in futures.items() if f.done() and f.exception() is not None]
                    raise RuntimeError("a build worker died (a game that crashes its interpreter? its output is "
                                       f"above); unfinished batches: {'; '.join(unfinished)}") from None
        finally:
            for future in futures:
                future.cancel()


def check_pools(env_cfg: EnvConfig, family, options: dict) -> None:
    """For a family whose games come from a finite pool, game `seed` being `pool[seed % len(pool)]`
    (`family.game_pool`; TextCraft goals, ScienceWorld variations, official ALFWorld games):
    - refuse a split larger than its pool (its builds run in batches, each sees only its own seeds);
    - refuse a valid or test game that another level or split of this run also draws (it would be
      trained on, or played and counted twice), and warn where two train splits share games;
    - warn where this run's test draw (env.test_draw, from `seed`) repeats games of the earlier
      draws, which the other seeds of a sweep were tested on."""
    if not hasattr(family, "game_pool"):
        return
    earlier_draws = range(env_cfg.seed_test, env_cfg.split_seeds()["test"].start)
    drawn: dict[tuple[str, str], set] = {}  # (level, split) -> the games it draws
    for level, split, seeds in wanted_splits(env_cfg):
        pool = family.game_pool(level, split, options) if seeds else None
        if pool is None:
            continue
        n = len(pool)
        if len(seeds) > n:
            raise ValueError(f"env.n_{split}: {len(seeds)} {split} games of {level} asked for; its "
                             f"{env_cfg.name} pool holds {n} (lower env.n_{split})")
        drawn[level, split] = {pool[s % n] for s in seeds}
        earlier = {pool[s % n] for s in earlier_draws} if split == "test" else set()
        if repeated := earlier & drawn[level, split]:
            warnings.warn(f"{level}: {len(repeated)} of the {len(seeds)} test games of env.test_draw "
                          f"{env_cfg.test_draw} are also in earlier draws (its pool holds {n}): the seeds of a "
                          "sweep share them, so a pooled interval across seeds counts them more than once",
                          stacklevel=2)
    for a, b in itertools.combinations(drawn, 2):
        if not (shared := drawn[a] & drawn[b]):
            continue
        what = f"{len(shared)} of the {' '.join(a)} games are also {' '.join(b)} games"
        if a[1] == b[1] == "train":
            warnings.warn(f"{what}: they are trained on more often than the others", stacklevel=2)
            continue
        raise ValueError(f"env.levels / env.ood_levels: {what}; a valid or test game must be neither trained on "
                         f"nor played twice: pick levels (or splits) that draw from different {env_cfg.name} pools "
                         f"(see {family.__name__}.game_pool)")


def build_curriculum(env_cfg: EnvConfig, out_dir: str | Path, progress: bool = True) -> list[GameSpec]:
    """Build all games of `env_cfg` under out_dir and write out_dir/manifest.jsonl."""
    out_dir = Path(out_dir)
    family = registry.get_family(env_cfg.name)
    for level in [*env_cfg.levels, *env_cfg.ood_levels]:
        family.check_level(level)  # fail before any game is made
    options = env_cfg.family_options
    check_pools(env_cfg, family, options)
    jobs = plan_jobs(env_cfg, out_dir, options)
    for folder in {Path(job[4]) for job in jobs}:  # an earlier build's games are not this build's
        shutil.rmtree(folder, ignore_errors=True)
    games: list[GameSpec] = []
    left_out: list[str] = []
    with tqdm(total=sum(len(job[3]) for job in jobs), desc="build games", unit="game", disable=not progress) as bar:
        for kept, dropped in _batches(env_cfg.workers, jobs):
            games.extend(kept)
            left_out.extend(dropped)
            bar.update(len(kept) + len(dropped))
    for why in sorted(left_out):
        warnings.warn(f"left out of the manifest: {why}", stacklevel=2)
    have = {(g.level, g.split) for g in games}
    if empty := sorted({(job[1], job[2]) for job in jobs} - have):
        raise RuntimeError("no playable game left in " + ", ".join(f"{lvl} {split}" for lvl, split in empty)
                           + ": " + "; ".join(sorted(left_out)))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(games, out_dir / MANIFEST_NAME)
    return sorted(games, key=lambda g: (g.level, SPLITS.index(g.split), g.seed))
