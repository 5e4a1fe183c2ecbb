"""The Prefect flows: the DAG in dvc.yaml order, failures, sweeps; their helpers; the deployments."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # flows/ is a top-level folder, not part of the installed package

from flows.dvc_dag import Dag, flatten  # noqa: E402
from flows.pipeline import metrics_rows  # noqa: E402
from flows.sweep import (  # noqa: E402
    expand, experiment_name, hydra_value, parse_queue_status, plot_columns, point_overrides, resolve_spec, summary_columns,
)

PRESETS = sorted(p.stem for p in (ROOT / "params" / "sweep").glob("*.yaml"))


# ------------------------------------------------------------------ helpers
@pytest.mark.parametrize(
    "value", ["ppo", "w2-o3-q4", "a b", "1.0", "true", "it's", 0.2, -1, 1e-5, True, None, [], [6, 10, 14], ["w2-o3-q4", "x y"], {"a": 1}]
)
def test_hydra_value_round_trips_through_hydras_parser(value):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert OverridesParser.create().parse_override(f"k={hydra_value(value)}").value() == value


def test_experiment_names_are_readable_unique_and_ref_safe():
    taken: set[str] = set()
    names = [
        experiment_name("s", {"rl": "ppo", "reward": "dense"}, taken),
        experiment_name("s", {"train.lr": -1.0}, taken),
        experiment_name("s", {"train.lr": 1.0}, taken),
        experiment_name("s", {"rl.turn_schedule": []}, taken),
        experiment_name("s", {"env.levels": ["w2-o3-q4", "w4-o6-q8"]}, taken),
        experiment_name("s", {"rl": "ppo", "reward": "dense"}, taken),
        experiment_name("s", {"x": "a" * 200}, taken),
    ]
    assert names[:5] == ["s-rl-ppo-reward-dense", "s-lr-m1.0", "s-lr-1.0", "s-turn_schedule-none", "s-levels-w2-o3-q4-w4-o6-q8"]
    assert names[5] == "s-rl-ppo-reward-dense-2" and len(names[6]) <= 80 and len(set(names)) == len(names)
    for name in names:
        assert subprocess.run(["git", "check-ref-format", f"refs/exps/{name}"]).returncode == 0, name


def test_grid_expands_to_every_combination_then_explicit_points():
    points = expand({"rl": ["ppo", "grpo"], "reward": ["sparse", "dense"]}, [{"rl": "rloo"}])
    assert points == [
        {"rl": "ppo", "reward": "sparse"}, {"rl": "ppo", "reward": "dense"},
        {"rl": "grpo", "reward": "sparse"}, {"rl": "grpo", "reward": "dense"}, {"rl": "rloo"},
    ]
    with pytest.raises(ValueError, match="non-empty list"):
        expand({"rl": "ppo"})
    with pytest.raises(ValueError, match="no points"):
        expand({}, [])


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="budget_split"):
        resolve_spec(ROOT, None, None, "nope", None, None, None)


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_compose_into_valid_params(preset):
    """Every point of every preset is a valid Hydra override set for the real params/ tree."""
    from agentrecipe.config import parse_config
    from agentrecipe.params import compose

    spec = resolve_spec(ROOT, None, None, preset, ["experiment=micro"], None, None)
    assert spec.name == preset and len(spec.points) >= 2
    for point in spec.points:
        overrides = [*spec.overrides, *point_overrides(point)]
        parse_config(compose(ROOT / "params", overrides), None, " ".join(overrides))


def test_paper_ablation_presets_exist():
    assert {"budget_split", "algo_x_reward", "env_complexity", "turn_schedule"} <= set(PRESETS)


def test_sweep_presets_are_not_a_config_group_of_the_recipe(tmp_path):
    from agentrecipe.cli import main

    out = tmp_path / "params.yaml"
    assert main(["compose-params", "--config-dir", str(ROOT / "params"), "--output", str(out)]) == 0
    composed = yaml.safe_load(out.read_text())
    assert "sweep" not in composed and "grid" not in composed


def test_parse_queue_status():
    text = textwrap.dedent("""\
        Task     Name       Created    Status
        fdd67b5  sw-a       11:29 AM   Running
        9ade321  sw-b       Nov 30, 2025   Failed

        Worker status: 1 active, 0 idle
    """)
    rows, workers = parse_queue_status(text)
    assert rows == [{"task": "fdd67b5", "name": "sw-a", "status": "Running"}, {"task": "9ade321", "name": "sw-b", "status": "Failed"}]
    assert workers == (1, 0)
    assert parse_queue_status("No experiment tasks in the queue.\n\nWorker status: 0 active, 0 idle\n") == ([], (0, 0))


def test_metrics_tables():
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": 3}) == {"a.b": 1, "a.c.d": 2, "e": 3}
    assert metrics_rows({"rl": {"success": 0.5}, "sft": {"success": 0.25}}) == [
        {"name": "rl", "success": 0.5}, {"name": "sft", "success": 0.25}
    ]
    assert metrics_rows({"success": 0.5, "by": {"w1": 1}}) == [{"metric": "success", "value": 0.5}, {"metric": "by.w1", "value": 1}]
    assert metrics_rows([{"policy": "rl", "x": {"y": 1}}]) == [{"policy": "rl", "x.y": 1}]
    # evaluate's layout: policy -> level -> metrics
    assert metrics_rows({"rl": {"w1": {"success": 1.0}, "ood": {"success": 0.5}}, "sft": {"w1": {"success": 0.0}}}) == [
        {"policy": "rl", "level": "w1", "success": 1.0}, {"policy": "rl", "level": "ood", "success": 0.5},
        {"policy": "sft", "level": "w1", "success": 0.0},
    ]


def test_sweep_plots_and_summarises_success_columns():
    rows = [{"experiment": "e", "status": "success", "rl": "ppo", "rl.ood.success": 0.5, "rl.ood.score": 1.0, "n": 2, "error": ""}]
    assert plot_columns(rows, ["rl"], ["rl.ood.success"]) == ["rl.ood.success"]
    assert plot_columns(rows, ["rl"], ["renamed.metric"]) == ["rl.ood.success"]  # falls back, never empty
    assert plot_columns([{k: v for k, v in rows[0].items() if "success" not in k}], ["rl"], []) == ["rl.ood.score", "n"]
    assert summary_columns(rows, ["rl"], [], most=4) == ["experiment", "status", "rl", "rl.ood.success", "error"]


def test_dag_select_takes_targets_and_their_upstream_in_run_order():
    dag = Dag(["a", "b", "c", "d"], {"a": [], "b": [], "c": ["a"], "d": ["b", "c"]})
    assert dag.select(None) == ["a", "b", "c", "d"]
    assert dag.select(["c"]) == ["a", "c"]
    assert dag.select(["dvc.yaml:d"]) == ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="unknown stage 'x'"):
        dag.select(["x"])


def test_real_project_dag_comes_from_dvc_yaml():
    from flows.dvc_dag import read_dag

    dag = read_dag(ROOT)
    declared = list(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])
    assert sorted(dag.stages) == sorted(declared)
    for stage, ups in dag.upstream.items():
        assert all(dag.stages.index(u) < dag.stages.index(stage) for u in ups)


def test_deployments_of_prefect_yaml_load():
    from flows.serve import load_deployments

    deployments = {d.name: d for d in load_deployments(ROOT)}
    assert set(deployments) == {"default-recipe", "ablation"}
    assert [s.schedule.cron for s in deployments["default-recipe"].schedules] == ["0 2 * * *"]
    assert deployments["ablation"].parameters["preset"] in PRESETS


# ------------------------------------------------ flows on a temporary DVC project
@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """A temporary Prefect server and database for the whole session (about 15 s to start)."""
    env = {
        "PREFECT_HOME": str(tmp_path_factory.mktemp("prefect-home")),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "DO_NOT_TRACK": "1",
        "DVC_NO_ANALYTICS": "1",
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        from prefect.settings import PREFECT_HOME, temporary_settings
        from prefect.testing.utilities import prefect_test_harness

        with temporary_settings(updates={PREFECT_HOME: env["PREFECT_HOME"]}), prefect_test_harness(server_startup_timeout=None):
            yield


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def make_project(root: Path, dvc_yaml: str, files: dict[str, str]) -> Path:
    """git + DVC project with Hydra params (params/config.yaml, group train), committed."""
    from agentrecipe.params import compose_yaml

    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q")
    for key, value in {"user.name": "test", "user.email": "test@example.com", "commit.gpgsign": "false"}.items():
        git(root, "config", key, value)
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run([*dvc, "init", "-q"], cwd=root, check=True)
    for key, value in {"core.analytics": "false", "core.site_cache_dir": ".cache/dvc-site", "hydra.enabled": "true",
                       "hydra.config_dir": "params", "hydra.config_name": "config"}.items():
        subprocess.run([*dvc, "config", key, value], cwd=root, check=True)
    files = {
        "params/config.yaml": "defaults:\n  - train: small\n  - _self_\nseed: 0\n",
        "params/train/small.yaml": "lr: 0.1\nsteps: 2\n",
        "params/train/big.yaml": "lr: 0.5\nsteps: 4\n",
        ".gitignore": "/data/\n/.cache/\n",
        "dvc.yaml": dvc_yaml,
        **files,
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "params.yaml").write_text(compose_yaml(root / "params"))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "project")
    return root


# Writes data/eval/metrics.json from params.yaml; refuses a negative learning rate.
SCORE_PY = """\
import json, os, sys, yaml
p = yaml.safe_load(open("params.yaml"))["train"]
if p["lr"] < 0:
    sys.exit(f"score: lr must be >= 0, got {p['lr']}")
os.makedirs("data/eval", exist_ok=True)
json.dump({"rl": {"success": p["lr"] * 10}, "sft": {"success": p["steps"]}}, open("data/eval/metrics.json", "w"))
"""

DAG_YAML = """\
stages:
  build_data:
    cmd: mkdir -p data && echo raw > data/raw.txt && echo built-data
    outs: [data/raw.txt]
  train:
    cmd: python score.py
    deps: [data/raw.txt, score.py]
    params: [train.lr, train.steps]
    outs: [data/eval/metrics.json]
  report:
    cmd: mkdir -p data/report && (echo '# Report'; cat data/raw.txt data/eval/metrics.json) > data/report/report.md
    deps: [data/raw.txt, data/eval/metrics.json]
    outs: [data/report/report.md]
"""


def task_runs_in_start_order(flow_run_id) -> list[tuple[str, str]]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    runs.sort(key=lambda r: r.start_time)
    return [(r.name, r.state_type.value) for r in runs]


def artifact(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC, limit=1
        )
    return found[0] if found else None


@pytest.mark.slow
def test_pipeline_runs_every_stage_in_dag_order(prefect_harness, tmp_path):
    from flows.pipeline import pipeline

    project = make_project(tmp_path / "p", DAG_YAML, {"score.py": SCORE_PY})
    state = pipeline(project_dir=str(project), return_state=True)
    assert state.is_completed(), state.message
    assert [s["status"] for s in state.result()] == ["ran", "ran", "ran"]
    assert task_runs_in_start_order(state.state_details.flow_run_id) == [
        ("build_data", "COMPLETED"), ("train", "COMPLETED"), ("report", "COMPLETED")
    ]
    assert (project / "data/report/report.md").exists()
    assert json.loads(artifact("evaluation-metrics").data) == [{"name": "rl", "success": 1.0}, {"name": "sft", "success": 2}]
    assert artifact("report").data.startswith("# Report")

    # DVC decides what is up to date; targets select a stage and what it needs.
    again = pipeline(project_dir=str(project), targets=["train"])
    assert [(s["stage"], s["status"]) for s in again] == [("build_data", "up to date"), ("train", "up to date")]


FAILING_YAML = """\
stages:
  build_flaky:
    cmd: mkdir -p data && if [ -f .tried ]; then echo ok > data/env.txt; else touch .tried; echo flaky build >&2; exit 1; fi
    outs: [data/env.txt]
  train:
    cmd: "echo starting; echo 'boom: the loss is NaN' >&2; exit 3"
    deps: [data/env.txt]
  report:
    cmd: echo never > report.txt
    deps: [data/env.txt]
    outs: [report.txt]
"""


@pytest.mark.slow
def test_failed_stage_fails_the_flow_with_its_message(prefect_harness, tmp_path):
    from flows.pipeline import pipeline

    project = make_project(tmp_path / "p", FAILING_YAML, {".gitignore": "/data/\n/.cache/\n.tried\n/report.txt\n"})
    state = pipeline(project_dir=str(project), retry_delay_seconds=0, return_state=True)
    assert state.is_failed()
    assert "stage 'train' failed" in state.message and "boom: the loss is NaN" in state.message
    runs = task_runs_in_start_order(state.state_details.flow_run_id)
    # build_flaky failed once and passed on its retry; nothing ran after train.
    assert runs == [("build_flaky", "COMPLETED"), ("train", "FAILED")]
    assert not (project / "report.txt").exists()


SWEEP_YAML = """\
stages:
  train:
    cmd: python score.py
    deps: [score.py]
    params: [train.lr, train.steps]
    metrics: [data/eval/metrics.json]
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sweep_collects_every_point_into_one_table(prefect_harness, tmp_path):
    from flows.sweep import sweep

    project = make_project(tmp_path / "p", SWEEP_YAML, {"score.py": SCORE_PY})
    rows = sweep(grid={"train.lr": [0.2, 0.3]}, points=[{"train.lr": -1.0}], project_dir=str(project), poll_s=1, timeout_s=400)

    by_name = {r["experiment"]: r for r in rows}
    assert list(by_name) == ["grid-lr-0.2", "grid-lr-0.3", "grid-lr-m1.0"]
    assert by_name["grid-lr-0.2"]["status"] == "success" and by_name["grid-lr-0.2"]["rl.success"] == pytest.approx(2.0)
    assert by_name["grid-lr-0.3"]["status"] == "success" and by_name["grid-lr-0.3"]["rl.success"] == pytest.approx(3.0)
    assert by_name["grid-lr-m1.0"]["status"] == "failed" and "lr must be >= 0" in by_name["grid-lr-m1.0"]["error"]

    out = project / "data/sweeps/grid"
    with (out / "results.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["train.lr"] for r in table] == ["0.2", "0.3", "-1.0"] and table[1]["rl.success"] == "3.0"
    assert (out / "results.png").stat().st_size > 0
    assert [r["experiment"] for r in json.loads(artifact("sweep-grid").data)] == list(by_name)
