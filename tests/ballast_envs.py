"""tests/fake_envs.py's family with 1 MiB of memory held by every open env, freed by close().

An env server that never closed its episodes' envs would grow by 1 MiB an episode
(1 GiB after the 1000 episodes of the memory test), far above its allocator noise.
"""

from __future__ import annotations

from fake_envs import FakeEnv, build_games, check_level  # noqa: F401  (the family contract)

BALLAST_BYTES = 1 << 20


class BallastEnv(FakeEnv):
    def __init__(self) -> None:
        self.ballast = bytearray(b"x" * BALLAST_BYTES)  # written, so its pages are resident

    def close(self) -> None:
        self.ballast = None


def make_env(options: dict) -> BallastEnv:
    return BallastEnv()
