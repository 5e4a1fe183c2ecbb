"""A real `prefect server start` (what `make ui` runs) answers, records a flow run and stops cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_prefect_server_runs_a_flow_and_stops():
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
    env.pop("PREFECT_API_URL", None)  # the check points its flow at the server it starts
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "prefect_server_check.py"), "--timeout", "120"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "COMPLETED" in res.stdout and "server stopped" in res.stdout and res.stdout.rstrip().endswith("OK")
