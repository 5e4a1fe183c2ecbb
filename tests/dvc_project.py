"""A git + DVC copy of this project for end-to-end tests (tracked and untracked files, not ignored)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def copy_project(dst: Path, env: dict) -> Path:
    """Copy the project's files into `dst` and commit them there; returns `dst`."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dst / f)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-qm", "project"]):
        subprocess.run(cmd, cwd=dst, env=env, capture_output=True, text=True, check=True, timeout=300)
    return dst
