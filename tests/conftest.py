"""Shared fixtures. Games are built once per session into a temporary folder."""

from __future__ import annotations

import pytest

TW_LEVELS = {"custom": "w2-o3-q2", "simple": "simple-dense-detailed", "cooking": "cooking-r1-t1-g1"}


@pytest.fixture(scope="session")
def tw_games(tmp_path_factory) -> dict:
    """One small TextWorld game of each level kind: {"custom" | "simple" | "cooking": GameSpec}."""
    from agentrecipe.envs.textworld_env import build_games

    root = tmp_path_factory.mktemp("tw_games")
    return {kind: build_games(level, "test", [7], root / kind, {})[0] for kind, level in TW_LEVELS.items()}
