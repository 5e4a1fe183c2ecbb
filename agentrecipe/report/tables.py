"""Markdown tables from evaluation metrics ({policy: {level: cell}}, see `agentrecipe.eval.metrics`),
and the report page that puts them together with the figures."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

NA = "–"


def pct(x: float | None) -> str:
    """A fraction as a percent with one decimal, halves rounded up from the fraction's decimal text
    (1/80 -> '1.3', 63/80 -> '78.8'; float formatting gives '1.2' and '78.8'); '–' for None or nan."""
    if x is None or math.isnan(x):
        return NA
    return str((Decimal(repr(float(x))) * 100).quantize(Decimal("0.1"), ROUND_HALF_UP))


def _num(x, digits: int = 2) -> str:
    return NA if x is None else f"{x:.{digits}f}"


def _table(header: list[str], rows: list[list[str]], text_cols: int = 1) -> str:
    """A markdown table; the first `text_cols` columns align left, the numbers right."""
    rule = "|" + "|".join("---" if i < text_cols else "---:" for i in range(len(header))) + "|"
    lines = ["| " + " | ".join(header) + " |", rule]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def levels_of(metrics: dict) -> list[str]:
    """Every level (and pooled group) in first-seen order across policies."""
    return list(dict.fromkeys(lvl for cells in metrics.values() for lvl in cells))


def pass_keys(metrics: dict) -> list[str]:
    keys = {k for cells in metrics.values() for cell in cells.values() for k in cell if k.startswith("pass@")}
    return sorted(keys, key=lambda k: int(k.split("@")[1]))


def success_cell(cell: dict | None) -> str:
    """'45.0 [28.1, 63.1]': success % with its 95% Wilson interval."""
    if not cell or cell.get("success") is None:
        return NA
    return f"{pct(cell['success'])} [{pct(cell['success_ci_low'])}, {pct(cell['success_ci_high'])}]"


def success_table(metrics: dict, levels: list[str] | None = None) -> str:
    """Policies x levels: greedy success % [95% CI]."""
    levels = levels or levels_of(metrics)
    rows = [[policy] + [success_cell(cells.get(lvl)) for lvl in levels] for policy, cells in metrics.items()]
    return _table(["policy"] + levels, rows)


def results_table(metrics: dict, levels: list[str] | None = None) -> str:
    """One row per level and policy: success % [95% CI], score, turns of won episodes,
    invalid-action %, pass@k %, greedy episodes (n, what success counts) and failed episodes, greedy and
    sampled (the failure guard's count)."""
    levels = levels or levels_of(metrics)
    ks = pass_keys(metrics)
    header = ["level", "policy", "success % [95% CI]", "score", "turns (won)", "invalid %"] + [f"{k} %" for k in ks]
    header += ["n", "failed (all episodes)"]
    rows = []
    for lvl in levels:
        for policy, cells in metrics.items():
            c = cells.get(lvl)
            if c is None:
                continue
            rows.append([lvl, policy, success_cell(c), _num(c.get("score")), _num(c.get("turns_won"), 1),
                         pct(c.get("invalid_rate"))] + [pct(c.get(k)) for k in ks]
                        + [str(c.get("n", NA)), str(c.get("failed", 0))])
    return _table(header, rows, text_cols=2)


def render_report(metrics: dict, figures: dict[str, Path | None], notes: dict[str, str] | None = None,
                  title: str = "agentrecipe results", sampled: bool = True) -> str:
    """The report page: both tables, then each figure (a path relative to the page) or, for a
    figure that could not be drawn (None), its note. sampled: whether the evaluation sampled
    episodes (eval.temperature > 0); if not, a model's pass@k is its greedy episode's win, and the
    page says so."""
    notes = notes or {}
    pass_k = ("pass@k is the unbiased estimate (Chen et al., 2021) from sampled episodes" if sampled else
              "no model episode was sampled (eval.temperature 0), so a model's pass@k is its greedy "
              "episode's win")
    parts = [f"# {title}\n",
             "Greedy episodes give success (95% Wilson interval), score (score / max score), turns of won "
             f"episodes and the invalid-action rate; {pass_k}. Failed episodes (environment crash or timeout) "
             "count as not won.\n",
             "## Success by level\n", success_table(metrics), "## All metrics\n", results_table(metrics)]
    for name, path in figures.items():
        parts.append(f"## {name}\n")
        body = f"![{name}]({Path(path).as_posix()})" if path is not None else notes.get(name, "No data.")
        parts.append(body + "\n")
    return "\n".join(parts)
