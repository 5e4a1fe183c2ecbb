"""Where this process stands under a launcher (torchrun / deepspeed): read once, here.

Launchers set RANK and WORLD_SIZE; a plain `python -m stages.X` is rank 0 of 1.
"""

from __future__ import annotations

import os


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_rank0() -> bool:
    return rank() == 0
