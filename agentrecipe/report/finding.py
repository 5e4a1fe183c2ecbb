"""A finding's page (docs/results/<finding>.md) from a finished sweep's folder (data/sweeps/<name>/).

The sweep flow leaves results.csv (one row per experiment), summary.csv and summary.png (the
seeds summed up, `agentrecipe.report.seeds`) and run.json (command, revision, wall time,
machine). `write_page` copies the CSVs and the plot next to the page and writes the page: the
paper's claim, the command, the tables (mean across seeds with a 95% t interval, per-seed values,
all seeds pooled with a Wilson interval; the RL policy's success on every level, a transfer
matrix when the points train on different levels), the plot, and the verdict, which a person
writes after reading the numbers (`--verdict`).
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path
from typing import Any

from agentrecipe.report import seeds

POOLED = ("in_domain", "ood")


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _num(value: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _setting_keys(summary: list[dict[str, str]]) -> list[str]:
    """The swept keys of summary.csv: its columns before `seeds`."""
    columns = list(summary[0]) if summary else []
    return columns[: columns.index("seeds")] if "seeds" in columns else []


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i < 1 else "---:" for i in range(len(header))) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _restore(row: dict[str, str]) -> dict[str, Any]:
    """summary.csv's strings back to the numbers `seeds` formats."""
    return {k: (_num(v) if k.endswith((" mean", " low", " high", " pooled")) else
                int(v) if k.endswith(" episodes") and v else v) for k, v in row.items()}


def summary_rows(summary: list[dict[str, str]], columns: list[str]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: the setting, the seeds, then per column mean [t], per seed, pooled [Wilson]."""
    keys = _setting_keys(summary)
    header = [*(k.split(".")[-1] for k in keys), "seeds"]
    for c in columns:
        header += [f"{c}: mean [95% t]", "per seed", "pooled [95% Wilson]"]
    rows = []
    for raw in summary:
        s = _restore(raw)
        row = [*(str(s[k]) for k in keys), s["seeds"] or "–"]
        for c in columns:
            row += [seeds.cell_text(s, c), seeds.per_seed_text(s, c) or "–", seeds.pooled_text(s, c)]
        rows.append(row)
    return header, rows


def level_matrix(results: list[dict[str, str]], keys: list[str], policy: str = "rl") -> tuple[list[str], list[list[str]]]:
    """`policy`'s greedy success on every level the sweep tested, mean over each setting's seeds
    (successful experiments only), a row per setting: a transfer matrix when settings train on
    different levels. Header: the setting keys, then the levels."""
    prefix = f"{policy}."
    levels = list(dict.fromkeys(k[len(prefix):-len(".success")] for r in results for k in r
                                if k.startswith(prefix) and k.endswith(".success") and k.count(".") == 2
                                and k.split(".")[1] not in POOLED))
    groups: dict[tuple, list[dict[str, str]]] = {}
    for r in results:
        if r.get("state") == "success":
            groups.setdefault(tuple(r.get(k, "") for k in keys), []).append(r)
    rows = []
    for setting, members in groups.items():
        cells = []
        for level in levels:
            values = [_num(m.get(f"{prefix}{level}.success", "")) for m in members]
            values = [v for v in values if not math.isnan(v)]
            cells.append(f"{100 * sum(values) / len(values):.1f}" if values else "–")
        rows.append([*setting, *cells])
    return [*(k.split(".")[-1] for k in keys), *levels], rows


def render_page(folder: Path, title: str, claim: str, verdict: str, assets: str) -> str:
    """The page's markdown; `assets` is the folder (relative to the page) holding the copied files."""
    run = json.loads((folder / "run.json").read_text())
    results = read_csv(folder / "results.csv")
    summary = read_csv(folder / "summary.csv")
    keys = _setting_keys(summary)
    n_seeds = max((len(s["seeds"].split()) for s in summary), default=0)
    games = sorted({r.get("rl.in_domain.n", "") for r in results if r.get("state") == "success"} - {""})
    header, rows = summary_rows(summary, ["rl in-domain", "rl ood"])
    sft_header, sft_rows = summary_rows(summary, ["sft in-domain", "sft ood"])
    m_header, m_rows = level_matrix(results, [k for k in keys if k != seeds.SEED_KEY])
    failed = [r["experiment"] for r in results if r.get("state") != "success"]
    runs = [*run.get("earlier", []), run]  # a sweep finished with --point: every run of it, first to last
    return "\n".join([
        f"# {title}", "",
        f"**The papers:** {claim}", "",
        f"**Answer at laptop scale:** {verdict}", "",
        "## How it was run", "",
        *[f"    {r['command']}" for r in runs], "",
        f"- revision `{run['revision']}`, started {runs[0]['started']}, wall time {sum(r['wall_s'] for r in runs) / 60:.0f} min"
        f"{f' over {len(runs)} runs' if len(runs) > 1 else ''} "
        f"({run['points']} experiments, {run['succeeded']} succeeded{'; not run or failed: ' + ', '.join(failed) if failed else ''})",
        f"- machine: {run['machine']}",
        f"- {len(summary)} settings x {n_seeds} seeds; in-domain test episodes per experiment: {', '.join(games) or '–'} "
        "(greedy, one per test game); every setting uses the same params except the swept keys",
        "", "## RL policy (greedy success, %)", "",
        "Mean of the seeds with Student's t 95% interval (training noise and, where each seed has its own "
        "test games, their draw), the per-seed values, and all seeds' greedy test episodes pooled with a "
        "95% Wilson interval.", "",
        _md_table(header, rows), "",
        *([f"![RL success per setting]({assets}/summary.png)", ""] if (folder / "summary.png").exists() else []),
        "## SFT policy of the same runs (greedy success, %)", "",
        _md_table(sft_header, sft_rows), "",
        "## RL policy on every tested level (mean of the seeds, %)", "",
        _md_table(m_header, m_rows), "",
        f"Data: [`results.csv`]({assets}/results.csv) (every metric of every experiment), "
        f"[`summary.csv`]({assets}/summary.csv) (the tables above), [`run.json`]({assets}/run.json).", ""])


def write_page(folder: str | Path, out: str | Path, title: str, claim: str, verdict: str) -> Path:
    """Copy the sweep's CSVs, plot and run record to <out without .md>/ and write the page at `out`."""
    folder, out = Path(folder), Path(out)
    for name in ("run.json", "results.csv", "summary.csv"):
        if not (folder / name).exists():
            raise FileNotFoundError(f"{folder / name}: not there; run the sweep with a seed axis first (python -m flows.sweep)")
    assets = out.with_suffix("")
    assets.mkdir(parents=True, exist_ok=True)
    for name in ("run.json", "results.csv", "summary.csv", "summary.png"):
        if (folder / name).exists():
            shutil.copy2(folder / name, assets / name)
    out.write_text(render_page(folder, title, claim, verdict, assets.name))
    return out
