"""DeepSpeed engine set-up: a killed extension build never hangs a later start."""

import os
import time

from agentrecipe.train.engine import clear_stale_build_locks


def test_stale_extension_build_locks_are_removed_fresh_ones_kept(tmp_path):
    stale = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    fresh = tmp_path / "py311_cpu" / "other_op" / "lock"
    for lock in (stale, fresh):
        lock.parent.mkdir(parents=True)
        lock.touch()
    old = time.time() - 3600
    os.utime(stale, (old, old))
    assert clear_stale_build_locks(tmp_path, max_age=900) == [stale]
    assert not stale.exists() and fresh.exists()  # a build in progress keeps its lock
