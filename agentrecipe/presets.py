"""Sweep presets: params/sweep/<preset>.yaml, read by the sweep flow and `agentrecipe finding-page`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

PRESET_DIR = "params/sweep"


def load_preset(project: Path, preset: str) -> dict[str, Any]:
    """params/sweep/<preset>.yaml: {description, sweeps: [[override, ...], ...]}, and for a finding
    `paper`, what the papers report (its docs/results page quotes it)."""
    path = project / PRESET_DIR / f"{preset}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in (project / PRESET_DIR).glob("*.yaml")))
        raise ValueError(f"unknown sweep preset {preset!r}; presets in {PRESET_DIR}/: {known or 'none'}")
    data = yaml.safe_load(path.read_text()) or {}
    sweeps = data.get("sweeps")
    if set(data) - {"description", "paper", "sweeps"} or "description" not in data or not sweeps or not all(isinstance(s, list) for s in sweeps):
        raise ValueError(f"{path}: expected `description`, `sweeps` (a list of lists of overrides) and optionally `paper`")
    return data
