"""Run the dvc.yaml DAG as a Prefect flow: one task per stage, in dependency order.

Each task runs `dvc repro --single-item <stage>`, so DVC still decides what is
up to date and caches the outputs; Prefect adds the run history, live logs,
retries and artifacts (evaluation table, report) in the UI.

    python -m flows.pipeline                   # the whole DAG
    python -m flows.pipeline --targets sft     # sft and what it needs
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from agentrecipe.report.compare import flatten
from flows.dvc_dag import Dag, dvc, dvc_env, read_dag, run_streaming

METRICS_FILE = "data/eval/metrics.json"
REPORT_FILE = "data/report/report.md"


class StageFailed(RuntimeError):
    """A DVC stage exited non-zero; the message ends with its last stderr lines."""


@task(name="dvc-stage", task_run_name="{stage}", cache_policy=NO_CACHE)
def run_stage(stage: str, project_dir: str, force: bool = False) -> dict[str, Any]:
    """`dvc repro --single-item stage`, its output streamed line by line into the run log."""
    logger = get_run_logger()
    cmd = dvc("repro", "--single-item", stage, *(["--force"] if force else []))
    logger.info("$ dvc %s", " ".join(cmd[3:]))
    start = time.monotonic()
    res = run_streaming(cmd, project_dir, dvc_env(project_dir), lambda _stream, line: logger.info(line))
    seconds = round(time.monotonic() - start, 1)
    if res.returncode != 0:
        tail = "\n".join(res.stderr_tail or res.stdout.splitlines()[-20:])
        raise StageFailed(f"stage {stage!r} failed (dvc exit {res.returncode}):\n{tail}")
    skipped = f"Stage '{stage}' didn't change, skipping" in res.stdout
    return {"stage": stage, "status": "up to date" if skipped else "ran", "seconds": seconds}


def _all_mappings(values) -> bool:
    values = list(values)
    return bool(values) and all(isinstance(v, dict) for v in values)


def metrics_rows(metrics: Any) -> list[dict[str, Any]]:
    """A readable table from a metrics file.

    {policy: {level: {metric: x}}} (evaluate's layout) -> one row per policy and level;
    {name: {metric: x}} -> one row per name; a list of mappings -> one row each; else key/value rows.
    """
    if isinstance(metrics, list) and _all_mappings(metrics):
        return [flatten(r) for r in metrics]
    if isinstance(metrics, dict) and _all_mappings(metrics.values()):
        if all(_all_mappings(v.values()) for v in metrics.values()):
            return [{"policy": k, "level": k2, **flatten(v2)} for k, v in metrics.items() for k2, v2 in v.items()]
        return [{"name": k, **flatten(v)} for k, v in metrics.items()]
    return [{"metric": k, "value": v} for k, v in flatten(metrics).items()]


def publish_results(project: Path, metrics_file: str, report_file: str, dag: Dag | None = None,
                    stages: list[str] | None = None) -> None:
    """Evaluation metrics as a table artifact and the report as a markdown artifact, when they exist
    and (given the `dag`) the stage that writes each was among this run's `stages` (ran, or found up
    to date). Before, a run of `--targets rl` published the last evaluation's metrics as if they were
    this run's."""
    logger = get_run_logger()
    metrics_path, report_path = project / metrics_file, project / report_file

    def this_runs(path: str) -> bool:
        if dag is None:
            return True
        if (writer := dag.writer(path)) in (stages or []):
            return True
        logger.info("%s not published: %s", path, f"its stage {writer} was not run" if writer else "no stage writes it")
        return False

    if metrics_path.exists() and this_runs(metrics_file):
        try:
            rows = metrics_rows(json.loads(metrics_path.read_text()))
            create_table_artifact(rows, key="evaluation-metrics", description=f"`{metrics_file}` after this run")
        except (ValueError, TypeError) as e:
            logger.warning("could not publish %s: %s", metrics_file, e)
    if report_path.exists() and this_runs(report_file):
        text = embed_images(report_path.read_text(), report_path.parent)
        create_markdown_artifact(text, key="report", description=f"`{report_file}` after this run")


IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".svg": "image/svg+xml"}


def embed_images(markdown: str, base: Path) -> str:
    """Markdown with its images relative to `base` inlined as data: URIs (the Prefect UI cannot
    reach files of the project); links to other places and missing files are left as they are."""
    def inline(m: re.Match) -> str:
        path = base / m.group(2)
        if "://" in m.group(2) or path.suffix.lower() not in MIME or not path.is_file():
            return m.group(0)
        data = base64.b64encode(path.read_bytes()).decode()
        return f"![{m.group(1)}](data:{MIME[path.suffix.lower()]};base64,{data})"

    return IMAGE.sub(inline, markdown)


@flow(name="pipeline")
def pipeline(
    project_dir: str = ".",
    targets: list[str] | None = None,
    force: bool = False,
    retries: int = 0,
    build_retries: int = 1,
    retry_delay_seconds: float = 10.0,
    metrics_file: str = METRICS_FILE,
    report_file: str = REPORT_FILE,
) -> list[dict[str, Any]]:
    """Reproduce the DVC pipeline stage by stage (all stages, or `targets` and what they need).

    Args:
        project_dir: the DVC project (folder holding dvc.yaml).
        targets: stage names to reproduce with their upstream stages; empty = every stage.
        force: rerun stages even when DVC finds them up to date.
        retries: retries of a failed stage.
        build_retries: retries of stages whose name starts with `build_` (environment builds).
        retry_delay_seconds: wait before a retry.
        metrics_file: evaluation metrics shown as a table artifact at the end.
        report_file: markdown report shown as an artifact at the end.
    """
    logger = get_run_logger()
    project = Path(project_dir).resolve()
    dag = read_dag(project)
    stages = dag.select(targets)
    logger.info("stages in run order: %s", ", ".join(stages))
    summary = []
    for stage in stages:
        n = build_retries if stage.split(":")[-1].startswith("build_") else retries
        step = run_stage.with_options(retries=n, retry_delay_seconds=retry_delay_seconds)
        summary.append(step(stage, str(project), force))  # a failure raises and ends the flow here
    create_table_artifact(summary, key="pipeline-stages", description="DVC stages of this run")
    publish_results(project, metrics_file, report_file, dag, stages)
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project-dir", default=".")
    parser.add_argument("--targets", nargs="*", default=None)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    pipeline(project_dir=args.project_dir, targets=args.targets, force=args.force)


if __name__ == "__main__":
    main()
