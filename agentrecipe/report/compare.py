"""DVC experiments side by side in a few columns (`agentrecipe compare`).

`dvc exp show` lists every param and every metric cell (hundreds of columns).
This reads its `--json` output and keeps what a comparison needs: the
experiment, its state, the params that differ between the experiments shown
(a column each, or, when they do not fit, one column saying per row what differs
from the most common value), and one policy's in-domain and out-of-domain
success with its 95% interval.
An experiment that did not succeed shows no numbers: DVC gives a failed
experiment its baseline's metrics, which are not its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from agentrecipe.report.tables import NA, success_cell


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level with dotted keys: {"a": {"b": 1}} -> {"a.b": 1}."""
    if not isinstance(obj, dict):
        return {prefix: obj} if prefix else {"value": obj}
    flat: dict[str, Any] = {}
    for key, value in obj.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def exp_show(project: str | Path = ".", rev: str | None = None) -> list[dict[str, Any]]:
    """`dvc exp show --json` of `project`: the experiments of commit `rev` (default the current one)."""
    res = subprocess.run([sys.executable, "-m", "dvc", "exp", "show", "--json", "--no-fetch", *(["--rev", rev] if rev else [])],
                         cwd=project, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"dvc exp show failed: {res.stderr.strip()}")
    return json.loads(res.stdout or "[]")


def _record(entry: dict[str, Any], name: str, state: str, log: str | None) -> dict[str, Any]:
    rev = (entry.get("revs") or [entry])[0]
    data = rev.get("data") or {}
    params: dict[str, Any] = {}
    for content in (data.get("params") or {}).values():
        params.update(flatten((content or {}).get("data") or {}))
    files = data.get("metrics") or {}
    metrics: dict[str, Any] = {}
    for path, content in files.items():
        prefix = "" if len(files) == 1 else f"{path}:"
        metrics.update({prefix + k: v for k, v in flatten((content or {}).get("data") or {}).items()})
    own = state in ("success", "baseline")
    return {"name": name, "rev": (rev.get("rev") or "")[:7], "state": state, "params": params,
            "metrics": metrics if own else {}, "log": log}


def experiments(show: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per commit and experiment of `dvc exp show --json` (the workspace left out):
    name, rev, state (baseline, success, failed, queued, running), flat params, flat metrics
    (empty unless the experiment succeeded), log (the queue's log file of a queued run)."""
    out = []
    for commit in show:
        if commit.get("rev") == "workspace":
            continue
        out.append(_record(commit, commit.get("name") or commit["rev"][:7], "baseline", None))
        for exp in commit.get("experiments") or []:
            executor = exp.get("executor") or {}
            rev = (exp.get("revs") or [{}])[0]
            out.append(_record(exp, exp.get("name") or rev.get("name") or rev.get("rev", "")[:7],
                               executor.get("state") or "success", (executor.get("local") or {}).get("log")))
    return out


def varying_params(records: list[dict[str, Any]]) -> list[str]:
    """Params whose value differs between the records, in params.yaml order, less those that the
    params already kept determine (`-S rl=ppo` changes rl.algo and rl.group_size: rl.algo is shown)."""
    def values(keys: list[str]) -> list[str]:
        return [json.dumps([r["params"].get(k) for k in keys]) for r in records]

    kept: list[str] = []
    for key in dict.fromkeys(k for r in records for k in r["params"]):
        if len(set(values([key]))) > 1 and len(set(values(kept + [key]))) > len(set(values(kept))):
            kept.append(key)
    return kept


def error_tail(log: str | None, chars: int = 300) -> str:
    """The last distinct lines of a failed run's log (at most `chars`), DVC's help footer left out."""
    if not log or not Path(log).exists():
        return ""
    lines = list(dict.fromkeys(ln.strip() for ln in Path(log).read_text(errors="replace").splitlines()
                               if ln.strip() and "Having any troubles" not in ln and "dvc.org/support" not in ln))
    text = " | ".join(lines[-4:])
    return text if len(text) <= chars else "…" + text[-chars + 1:]


def success(metrics: dict[str, Any], policy: str, cell: str) -> str:
    """'45.0 [28.1, 63.1]' for `policy`'s pooled `cell` (in_domain, ood), '–' when absent."""
    prefix = f"{policy}.{cell}."
    values = {k[len(prefix):]: v for k, v in metrics.items() if k.startswith(prefix)}
    return success_cell(values or None)


def rows(records: list[dict[str, Any]], params: list[str], policy: str = "rl") -> list[dict[str, str]]:
    """Display rows: experiment, state, `params`, `policy`'s in-domain and OOD success."""
    def show(value: Any) -> str:
        return NA if value is None else json.dumps(value) if isinstance(value, (list, dict)) else str(value)

    return [
        {"experiment": r["name"], "state": r["state"], **{p: show(r["params"].get(p)) for p in params},
         f"{policy} in-domain": success(r["metrics"], policy, "in_domain"),
         f"{policy} ood": success(r["metrics"], policy, "ood")}
        for r in records
    ]


def short_names(keys: list[str]) -> dict[str, str]:
    """Each dotted key's shortest suffix that no other key ends with: env.levels -> levels."""
    def suffix(key: str, n: int) -> str:
        return ".".join(key.split(".")[-n:])

    out = {}
    for key in keys:
        n = 1
        while n < key.count(".") + 1 and any(o != key and (o == suffix(key, n) or o.endswith("." + suffix(key, n)))
                                             for o in keys):
            n += 1
        out[key] = suffix(key, n)
    return out


def changes_rows(table: list[dict[str, str]], params: list[str]) -> list[dict[str, str]]:
    """`rows` with the param columns folded into one: per row, `name=value` of each param whose value
    differs from the most common one among the rows (ties: the earliest row's, so the baseline's)."""
    names = short_names(params)
    common = {p: Counter(r[p] for r in table).most_common(1)[0][0] for p in params}
    return [{**{k: v for k, v in r.items() if k not in params},
             "differs from the most common value": " ".join(f"{names[p]}={r[p]}" for p in params if r[p] != common[p])}
            for r in table]


def column_sizes(table: list[dict[str, str]]) -> dict[str, int]:
    """Each column's uncut width: its longest cell or its header."""
    return {c: max(len(c), *(len(r[c]) for r in table)) for c in table[0]}


def _width(size: dict[str, int]) -> int:
    return sum(size.values()) + 2 * (len(size) - 1)


def format_table(table: list[dict[str, str]], width: int = 120, keep: tuple[str, ...] = ()) -> str:
    """Aligned plain-text columns; the widest cells are cut (…), down to 8 characters, until a line
    fits `width`: columns not in `keep` first, then the `keep` ones too."""
    if not table:
        return "(no experiments)"
    cols = list(table[0])
    size = column_sizes(table)
    for cuttable in ([c for c in cols if c not in keep], cols):
        while _width(size) > width and cuttable and max(size[c] for c in cuttable) > 8:
            widest = max(cuttable, key=size.get)
            size[widest] -= 1

    def cut(text: str, n: int) -> str:
        return text if len(text) <= n else text[: n - 1] + "…"

    lines = ["  ".join(cut(c, size[c]).ljust(size[c]) for c in cols).rstrip()]
    lines += ["  ".join(cut(r[c], size[c]).ljust(size[c]) for c in cols).rstrip() for r in table]
    return "\n".join(lines)


def compare(project: str | Path = ".", names: list[str] | None = None, params: list[str] | None = None,
            policy: str = "rl", width: int = 120) -> str:
    """The comparison table of `project`'s experiments (all, or `names` in that order)."""
    records = experiments(exp_show(project))
    if names:
        by_name = {r["name"]: r for r in records}
        if missing := [n for n in names if n not in by_name]:
            raise ValueError(f"unknown experiment(s) {', '.join(missing)}; known: {', '.join(by_name)}")
        records = [by_name[n] for n in names]
    params = params or varying_params(records)
    table = rows(records, params, policy)
    results = ("experiment", f"{policy} in-domain", f"{policy} ood")
    if table and params and _width(column_sizes(table)) > width:
        table = changes_rows(table, params)  # too many params for a column each
    return format_table(table, width, keep=results)
