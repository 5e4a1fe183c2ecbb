"""DeepSpeed engine set-up: a killed extension build never hangs a later start."""

import os
import subprocess
import sys
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


def test_engine_start_builds_no_torch_extension(tmp_path):
    """Starting DeepSpeed compiles nothing: its shared-memory inference all-reduce kernel (a minute of C++
    on a fresh machine) is never built, and gradients still reduce through torch.distributed."""
    code = ("from agentrecipe.train.engine import init_distributed\n"
            "import torch\n"
            "init_distributed()\n"
            "from deepspeed import comm\n"
            "t = torch.ones(3)\n"
            "comm.all_reduce(t)\n"
            "assert t.tolist() == [1.0, 1.0, 1.0]\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "extensions")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    built = sorted(p.name for p in (tmp_path / "extensions").glob("*/*")) if (tmp_path / "extensions").exists() else []
    assert built == [], f"DeepSpeed built extensions at start-up: {built}"
