"""A finding's page (docs/results/<finding>.md) from a finished sweep's folder (data/sweeps/<name>/).

The sweep flow leaves results.csv (one row per experiment), summary.csv and summary.png (the
seeds summed up, `agentrecipe.report.seeds`) and run.json (command, revision, wall time,
machine). A sweep run in parts, in different clones or sessions (seed 0 one day, seeds 1-2
later), is first joined into one folder by `merge_sweeps`. `write_page` copies the CSVs and the
plot next to the page and writes the page: the
paper's claim, the command, the tables (mean across seeds with a 95% t interval, per-seed values,
all seeds pooled with a Wilson interval; the RL policy's success on every level, a transfer
matrix when the points train on different levels), the plot, and the verdict, which a person
writes after reading the numbers (`--verdict`).
"""

from __future__ import annotations

import csv
import json
import math
import shlex
import shutil
from pathlib import Path
from typing import Any

from agentrecipe.report import seeds
from agentrecipe.report.tables import pct

POOLED = ("in_domain", "ood")
TEXT_COLUMNS = ("experiment", "state", "error", "rl in-domain", "rl ood", "sft in-domain", "sft ood")
"""results.csv columns that stay text when its rows are read back (with the swept keys); the rest are metrics."""


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _num(value: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _typed(row: dict[str, str], text: set[str]) -> dict[str, Any]:
    """A results.csv row read back: metric columns as numbers (int where whole), empty ones dropped."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if k in text:
            out[k] = v
        elif v != "":
            x = _num(v)
            out[k] = v if math.isnan(x) and v.lower() != "nan" else int(x) if x.is_integer() and "." not in v else x
    return out


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
    (successful experiments only), a row per setting in the summary table's order ('–' where none
    of its seeds succeeded): a transfer matrix when settings train on different levels. Header:
    the setting keys, then the levels."""
    prefix = f"{policy}."
    levels = list(dict.fromkeys(k[len(prefix):-len(".success")] for r in results for k in r
                                if k.startswith(prefix) and k.endswith(".success") and k.count(".") == 2
                                and k.split(".")[1] not in POOLED))
    groups: dict[tuple, list[dict[str, str]]] = {}
    for r in results:  # every row, so the settings come in the summary table's order (first seen)
        groups.setdefault(tuple(r.get(k, "") for k in keys), []).append(r)
    rows = []
    for setting, members in groups.items():
        cells = []
        for level in levels:
            values = [_num(m.get(f"{prefix}{level}.success", "")) for m in members if m.get("state") == "success"]
            values = [v for v in values if not math.isnan(v)]
            cells.append(pct(seeds.exact_mean(values)) if values else "–")
        rows.append([*setting, *cells])
    return [*(k.split(".")[-1] for k in keys), *levels], rows


def write_summary(rows: list[dict[str, Any]], swept: list[str], title: str, folder: Path) -> list[dict[str, Any]]:
    """summary.csv and summary.png in `folder`: the points that differ only in `seed` summed up
    (`seeds.summarise`); returns the summaries."""
    from agentrecipe.report.plots import plot_seed_summary

    summaries = seeds.summarise(rows, swept)
    with (folder / "summary.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(summaries[0]))
        writer.writeheader()
        writer.writerows(summaries)
    plot_seed_summary(summaries, [k for k in swept if k != seeds.SEED_KEY], title, folder / "summary.png")
    return summaries


def merge_sweeps(folders: list[Path], out: Path, title: str) -> Path:
    """One sweep folder at `out` from the folders of several runs of one sweep (each as the sweep
    flow left it). An experiment's row is the one where it succeeded (else the last folder's); an
    experiment that succeeded in two folders is an error naming it (which run counts is for a person
    to say). summary.csv and summary.png are recomputed from the joined rows; run.json lists every
    run, each with its own command, revision and wall time (the last run on top, the others in
    `earlier`, first to last)."""
    folders = [Path(f) for f in folders]
    for folder in folders:
        for name in ("run.json", "results.csv", "summary.csv"):
            if not (folder / name).exists():
                raise FileNotFoundError(f"{folder / name}: not there; each --sweep must be a finished sweep's folder")
    _check_one_sweep(folders)
    swept = [*_setting_keys(read_csv(folders[-1] / "summary.csv")), seeds.SEED_KEY]
    text = set(TEXT_COLUMNS) | set(swept)
    rows: dict[str, dict[str, Any]] = {}
    origin: dict[str, Path] = {}
    for folder in folders:
        for row in map(lambda r: _typed(r, text), read_csv(folder / "results.csv")):
            name = row["experiment"]
            if row["state"] == "success" and rows.get(name, {}).get("state") == "success":
                raise ValueError(f"experiment {name} succeeded in both {origin[name]} and {folder}; "
                                 "keep one of them (remove its row from the other results.csv)")
            if name not in rows or row["state"] == "success" or rows[name]["state"] != "success":
                rows[name], origin[name] = row, folder
    out.mkdir(parents=True, exist_ok=True)
    joined = list(rows.values())
    with (out / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in joined for k in r)))
        writer.writeheader()
        writer.writerows(joined)
    write_summary(joined, swept, title, out)
    runs = []
    for folder in folders:
        record = json.loads((folder / "run.json").read_text())
        runs += [*record.pop("earlier", []), record]
    last = {**runs[-1], "points": len(joined), "succeeded": sum(r["state"] == "success" for r in joined),
            "earlier": runs[:-1]}
    (out / "run.json").write_text(json.dumps(last, indent=2) + "\n")
    return out


# Options of `python -m flows.sweep` (each with one value) that choose which points run and how, not what a point is.
RUN_OPTIONS = ("--point", "--stop-after-s", "--jobs", "--timeout-s", "--name")


def sweep_identity(command: str) -> list[str]:
    """A sweep run's command without the options that do not change its points' params
    (`RUN_OPTIONS`, `--option value` or `--option=value`): two runs of one sweep have the same identity."""
    words, out = shlex.split(command), []
    while words:
        word = words.pop(0)
        option, eq, _ = word.partition("=")
        if option in RUN_OPTIONS:
            if not eq and words:
                words.pop(0)
            continue
        out.append(word)
    return out


def _check_one_sweep(folders: list[Path]) -> None:
    """Refuse folders whose runs were not of one sweep (another preset, --override or --target): a
    point's name leaves out the overrides it shares with the others, so seed 0 run with
    experiment=micro and seed 1 with experiment=findings would join into one setting's mean."""
    runs = []
    for folder in folders:
        record = json.loads((folder / "run.json").read_text())
        runs += [(folder, r["command"]) for r in [*record.get("earlier", []), record]]
    first_folder, first = runs[0]
    for folder, command in runs[1:]:
        if sweep_identity(command) != sweep_identity(first):
            raise ValueError(f"not runs of one sweep: {first_folder} ran `{first}`, {folder} ran `{command}` "
                             f"(only {', '.join(RUN_OPTIONS)} may differ)")


def _runs_by(runs: list[dict[str, Any]], key: str) -> dict[str, list[int]]:
    """Each value of `key` among the runs, with the (1-based) runs that had it, in first-seen order."""
    at: dict[str, list[int]] = {}
    for i, r in enumerate(runs, 1):
        at.setdefault(r[key], []).append(i)
    return at


def _by_run(at: dict[str, list[int]], fmt: str = "{}") -> str:
    """The one value of `_runs_by` (formatted by `fmt`), or each value with the runs that had it:
    "`abc` (run 1, 2); `def` (run 3)"."""
    if len(at) == 1:
        return fmt.format(next(iter(at)))
    return "; ".join(f"{fmt.format(v)} (run {', '.join(map(str, ns))})" for v, ns in at.items())


def render_page(folder: Path, title: str, claim: str, verdict: str, assets: str) -> str:
    """The page's markdown; `assets` is the folder (relative to the page) holding the copied files."""
    run = json.loads((folder / "run.json").read_text())
    results = read_csv(folder / "results.csv")
    summary = read_csv(folder / "summary.csv")
    keys = _setting_keys(summary)
    n_seeds = max((len(s["seeds"].split()) for s in summary), default=0)
    games = sorted({r.get("rl.in_domain.n", "") for r in results if r.get("state") == "success"} - {""}, key=float)
    header, rows = summary_rows(summary, ["rl in-domain", "rl ood"])
    sft_header, sft_rows = summary_rows(summary, ["sft in-domain", "sft ood"])
    m_header, m_rows = level_matrix(results, [k for k in keys if k != seeds.SEED_KEY])
    failed = [r["experiment"] for r in results if r.get("state") != "success"]
    runs = [*run.get("earlier", []), run]  # a sweep finished with --point: every run of it, first to last
    revisions = _runs_by(runs, "revision")
    return "\n".join([
        f"# {title}", "",
        f"**The papers:** {claim}", "",
        f"**Answer at laptop scale:** {verdict}", "",
        "## How it was run", "",
        *[f"    {r['command']}" for r in runs], "",
        f"- revision{'s' if len(revisions) > 1 else ''} {_by_run(revisions, '`{}`')}, started {runs[0]['started']}, wall time {sum(r['wall_s'] for r in runs) / 60:.0f} min"
        f"{f' over {len(runs)} runs' if len(runs) > 1 else ''} "
        f"({run['points']} experiments, {run['succeeded']} succeeded{'; not run or failed: ' + ', '.join(failed) if failed else ''})",
        f"- machine: {_by_run(_runs_by(runs, 'machine'))}",
        f"- {len(summary)} settings x {n_seeds} seed{'s' if n_seeds != 1 else ''}; in-domain test episodes per experiment: {', '.join(games) or '–'} "
        "(greedy, one per test game); every setting uses the same params except the swept keys",
        "", "## RL policy (greedy success, %)", "",
        "Mean of the seeds with Student's t 95% interval (training noise and, where each seed has its own "
        "test games, their draw), the per-seed values, and all seeds' greedy test episodes pooled with a "
        "95% Wilson interval.", "",
        _md_table(header, rows), "",
        *([f"![RL success per setting]({assets}/summary.png)", ""] if (folder / "summary.png").exists() else []),
        "## SFT policy of the same runs (greedy success, %)", "",
        _md_table(sft_header, sft_rows), "",
        *sampled_section(summary, results),
        "## RL policy on every tested level (mean of the seeds, %)", "",
        _md_table(m_header, m_rows), "",
        f"Data: [`results.csv`]({assets}/results.csv) (every metric of every experiment), "
        f"[`summary.csv`]({assets}/summary.csv) (the tables above), [`run.json`]({assets}/run.json).", ""])


def sampled_section(summary: list[dict[str, str]], results: list[dict[str, str]]) -> list[str]:
    """The sampled episodes' success (pass@1: eval.samples per test game at the eval temperature,
    averaged per game) of RL and SFT: a greedy policy can loop where sampling gets out. Nothing for a
    summary.csv written before these columns, nor for a sweep evaluated without pass@1. A sweep whose
    points sampled no episodes (eval.temperature 0 in `results`' rows): a line saying so, not the
    table (its pass@1 would be the greedy episode's win under a "sampled" heading)."""
    if not any(s.get(f"{c} sampled episodes") not in (None, "", "0") for s in summary for c in ("rl in-domain", "sft in-domain")):
        return []  # written before these columns, or evaluated without sampled episodes (no pass@1)
    ran = [r for r in results if r.get("state") == "success" and r.get("eval.temperature", "") != ""]
    if ran and not any(float(r["eval.temperature"]) > 0 for r in ran):
        return ["## Sampled episodes", "",
                "None: every point was evaluated at eval.temperature 0, so each test game had only its greedy "
                "episode (pass@k repeats greedy success).", ""]
    rl_header, rl_rows = summary_rows(summary, ["rl in-domain sampled", "rl ood sampled"])
    sft_header, sft_rows = summary_rows(summary, ["sft in-domain sampled", "sft ood sampled"])
    return ["## Sampled episodes (pass@1, %)", "",
            "The same policies' sampled test episodes (eval.samples per game at the eval temperature; pass@1 "
            "is the share won, averaged per game); the pooled Wilson interval counts test games.", "",
            _md_table(rl_header, rl_rows), "", _md_table(sft_header, sft_rows), ""]


def write_page(folder: str | Path, out: str | Path, title: str, claim: str, verdict: str) -> Path:
    """Copy the sweep's CSVs, plot and run record to <out without .md>/ and write the page at `out`."""
    folder, out = Path(folder), Path(out)
    for name in ("run.json", "results.csv", "summary.csv"):
        if not (folder / name).exists():
            raise FileNotFoundError(f"{folder / name}: not there; run the sweep with a seed axis first (python -m flows.sweep)")
    assets = out.with_suffix("")
    assets.mkdir(parents=True, exist_ok=True)
    for name in ("run.json", "results.csv", "summary.csv", "summary.png"):
        src, dst = folder / name, assets / name
        if not src.exists() or (dst.exists() and dst.samefile(src)):
            continue  # no plot, or the page's own folder given as the sweep (a page rewritten with a new verdict)
        shutil.copy2(src, dst)
    out.write_text(render_page(folder, title, claim, verdict, assets.name))
    return out
