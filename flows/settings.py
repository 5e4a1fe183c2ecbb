"""The environment of every Prefect and DVC process of the flows: Prefect's state inside the project,
telemetry off. Its own module, imported by the package's __init__ without importing flows.serve (which
`python -m flows.serve` runs as __main__)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_TELEMETRY = {"DO_NOT_TRACK": "1", "DVC_NO_ANALYTICS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
"""Every process the flows start sends nothing home (the Makefile exports the same for `make`)."""
# Measured on these machines (shared/NOTES.md): a busy machine needs more than the default 20 s.
PREFECT_ENV = {**NO_TELEMETRY, "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90"}


def prefect_env(prefect_home: str | Path | None = None) -> dict[str, str]:
    """os.environ plus the settings every Prefect process of this project uses."""
    env = dict(os.environ)
    for key, value in PREFECT_ENV.items():
        env.setdefault(key, value)
    if prefect_home is not None:
        env["PREFECT_HOME"] = str(prefect_home)
    env.setdefault("PREFECT_HOME", str(ROOT / ".prefect"))
    return env
