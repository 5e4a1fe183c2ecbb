"""Readable transcripts: one evaluation episode from transcripts.jsonl as plain text.

A record is what `agentrecipe.eval.evaluate` writes per shown episode: policy, level, game,
mode, won, score, and `transcript`, a list of {"role": "user", "text", "admissible"} and
{"role": "assistant", "text", "invalid"} turns.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path


def read_transcripts(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the evaluate stage (or `agentrecipe evaluate`) first")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def select(records: list[dict], policy: str | None = None, level: str | None = None) -> list[dict]:
    return [r for r in records if (policy is None or r.get("policy") == policy)
            and (level is None or r.get("level") == level)]


def format_transcript(record: dict, width: int = 100, max_admissible: int = 12) -> str:
    """Header line, then each turn: the observation indented, the admissible commands (cut to
    `max_admissible`), and the agent's action marked `!` when it was invalid."""
    outcome = "won" if record.get("won") else "not won"
    lines = [f"{record.get('policy')} on {record.get('level')} ({record.get('mode', 'greedy')}): {outcome}, "
             f"score {record.get('score')}  [{record.get('game')}]"]
    turn = 0
    for row in record.get("transcript", []):
        if row["role"] == "user":
            lines.append(f"--- turn {turn}")
            lines += textwrap.wrap(row.get("text") or "(empty)", width, initial_indent="  ", subsequent_indent="  ")
            cmds = list(row.get("admissible") or [])
            if cmds:
                more = f" (+{len(cmds) - max_admissible} more)" if len(cmds) > max_admissible else ""
                lines += textwrap.wrap("admissible: " + ", ".join(cmds[:max_admissible]) + more, width,
                                       initial_indent="  ", subsequent_indent="    ")
        else:
            mark = "!" if row.get("invalid") else ">"
            lines.append(f"{mark} {row.get('text') if row.get('text') is not None else '(malformed reply)'}")
            turn += 1
    return "\n".join(lines)
