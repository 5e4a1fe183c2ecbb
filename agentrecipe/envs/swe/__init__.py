"""SWE tasks: fix a planted bug in a real Python package; reward = share of its tests that pass.

The env family contract (see ``agentrecipe/envs/registry.py``):

- ``check_level(name)``: ``KIND-fN`` (tasks.py: mutation kind or ``any``, N files to fix);
- ``build_games(level, split, seeds, out_dir, options)``: SWE-smith style generation
  (tasks.py) from the pinned sdists of ``options["packages"]`` (packages.py), which are
  fetched once into ``options["cache_dir"]`` (default: ``_packages/`` beside the level
  folders, i.e. inside the build's output);
- ``make_env(options)``: an ``SWEEnv`` (env.py); tests run only in the sandbox (sandbox.py).

Options (``env.swe`` in params, all optional): see ``DEFAULTS``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from agentrecipe.envs.base import GameSpec

WHOLE_SPLITS = True
"""A task depends on the split's other seeds (a bug a lower seed took is skipped): one build job per
split. Batches in worker processes gave seed s another task depending on the batch it was built in,
and duplicate tasks across batches (10 test seeds, 6 distinct tasks, measured)."""

DEFAULTS: dict[str, Any] = {
    "packages": ["toolz==1.0.0", "inflection==0.5.1"],  # NAME==VERSION, fetched as sdists (pip download)
    "cache_dir": "",  # sdists + unpacked packages + baseline runs; empty: <build output>/_packages
    "p2p": 6,  # PASS_TO_PASS tests sampled per task
    "max_tries": 40,  # mutations validated per task before the build gives up
    "window": 15,  # lines `open` shows
    "max_obs_chars": 1500,  # observations are cut to this many characters
    "candidate_edits": 4,  # edits offered among the admissible commands (fix + distractors)
    "timeout": 30.0,  # run_tests: wall seconds (and CPU seconds) before the sandbox kills the run
    "build_timeout": 20.0,  # the same for one validation run at build time
    "memory_mb": 2048,  # run_tests: address-space limit
    "nproc": 64,  # run_tests: processes a run may add
    "max_output": 200000,  # run_tests: bytes of output kept before the run is killed
}


# What an episode shows and how its test runs are limited; the rest build the tasks (or, cache_dir,
# name a folder of this machine).
PLAY_OPTIONS = ("window", "max_obs_chars", "candidate_edits", "timeout", "memory_mb", "nproc", "max_output")


def options_of(options: Any) -> dict[str, Any]:
    """`options` (the env.swe dict, or an EnvConfig) merged over DEFAULTS; unknown keys and bad pins refused."""
    from agentrecipe.envs.swe.packages import parse_spec

    if options is None:
        options = {}
    elif hasattr(options, "swe") and not isinstance(options, Mapping):
        options = options.swe
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"env.swe: unknown option(s) {unknown}; known: {sorted(DEFAULTS)}")
    opts = {**DEFAULTS, **dict(options)}
    if not isinstance(opts["packages"], list) or not opts["packages"]:
        raise ValueError("env.swe.packages: needs a list of NAME==VERSION pins")
    for spec in opts["packages"]:
        parse_spec(spec)
    for key in ("p2p", "max_tries", "window", "max_obs_chars", "candidate_edits", "nproc", "max_output", "memory_mb"):
        if not isinstance(opts[key], int) or isinstance(opts[key], bool) or opts[key] < (0 if key in ("p2p", "candidate_edits") else 1):
            raise ValueError(f"env.swe.{key}: expected a positive integer, got {opts[key]!r}")
    for key in ("timeout", "build_timeout"):
        if not isinstance(opts[key], (int, float)) or isinstance(opts[key], bool) or opts[key] <= 0:
            raise ValueError(f"env.swe.{key}: expected seconds > 0, got {opts[key]!r}")
    return opts


def check_level(name: str) -> None:
    from agentrecipe.envs.swe.tasks import parse_level

    parse_level(name)


def build_games(level: str, split: str, seeds, out_dir, options: Any = None) -> list[GameSpec]:
    from agentrecipe.envs.swe import tasks

    opts = options_of(options)
    out_dir = Path(out_dir)
    cache = Path(opts["cache_dir"]) if opts["cache_dir"] else out_dir.resolve().parents[1] / "_packages"
    return tasks.build_games(level, split, list(seeds), out_dir, opts, cache)


def make_env(options: Any = None):
    from agentrecipe.envs.swe.env import SWEEnv

    return SWEEnv(options_of(options))


__all__ = ["DEFAULTS", "build_games", "check_level", "make_env", "options_of"]
