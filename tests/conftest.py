"""Shared fixtures. Games are built once per session into a temporary folder."""

from __future__ import annotations

import os

import pytest

TW_LEVELS = {"custom": "w2-o3-q2", "quests": "w2-o3-q1-p2", "simple": "simple-dense-detailed", "cooking": "cooking-r1-t1-g1"}


@pytest.fixture(scope="session")
def tw_games(tmp_path_factory) -> dict:
    """One small TextWorld game of each level kind: {"custom" | "quests" | "simple" | "cooking": GameSpec}."""
    from agentrecipe.envs.textworld_env import build_games

    root = tmp_path_factory.mktemp("tw_games")
    return {kind: build_games(level, "test", [7], root / kind, {})[0] for kind, level in TW_LEVELS.items()}


def pytest_configure(config) -> None:
    """Under pytest-xdist each worker gets its share of the cores for torch (oversubscribed OpenMP
    threads spin); stage subprocesses get one thread each (`subprocess_env`)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))


def pytest_collection_modifyitems(items) -> None:
    """Modules with slow tests first, each module kept whole (its module-scoped fixtures are built
    once), the order otherwise unchanged: pytest-xdist hands tests out in collection order, so the
    minutes-long DAG runs start early on both workers and the short tests fill in behind them,
    instead of one worker finishing a DAG run alone at the end."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


def pytest_collection_finish(session) -> None:
    """What collection imported (torch, transformers, the test modules) lives for the whole session:
    frozen (`gc.freeze`), Python's collector no longer scans it at each full collection (the stages
    do the same, stages/__init__.py; about 5% of the in-process tests' CPU)."""
    import gc

    gc.freeze()


DISTRIBUTED_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def subprocess_env() -> dict:
    """Environment for stage subprocesses: without the torch.distributed variables that an in-process
    DeepSpeed engine of an earlier test left behind (the child would try to bind the same MASTER_PORT)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    env.update(PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}", AGENTRECIPE_THREADS="1",
               DVC_NO_ANALYTICS="1", TORCH_EXTENSIONS_DIR=str(root / ".cache" / "torch_extensions"))
    return env
