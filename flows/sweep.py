"""Run an ablation grid as DVC experiments and gather one comparison table.

One DVC experiment per grid point (`dvc exp run --queue -S key=value --name <slug>`),
the queue run by `jobs` workers (`dvc queue start -j N`), then every point's
params and metrics from `dvc exp show --json`: a Prefect table artifact, and
results.csv + results.png under data/sweeps/<name>/ (not a DVC out).
A failed point is recorded with its error; the other points still run.

    python -m flows.sweep --preset algo_x_reward --override experiment=micro
    python -m flows.sweep --grid '{"budget.sft_fraction": [0, 0.5, 1]}' --jobs 2

Presets live in params/sweep/<preset>.yaml: `grid` (key -> values, every
combination is run) and/or `points` (a list of key -> value mappings run as
given), `overrides` applied to every point, `plot` (metric columns to plot).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import itertools
import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.dvc_dag import dvc, dvc_env, flatten, run

PRESET_DIR = "params/sweep"
OUT_DIR = "data/sweeps"
TERMINAL = {"Success": "success", "Failed": "failed"}
# Plotted unless the call or the preset says otherwise: the RL policy's success rate on the
# training levels and on the held-out ones (data/eval/metrics.json is policy -> level -> metric).
DEFAULT_PLOT = ["rl.in_domain.success", "rl.ood.success"]


# ------------------------------------------------------------------ the grid
@dataclass
class SweepSpec:
    """What to run: fixed overrides plus one mapping of overrides per point."""

    name: str
    points: list[dict[str, Any]]
    overrides: list[str] = field(default_factory=list)
    plot: list[str] = field(default_factory=list)
    description: str = ""


def load_preset(project: Path, preset: str) -> dict[str, Any]:
    """params/sweep/<preset>.yaml as a mapping; an unknown preset lists the known ones."""
    path = project / PRESET_DIR / f"{preset}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in (project / PRESET_DIR).glob("*.yaml"))
        raise ValueError(f"unknown sweep preset {preset!r}; presets in {PRESET_DIR}/: {', '.join(known) or 'none'}")
    data = yaml.safe_load(path.read_text()) or {}
    unknown = set(data) - {"description", "grid", "points", "overrides", "plot"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)} (known: description, grid, points, overrides, plot)")
    return data


def expand(grid: dict[str, list] | None = None, points: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every combination of `grid` (first key varies slowest), then the explicit `points`."""
    out: list[dict[str, Any]] = []
    if grid:
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"grid[{key!r}] must be a non-empty list of values, got {values!r}")
        out += [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]
    out += [dict(p) for p in points or []]
    if not out:
        raise ValueError("the sweep has no points: give a grid, points or a preset")
    return out


def resolve_spec(
    project: Path,
    grid: dict[str, list] | None,
    points: list[dict[str, Any]] | None,
    preset: str | None,
    overrides: list[str] | None,
    name: str | None,
    plot: list[str] | None,
) -> SweepSpec:
    data = load_preset(project, preset) if preset else {}
    spec = SweepSpec(
        name=name or preset or "grid",
        points=expand({**(data.get("grid") or {}), **(grid or {})}, [*(data.get("points") or []), *(points or [])]),
        overrides=[*(data.get("overrides") or []), *(overrides or [])],
        plot=list(plot or data.get("plot") or DEFAULT_PLOT),
        description=data.get("description", ""),
    )
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", spec.name):
        raise ValueError(f"sweep name {spec.name!r}: use letters, digits, '_', '.', '-'")
    return spec


_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./+-]*")


def hydra_value(value: Any) -> str:
    """A Python value in Hydra's override syntax (what `dvc exp run -S key=<value>` takes)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in {"null", "true", "false", "nan", "inf"}:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def point_overrides(point: dict[str, Any]) -> list[str]:
    return [f"{key}={hydra_value(value)}" for key, value in point.items()]


def experiment_name(sweep_name: str, point: dict[str, Any], taken: set[str]) -> str:
    """A readable, git-ref-safe, unique name: `<sweep>-<key>-<value>-...` (last key component)."""
    def show(value: Any) -> str:  # -1.0 -> m1.0: a dash would vanish into the separators
        return f"m{-value!r}" if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0 else hydra_value(value)

    parts = [f"{key.split('.')[-1]}-{re.sub(r'[^A-Za-z0-9_.]+', '-', show(value)).strip('-.') or 'none'}" for key, value in point.items()]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join([sweep_name, *parts]))
    slug = re.sub(r"\.{2,}", ".", re.sub(r"-{2,}", "-", slug)).strip("-.")
    if len(slug) > 80:
        slug = f"{slug[:71]}-{hashlib.sha1(slug.encode()).hexdigest()[:8]}"
    name, i = slug, 2
    while name in taken:
        name, i = f"{slug}-{i}", i + 1
    taken.add(name)
    return name


# --------------------------------------------------------------- DVC's queue
def parse_queue_status(text: str) -> tuple[list[dict[str, str]], tuple[int, int] | None]:
    """Rows (task, name, status) of `dvc queue status`, and its (active, idle) worker counts."""
    rows, workers = [], None
    for line in text.splitlines():
        if m := re.match(r"Worker status: (\d+) active, (\d+) idle", line.strip()):
            workers = (int(m.group(1)), int(m.group(2)))
            continue
        tokens = line.split()
        if len(tokens) >= 4 and re.fullmatch(r"[0-9a-f]{7,40}", tokens[0]):
            rows.append({"task": tokens[0], "name": tokens[1], "status": tokens[-1]})
    return rows, workers


def queue_status(project: Path, env: dict[str, str]) -> tuple[list[dict[str, str]], tuple[int, int] | None]:
    res = run(dvc("queue", "status"), project, env)
    if res.returncode != 0:
        raise RuntimeError(f"dvc queue status failed: {res.stderr.strip()}")
    return parse_queue_status(res.stdout)


def failure_log(project: Path, env: dict[str, str], task_id: str, lines: int = 15) -> str:
    """The end of a failed experiment's log (`dvc queue logs`), without DVC's help footer."""
    res = run(dvc("queue", "logs", task_id), project, env)
    text = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip() and "Having any troubles" not in ln]
    return "\n".join(text[-lines:])


@task(name="queue-experiments", cache_policy=NO_CACHE)
def queue_experiments(project: str, spec: SweepSpec) -> list[dict[str, Any]]:
    """`dvc exp run --queue` once per point; returns one record per point (task id once queued)."""
    logger = get_run_logger()
    root, env = Path(project), dvc_env(project)
    dirty = run(["git", "status", "--porcelain", "--untracked-files=normal"], root).stdout
    if untracked := [ln[3:] for ln in dirty.splitlines() if ln.startswith("??")]:
        logger.warning("untracked files are not part of queued experiments (commit them): %s", ", ".join(untracked[:10]))
    before = {r["task"] for r in queue_status(root, env)[0]}
    taken: set[str] = set()
    records = []
    for point in spec.points:
        name = experiment_name(spec.name, point, taken)
        sets = [*spec.overrides, *point_overrides(point)]
        cmd = dvc("exp", "run", "--queue", "--name", name, *[a for s in sets for a in ("-S", s)])
        logger.info("$ dvc %s", " ".join(cmd[3:]))
        res = run(cmd, root, env)
        if res.returncode != 0 and "conflicts with existing experiment" in res.stderr:
            # A rerun replaces the experiment of the same name (`--force` would also rerun every stage).
            logger.info("replacing the earlier experiment %s", name)
            run(dvc("exp", "remove", name), root, env)
            res = run(cmd, root, env)
        rec = {"experiment": name, "point": point, "overrides": sets, "task": None, "status": "queued", "error": ""}
        if res.returncode != 0:
            rec.update(status="failed", error=res.stderr.strip()[-2000:])
            logger.error("could not queue %s: %s", name, rec["error"])
        else:
            new = [r for r in queue_status(root, env)[0] if r["task"] not in before and r["name"] == name]
            if new:
                rec["task"] = new[0]["task"]
                before.add(rec["task"])
            else:
                rec.update(status="failed", error="queued, but not found in `dvc queue status`")
        records.append(rec)
    return records


@task(name="run-queue", cache_policy=NO_CACHE)
def run_queue(project: str, records: list[dict[str, Any]], jobs: int, poll_s: float, timeout_s: float | None) -> list[dict[str, Any]]:
    """`dvc queue start -j jobs`, then poll `dvc queue status` until every queued point has finished."""
    logger = get_run_logger()
    root, env = Path(project), dvc_env(project)
    # Workers side by side share the cores (stages size their torch threads by this).
    env.setdefault("AGENTRECIPE_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, jobs))))
    pending = {r["task"]: r for r in records if r["status"] == "queued" and r["task"]}
    if not pending:
        return records

    def start() -> None:
        # Workers are detached children that inherit the output: a pipe would stay open (and
        # subprocess.run wait) until the queue is empty, so the output goes to a file.
        with tempfile.TemporaryFile() as out:
            subprocess.run(dvc("queue", "start", "-j", str(jobs)), cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
            out.seek(0)
            logger.info("%s", out.read().decode(errors="replace").strip())

    start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    idle_polls, last, missing = 0, {}, dict.fromkeys(pending, 0)
    while pending:
        time.sleep(poll_s)
        rows, workers = queue_status(root, env)
        by_task = {r["task"]: r["status"] for r in rows}
        for task_id, rec in list(pending.items()):
            status = by_task.get(task_id, "Missing")
            missing[task_id] = missing[task_id] + 1 if status == "Missing" else 0
            if missing[task_id] >= 3:  # removed from the queue by someone else
                rec.update(status="failed", error="removed from the DVC queue before it finished")
                del pending[task_id]
                continue
            if status != last.get(task_id):
                logger.info("%s: %s", rec["experiment"], status)
                last[task_id] = status
            if status in TERMINAL:
                rec["status"] = TERMINAL[status]
                if rec["status"] == "failed":
                    rec["error"] = failure_log(root, env, task_id)
                    logger.error("%s failed:\n%s", rec["experiment"], rec["error"])
                del pending[task_id]
        # A worker that died leaves tasks queued with nobody to run them: start workers again.
        idle_polls = idle_polls + 1 if pending and workers == (0, 0) else 0
        if idle_polls >= 3:
            logger.warning("no queue worker alive with %d experiments left; starting workers again", len(pending))
            start()
            idle_polls = 0
        if deadline is not None and time.monotonic() > deadline and pending:
            names = [r["experiment"] for r in pending.values()]
            logger.error("timeout after %ss; killing %s", timeout_s, ", ".join(names))
            run(dvc("queue", "kill", *pending), root, env)
            run(dvc("queue", "remove", *pending), root, env)
            for rec in pending.values():
                rec.update(status="failed", error=f"timed out after {timeout_s} s")
            break
    return records


# ------------------------------------------------------------------- results
def experiments_by_name(show: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{experiment name: {"rev", "params", "metrics"}} from `dvc exp show --json`."""
    out = {}
    for baseline in show:
        for exp in baseline.get("experiments") or []:
            rev = (exp.get("revs") or [{}])[0]
            data = rev.get("data") or {}
            name = exp.get("name") or rev.get("name")
            files = data.get("metrics") or {}
            metrics = {}
            for path, content in files.items():
                prefix = "" if len(files) == 1 else f"{path}:"
                metrics.update({f"{prefix}{k}": v for k, v in flatten((content or {}).get("data") or {}).items()})
            params = {}
            for content in (data.get("params") or {}).values():
                params.update(flatten((content or {}).get("data") or {}))
            out[name] = {"rev": (rev.get("rev") or "")[:7], "params": params, "metrics": metrics}
    return out


@task(name="collect-results", cache_policy=NO_CACHE)
def collect_results(project: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per point: experiment, status, the point's values, its metrics, error."""
    root, env = Path(project), dvc_env(project)
    res = run(dvc("exp", "show", "--json", "--no-fetch"), root, env)
    if res.returncode != 0:
        raise RuntimeError(f"dvc exp show failed: {res.stderr.strip()}")
    found = experiments_by_name(json.loads(res.stdout or "[]"))
    logger = get_run_logger()
    rows = []
    for rec in records:
        exp = found.get(rec["experiment"], {})
        ok = rec["status"] == "success"
        row = {"experiment": rec["experiment"], "status": rec["status"], "rev": exp.get("rev", "") if ok else ""}
        for key, value in rec["point"].items():
            # What was asked; for a key that is a params entry, what the experiment actually ran with.
            actual = exp.get("params", {}).get(key, value) if ok else value
            row[key] = json.dumps(actual) if isinstance(actual, (list, dict)) else actual
        # A failed experiment's commit still carries the baseline's metrics: leave them out.
        row.update(exp.get("metrics", {}) if ok else {})
        if ok and not exp.get("metrics"):
            logger.warning(
                "%s has no metrics in `dvc exp show`: is the metrics file declared in dvc.yaml, and if it is "
                "`cache: false`, tracked by git (a git-ignored one is left out of experiments)?", rec["experiment"]
            )
        row["error"] = rec["error"]
        rows.append(row)
    return rows


def columns(rows: list[dict[str, Any]]) -> list[str]:
    """All keys in first-seen order, `error` last."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    return [c for c in cols if c != "error"] + ["error"]


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns(rows))
        writer.writeheader()
        writer.writerows(rows)


def plot_columns(rows: list[dict[str, Any]], point_keys: list[str], wanted: list[str]) -> list[str]:
    """Metric columns to plot: `wanted`, else the first four `*.success`, else the first four numeric ones."""
    skip = {"experiment", "status", "rev", "error", *point_keys}
    numeric = [
        c for c in columns(rows)
        if c not in skip and any(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool) for r in rows)
    ]
    chosen = [c for c in wanted if c in numeric]
    return chosen or [c for c in numeric if c.split(".")[-1] == "success"][:4] or numeric[:4]


def summary_columns(rows: list[dict[str, Any]], point_keys: list[str], plotted: list[str], most: int = 24) -> list[str]:
    """Columns of the table artifact: all of them, or when there are many, the success rates (the CSV has all)."""
    cols = columns(rows)
    if len(cols) <= most:
        return cols
    keep = {"experiment", "status", "rev", "error", *point_keys, *plotted}
    return [c for c in cols if c in keep or c.split(".")[-1] == "success"]


def write_plot(rows: list[dict[str, Any]], metrics: list[str], point_keys: list[str], title: str, path: Path) -> bool:
    """A bar per point for each metric (a failed point has no bar and is marked)."""
    if not metrics:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["\n".join(f"{k.split('.')[-1]}={r[k]}" for k in point_keys if k in r) for r in rows]
    fig, axes = plt.subplots(len(metrics), 1, figsize=(max(6, 1.3 * len(rows)), 3 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics):
        values = [r.get(metric) if isinstance(r.get(metric), (int, float)) else 0.0 for r in rows]
        bars = ax.bar(range(len(rows)), values, color=["C0" if r["status"] == "success" else "lightgray" for r in rows])
        for bar, r in zip(bars, rows):
            if r["status"] != "success":
                ax.annotate(r["status"], (bar.get_x() + bar.get_width() / 2, 0), ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(metric)
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
    axes[0, 0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


@flow(name="sweep")
def sweep(
    grid: dict[str, list] | None = None,
    preset: str | None = None,
    jobs: int = 1,
    project_dir: str = ".",
    overrides: list[str] | None = None,
    points: list[dict[str, Any]] | None = None,
    name: str | None = None,
    plot: list[str] | None = None,
    poll_s: float = 5.0,
    timeout_s: float | None = None,
) -> list[dict[str, Any]]:
    """Run one DVC experiment per grid point and compare them in one table.

    Args:
        grid: params key or config group -> values, e.g. {"rl": ["ppo", "grpo"], "reward": ["sparse", "dense"]};
            every combination is one experiment.
        preset: a sweep in params/sweep/<preset>.yaml (budget_split, algo_x_reward, env_complexity,
            turn_schedule); `grid` and `points` add to it.
        jobs: queue workers running experiments side by side (`dvc queue start -j`).
        project_dir: the DVC project.
        overrides: applied to every point, e.g. ["experiment=micro"].
        points: explicit points (key -> value mappings) run as given, besides the grid.
        name: sweep name, used in experiment names and data/sweeps/<name>/ (default: the preset, or "grid").
        plot: metric columns to plot (default: rl.in_domain.success and rl.ood.success, else the first
            four `*.success` columns, else the first four numeric ones).
        poll_s: seconds between `dvc queue status` polls.
        timeout_s: give up on (kill) experiments still running after this long; None waits.
    """
    logger = get_run_logger()
    project = Path(project_dir).resolve()
    spec = resolve_spec(project, grid, points, preset, overrides, name, plot)
    logger.info("sweep %r: %d points, overrides %s", spec.name, len(spec.points), spec.overrides or "none")

    records = queue_experiments(str(project), spec)
    records = run_queue(str(project), records, jobs, poll_s, timeout_s)
    rows = collect_results(str(project), records)

    point_keys = list(dict.fromkeys(k for p in spec.points for k in p))
    out = project / OUT_DIR / spec.name
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "results.csv")
    to_plot = plot_columns(rows, point_keys, spec.plot)
    plotted = write_plot(rows, to_plot, point_keys, f"sweep {spec.name}", out / "results.png")
    (out / "sweep.yaml").write_text(
        yaml.safe_dump({"name": spec.name, "description": spec.description, "overrides": spec.overrides,
                        "experiments": [{"name": r["experiment"], "overrides": r["overrides"], "status": r["status"]} for r in records]},
                       sort_keys=False)
    )
    key = "sweep-" + re.sub(r"[^a-z0-9-]+", "-", spec.name.lower()).strip("-")
    table = [{c: r.get(c) for c in summary_columns(rows, point_keys, to_plot)} for r in rows]
    create_table_artifact(table, key=key, description=f"Sweep {spec.name}: {len(rows)} experiments ({out.relative_to(project)}/results.csv)")
    n_failed = sum(r["status"] != "success" for r in rows)
    logger.info("wrote %s/results.csv%s; %d of %d experiments failed", out, " and results.png" if plotted else "", n_failed, len(rows))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset")
    parser.add_argument("--grid", type=json.loads, help='JSON, e.g. \'{"rl": ["ppo", "grpo"]}\'')
    parser.add_argument("--override", action="append", dest="overrides", help="applied to every point (repeatable)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--name")
    parser.add_argument("--project-dir", default=".")
    parser.add_argument("--timeout-s", type=float)
    args = parser.parse_args(argv)
    sweep(grid=args.grid, preset=args.preset, jobs=args.jobs, project_dir=args.project_dir,
          overrides=args.overrides, name=args.name, timeout_s=args.timeout_s)


if __name__ == "__main__":
    main()
