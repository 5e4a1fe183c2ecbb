"""What ran: the facts a results table needs beside it to be reproducible.

`provenance(...)` gathers them as plain data; `provenance_section(...)` renders the
markdown the report puts under its tables: git revision, the params that differ from
the composed defaults, every seed, the budget (demonstrations and RL episodes), games
per level and split, and the wall time of each stage.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

SEED_KEYS = ("seed", "model.seed", "sft.seed", "rl.seed", "eval.seed", "env.seed_train", "env.seed_valid", "env.seed_test",
             "env.test_draw")


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists and scalars are leaves."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def params_diff(params: dict, defaults: dict) -> dict[str, tuple[Any, Any]]:
    """{key: (default, value)} for every leaf of `params` that differs from `defaults` (missing = None)."""
    p, d = flatten(params), flatten(defaults)
    return {k: (d.get(k), p.get(k)) for k in sorted(set(p) | set(d)) if p.get(k) != d.get(k)}


def git_revision(cwd: str | Path = ".") -> str:
    """`<sha>` of HEAD, with `+changes` when tracked files differ from it; `unknown` outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + (" +changes" if dirty else "")


def provenance_section(revision: str, diff: dict[str, tuple[Any, Any]], params: dict, budget: dict[str, int],
                       games: dict[str, dict[str, int]], timings: dict[str, float],
                       resumed: dict[str, str] | None = None) -> str:
    """Markdown: revision, changed params, seeds, budget, games per level and split, stage times
    (`resumed`: what a resumed stage's time holds of the runs before, by stage)."""
    flat = flatten(params)
    lines = ["## What ran\n", f"- git revision: `{revision}`"]
    lines.append("- budget: " + ", ".join(f"{k} {v}" for k, v in budget.items()))
    lines.append("- seeds: " + ", ".join(f"{k}={flat[k]}" for k in SEED_KEYS if k in flat))
    if diff:
        lines.append("- params that differ from the defaults of `params/`:\n")
        lines.append("  | key | default | this run |\n  |---|---|---|")
        lines += [f"  | `{k}` | {_short(d)} | {_short(v)} |" for k, (d, v) in diff.items()]
    else:
        lines.append("- params: the defaults of `params/` (no overrides)")
    if games:
        splits = sorted({s for per in games.values() for s in per}, key=("train", "valid", "test").index)
        lines.append("\n| level | " + " | ".join(f"{s} games" for s in splits) + " |")
        lines.append("|---|" + "---:|" * len(splits))
        lines += [f"| {lvl} | " + " | ".join(str(per.get(s, 0)) for s in splits) + " |" for lvl, per in games.items()]
    if timings:
        lines.append("\n| stage | wall time (s) |\n|---|---:|")
        lines += [f"| {stage} | {sec:.1f}{f' ({resumed[stage]})' if stage in (resumed or {}) else ''} |"
                  for stage, sec in timings.items()]
        lines.append("\n(Stages restored from DVC's cache keep the time of the run that made them.)")
    return "\n".join(lines) + "\n"


def _short(value: Any, width: int = 60) -> str:
    text = "–" if value is None else f"`{value}`"
    return text if len(text) <= width else text[: width - 2] + "…`"
