"""The Prefect flows: the DAG in dvc.yaml order, failures, sweeps; their helpers; the deployments."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # flows/ is a top-level folder, not part of the installed package

from agentrecipe.report.compare import flatten  # noqa: E402
from flows.dvc_dag import Dag  # noqa: E402
from flows.pipeline import embed_images, metrics_rows  # noqa: E402
from flows.sweep import expand, load_preset, point_names, seed_major, select_points, swept_keys  # noqa: E402

PRESETS = sorted(p.stem for p in (ROOT / "params" / "sweep").glob("*.yaml"))


# ------------------------------------------------------------------ helpers
def test_sweeps_expand_as_dvc_does_first_key_slowest():
    assert expand([["env=dense", "rl=ppo,grpo", "reward=sparse,dense"], ["rl=rloo"]]) == [
        ["env=dense", "rl=ppo", "reward=sparse"], ["env=dense", "rl=ppo", "reward=dense"],
        ["env=dense", "rl=grpo", "reward=sparse"], ["env=dense", "rl=grpo", "reward=dense"], ["rl=rloo"],
    ]
    # Hydra's own syntax for lists: three points, each with one list.
    assert expand([["env.levels=[a],[b,c]"]]) == [["env.levels=[a]"], ["env.levels=[b,c]"]]


def test_points_run_seed_by_seed():
    points = expand([["a=1,2", "seed=0,1"], ["a=3", "seed=0,1"]])
    assert [" ".join(p) for p in seed_major(points)] == ["a=1 seed=0", "a=2 seed=0", "a=3 seed=0",
                                                         "a=1 seed=1", "a=2 seed=1", "a=3 seed=1"]
    assert seed_major([["a=1"], ["a=2"]]) == [["a=1"], ["a=2"]]  # no seed axis: as expanded


def test_results_record_the_seed_of_a_one_seed_sweep():
    from flows.sweep import result_keys

    assert result_keys(expand([["a=1,2", "seed=0,1"]])) == ["a", "seed"]
    assert result_keys(expand([["a=1,2", "seed=0"]])) == ["a", "seed"]  # summed up as one seed per setting
    assert result_keys(expand([["a=1,2"]])) == ["a"]  # no seed set: nothing to sum up
    assert result_keys(expand([["a=1", "seed=0"], ["a=2"]])) == ["a", "seed"]  # seed differs (set vs unset)


def test_points_are_named_after_the_values_they_sweep():
    points = expand([["env=dense", "rl=ppo,reinforce_pp", "reward=sparse,dense"], ["rl=rloo"]])
    assert swept_keys(points) == ["env", "rl", "reward"]  # env is missing from the last point
    assert point_names(points) == [
        "env-dense_rl-ppo_reward-sparse", "env-dense_rl-ppo_reward-dense",
        "env-dense_rl-reinforce_pp_reward-sparse", "env-dense_rl-reinforce_pp_reward-dense", "rl-rloo",
    ]
    assert point_names(expand([["x=1", "train.lr=0.2,-1", "rl.turn_schedule=[],[6,10]"]])) == [
        "lr-0.2_turn_schedule-none", "lr-0.2_turn_schedule-6-10", "lr-m1_turn_schedule-none", "lr-m1_turn_schedule-6-10",
    ]
    assert point_names([["a=1"]]) == ["a-1"]  # nothing differs: every override names it
    assert point_names([["a=1"], ["a=1"]]) == ["a-1", "a-1-2"]
    # a suffixed name that another point has: before, two points shared a name and one was dropped
    twice = [["t=[6,3]", "s=0"], ["t=[6]", "s=0"], ["t=[6]", "s=0"]]
    assert point_names(twice) == ["t-6-3", "t-6", "t-6-3-1"]
    for name in point_names(points):
        assert subprocess.run(["git", "check-ref-format", f"refs/exps/{name}"]).returncode == 0, name


def test_point_selection_keeps_the_sweep_order_and_refuses_unknown_names():
    named = {"a-1": ["a=1"], "a-2": ["a=2"], "a-3": ["a=3"]}
    assert select_points(named, None) == named and select_points(named, []) == named
    assert list(select_points(named, ["a-3", "a-1"])) == ["a-1", "a-3"]
    with pytest.raises(ValueError, match="no point named a-9 in this sweep; its points: a-1, a-2, a-3"):
        select_points(named, ["a-9"])


def test_an_override_that_makes_two_points_one_run_is_refused():
    """turn_schedule's fixed-limit sweep and its schedule sweep differ only in rl.turn_schedule: with it
    overridden, max_turns=14 came twice and the seed summary counted its games twice (seeds 0 0 1 1 2 2)."""
    from flows.sweep import sweep_points

    assert len(sweep_points(ROOT, "turn_schedule", ["experiment=micro"])) == 9
    with pytest.raises(ValueError, match=r"points max_turns-14_seed-0 and max_turns-14_seed-0-3 are the same run"):
        sweep_points(ROOT, "turn_schedule", ["rl.turn_schedule=[]"])


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="budget_split"):
        load_preset(ROOT, "nope")


# The micro sizes of a preset: micro's 40 budget units buy no demonstration at 0.2 (one costs 10), and
# 4 train games hold no more than 4; 5 games at a cost of 8 buy 1, 3 and 5 at 0.2, 0.6 and 1.
MICRO = {"budget_split": ["experiment=micro", "env.n_train=5", "budget.demo_cost=8"]}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("scale", ["preset", "micro"])
def test_presets_compose_into_valid_params(preset, scale):
    """Every point of every preset, at its own scale and at micro, is a valid Hydra override set for
    the real params/ tree."""
    from agentrecipe.config import parse_config
    from agentrecipe.params import compose

    extra = [] if scale == "preset" else MICRO.get(preset, ["experiment=micro"])
    points = expand([[*s, *extra] for s in load_preset(ROOT, preset)["sweeps"]])
    assert len(points) >= 2 and len(set(point_names(points))) == len(points)
    for overrides in points:
        parse_config(compose(ROOT / "params", overrides), None, " ".join(overrides))


def test_paper_ablation_presets_exist():
    assert {"budget_split", "algo_x_reward", "env_complexity", "turn_schedule", "rl_algos"} <= set(PRESETS)


def test_sweep_presets_are_not_a_config_group_of_the_recipe(tmp_path):
    from agentrecipe.cli import main

    out = tmp_path / "params.yaml"
    assert main(["compose-params", "--config-dir", str(ROOT / "params"), "--output", str(out)]) == 0
    composed = yaml.safe_load(out.read_text())
    assert "sweep" not in composed and "sweeps" not in composed


def test_compose_params_answers_a_bad_override_in_one_line(tmp_path, capsys):
    """Before, a traceback of 12 to 61 lines ended with the message."""
    from agentrecipe.cli import main

    out = tmp_path / "params.yaml"
    for override, words in (("rl.gamma=0.9", "rl.gamma: grpo compares episode returns"), ("rl=foo", "Could not find 'rl/foo'"),
                            ("rl.learning_rate=1", "Could not override 'rl.learning_rate'")):
        assert main(["compose-params", "--output", str(out), override]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and words in err and "Traceback" not in err
    assert not out.exists()


def test_report_images_are_embedded_for_the_ui(tmp_path):
    png = b"\x89PNG\r\n\x1a\nfake"
    (tmp_path / "curves.png").write_bytes(png)
    text = "# R\n![RL curves](curves.png)\n![gone](missing.png) ![web](https://x.org/a.png) [link](curves.png)\n"
    assert embed_images(text, tmp_path) == (
        "# R\n![RL curves](data:image/png;base64,iVBORw0KGgpmYWtl)\n"
        "![gone](missing.png) ![web](https://x.org/a.png) [link](curves.png)\n"
    )


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
    from flows.settings import PREFECT_ENV

    env = {"PREFECT_HOME": str(tmp_path_factory.mktemp("prefect-home")), **PREFECT_ENV}
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
    report = artifact("report").id
    again = pipeline(project_dir=str(project), targets=["train"])
    assert [(s["stage"], s["status"]) for s in again] == [("build_data", "up to date"), ("train", "up to date")]
    assert artifact("report").id == report  # its stage did not run: the last report is not published as this run's


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


# The layout of data/eval/metrics.json: success with its interval, pooled in_domain and ood cells.
SWEEP_SCORE_PY = """\
import json, os, sys, yaml
params = yaml.safe_load(open("params.yaml"))
lr, seed = params["train"]["lr"], params["seed"]
if lr < 0:
    sys.exit(f"score: lr must be >= 0, got {lr}")
cell = {"success": lr + seed / 10, "success_ci_low": lr - 0.1, "success_ci_high": lr + 0.1, "n": 10}
os.makedirs("data/eval", exist_ok=True)
ood = {"success": lr / 2, "success_ci_low": lr / 2 - 0.05, "success_ci_high": lr / 2 + 0.05}
json.dump({"rl": {"in_domain": cell, "ood": ood}}, open("data/eval/metrics.json", "w"))
"""

SWEEP_YAML = """\
stages:
  train:
    cmd: python score.py
    deps: [score.py]
    params: [train.lr, train.steps, seed]
    metrics: [data/eval/metrics.json]
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sweep_runs_on_dvcs_queue_and_a_failed_point_fails_the_run(prefect_harness, tmp_path, capsys):
    from agentrecipe.cli import main
    from agentrecipe.report.compare import compare
    from flows.sweep import sweep

    allow_negative = tmp_path / "allow-negative-lr"  # the failure's cause, removed before the rerun
    score_py = SWEEP_SCORE_PY.replace("if lr < 0:", f"if lr < 0 and not os.path.exists({str(allow_negative)!r}):")
    project = make_project(tmp_path / "p", SWEEP_YAML, {"score.py": score_py})
    state = sweep(overrides=["train.lr=0.2,0.3,-1"], project_dir=str(project), return_state=True)
    assert state.is_failed() and "1 of 3 points failed (lr-m1: failed, " in state.message
    assert "score: lr must be >= 0, got -1" in state.message  # the failed point's own error, for CI logs

    with (project / "data/sweeps/sweep/results.csv").open() as f:
        table = {r["experiment"]: r for r in csv.DictReader(f)}
    assert list(table) == ["lr-0.2", "lr-0.3", "lr-m1"]
    assert table["lr-0.3"]["state"] == "success" and table["lr-0.3"]["train.lr"] == "0.3"
    assert table["lr-0.3"]["rl.in_domain.success"] == "0.3" and table["lr-0.3"]["rl ood"] == "15.0 [10.0, 20.0]"
    assert table["lr-0.3"]["rl in-domain"] == "30.0 [20.0, 40.0]" and table["lr-0.3"]["error"] == ""
    # DVC gives the failed point the baseline's metrics; its row holds none, and its error.
    failed = table["lr-m1"]
    assert failed["state"] == "failed" and failed["rl in-domain"] == "–" and failed["rl.in_domain.success"] == ""
    assert "lr must be >= 0, got -1" in failed["error"] and len(failed["error"]) <= 300
    assert (project / "data/sweeps/sweep/results.png").stat().st_size > 0
    shown = json.loads(artifact("sweep-sweep").data)
    assert list(shown[0]) == ["experiment", "state", "train.lr", "rl in-domain", "rl ood", "sft in-domain", "sft ood", "error"]
    assert [r["experiment"] for r in shown] == list(table)

    # The comparison: the params that differ (train.lr only), success with intervals, in 120 columns.
    text = compare(project)
    lines = text.splitlines()
    assert lines[0].split() == ["experiment", "state", "train.lr", "rl", "in-domain", "rl", "ood"]
    assert all(len(line) <= 120 for line in lines)
    by_name = {line.split()[0]: line.split(None, 3) for line in lines[1:]}
    assert set(by_name) == {"master", "lr-0.2", "lr-0.3", "lr-m1"}
    assert by_name["lr-0.3"][1:3] == ["success", "0.3"] and by_name["lr-0.3"][3] == "30.0 [20.0, 40.0]  15.0 [10.0, 20.0]"
    assert by_name["lr-m1"][1:3] == ["failed", "-1"] and by_name["lr-m1"][3] == "–                  –"
    capsys.readouterr()
    assert main(["compare", "--project", str(project), "lr-0.3", "lr-m1", "--width", "60"]) == 0
    narrow = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in narrow[1:]] == ["lr-0.3", "lr-m1"] and all(len(line) <= 60 for line in narrow)

    # Run again on the same commit: the experiment of the same name is replaced, not refused; the point
    # that failed, its cause gone, succeeds (before, its failed run stayed in DVC's queue and was
    # listed after the new one: the table showed the old failure for good).
    allow_negative.touch()
    again = sweep(overrides=["train.lr=0.3,-1"], project_dir=str(project), name="again")
    assert [(r["experiment"], r["state"]) for r in again] == [("lr-0.3", "success"), ("lr-m1", "success")]
    assert again[1]["rl.in_domain.success"] == -1 and again[1]["error"] == ""
    assert not (project / "data/sweeps/again/summary.csv").exists()  # one seed: nothing to sum up

    # A seed axis: the points that differ only in seed, summed up (0.3 and 0.4 of 10 episodes each).
    sweep(overrides=["train.lr=0.3", "seed=0,1"], project_dir=str(project), name="seeds")
    with (project / "data/sweeps/seeds/summary.csv").open() as f:
        (summary,) = list(csv.DictReader(f))
    assert (summary["seeds"], summary["rl in-domain per seed"], summary["rl in-domain episodes"]) == ("0 1", "0.3 0.4", "20")
    # mean 0.35, s = 0.0707, t_{0.975, 1} = 12.706: half 0.635, clipped below at 0; pooled 7 of 20
    assert float(summary["rl in-domain mean"]) == pytest.approx(0.35)
    assert float(summary["rl in-domain low"]) == 0.0 and float(summary["rl in-domain high"]) == pytest.approx(0.9853, abs=1e-4)
    assert float(summary["rl in-domain pooled"]) == pytest.approx(0.35)
    assert (project / "data/sweeps/seeds/summary.png").stat().st_size > 0
    shown = json.loads(artifact("sweep-seeds-seeds").data)
    assert shown[0]["seeds"] == "0 1" and shown[0]["rl in-domain per seed"] == "30 40"

    # A point whose experiment (of an earlier run) has other params than its overrides compose to now,
    # as the others of a `--point` rerun given another `--override`: stale, no numbers, not summed up.
    from prefect import flow

    from flows.sweep import collect_results

    points = {"seed-0": ["train.lr=0.3", "seed=0", "train.steps=3"], "seed-1": ["train.lr=0.3", "seed=1"]}

    @flow(name="collect")
    def collect(baseline=None):
        return collect_results(str(project), points, "data/sweeps/mixed", "mixed", baseline=baseline)

    rows = collect()
    assert [(r["experiment"], r["state"]) for r in rows] == [("seed-0", "stale"), ("seed-1", "success")]
    assert rows[0]["error"] == "ran with other params than this point's (train.steps 2, not 3); rerun it: --point seed-0"
    assert rows[0]["rl in-domain"] == "–" and "rl.in_domain.success" not in rows[0]

    # The results are those of the commit the points were queued on, wherever HEAD is by then. Before,
    # a checkout during a long sweep read the other commit's experiments of the same names.
    from flows.sweep import head_commit

    queued_on = head_commit(str(project))
    small = project / "params/train/small.yaml"  # a commit made while the sweep ran, with other params
    small.write_text(small.read_text().replace("steps: 2", "steps: 3"))
    git(project, "commit", "-qam", "more steps")
    assert [r["state"] for r in collect()] == ["missing", "missing"]  # HEAD's experiments: none of these
    # checked against the params of the commit they were queued on, not HEAD's (steps 3 would make
    # seed-1 stale and seed-0 current)
    assert [r["state"] for r in collect(queued_on)] == ["stale", "success"]


FINDINGS = ["budget_split", "algo_x_reward", "env_complexity", "turn_schedule", "alfworld_sft_rl"]


def test_finding_presets_sweep_three_seeds_at_the_findings_scale():
    for preset in FINDINGS:
        for sweep_overrides in load_preset(ROOT, preset)["sweeps"]:
            assert sweep_overrides[0] == "experiment=findings" and "seed=0,1,2" in sweep_overrides, preset


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_finding_presets_micro_run_through_the_sweep_flow(prefect_harness, tmp_path, subprocess_env):
    """Each finding preset's micro version (`experiment=micro seed=0` added: the last value of a key
    wins) through the flow on DVC's real queue, in a copy of this project, up to the validate stage:
    one point of each (`--point`) queued, composed by DVC's Hydra and validated (every key, the
    cross-section checks), then the whole sweep collected. Every point of every preset is composed
    and validated in-process by test_presets_compose_into_valid_params; the whole DAG of a micro
    point is test_pipeline_e2e.py's."""
    from flows.sweep import sweep, sweep_points
    from tests.dvc_project import copy_project

    (tmp_path / "p").mkdir()
    project = copy_project(tmp_path / "p", subprocess_env)
    # dvc.lock names outputs that this copy's cache lacks: a run of `validate` only would fail to save them
    git(project, "rm", "-q", "dvc.lock")
    git(project, "commit", "-qm", "no lock")
    points_of = {}
    for preset in FINDINGS:
        micro = "experiment=alfworld_micro" if preset == "alfworld_sft_rl" else "experiment=micro"
        names = points_of[preset] = list(sweep_points(project, preset, [micro, "seed=0"]))
        picked = names[-1:] if preset == "turn_schedule" else names[:1]
        rows = sweep(preset=preset, overrides=[micro, "seed=0"], project_dir=str(project), targets=["validate"],
                     only=picked)
        assert [r["experiment"] for r in rows] == names, preset  # the table holds the whole sweep
        assert [r["state"] for r in rows if r["experiment"] in picked] == ["success"], preset
        assert all(r["state"] == "missing" for r in rows if r["experiment"] not in picked), preset
        # evaluate did not run: the experiment holds the commit's data/eval/metrics.json, not its own
        # results (before, every point of such a sweep showed those same committed numbers)
        [ran] = [r for r in rows if r["experiment"] in picked]
        assert ran["rl in-domain"] == "–" and "rl.in_domain.success" not in ran and "--target" in ran["error"], preset
        record = json.loads((project / f"data/sweeps/{preset}/run.json").read_text())
        assert record["points"] == len(names) and record["succeeded"] == 1
        assert record["command"] == f"python -m flows.sweep --preset {preset} --override {micro} --override seed=0 " \
                                    f"--target validate --point {picked[0]}"
    # Finishing a sweep with another point: both succeed in its table, the first run's record is kept.
    names = points_of["turn_schedule"]
    rows = sweep(preset="turn_schedule", overrides=["experiment=micro", "seed=0"], project_dir=str(project),
                 targets=["validate"], only=names[:1])
    assert [r["state"] for r in rows] == ["success", "missing", "success"]
    assert [r["rl in-domain"] for r in rows] == ["–", "–", "–"]  # the earlier point's, from run.json, too
    record = json.loads((project / "data/sweeps/turn_schedule/run.json").read_text())
    assert record["succeeded"] == 2 and [r["command"].split()[-1] for r in record["earlier"]] == [names[-1]]
    assert record["without_metrics"] == [names[0], names[-1]]


SLEEP_YAML = """\
stages:
  train:
    cmd: python sleep.py
    params: [train.lr]
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sweep_timeout_kills_the_queue(prefect_harness, tmp_path):
    """Prefect's task timeout ends the wait; nothing of the sweep stays running or queued."""
    import psutil

    from flows.sweep import sweep

    # each point's process writes its pid where the test reads it (the point runs in DVC's own copy)
    pids = tmp_path / "sleeper_pids"
    sleep_py = f"import os, time\nwith open({str(pids)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\ntime.sleep(900)\n"
    project = make_project(tmp_path / "p", SLEEP_YAML, {"sleep.py": sleep_py})
    timeout_s = 30
    state = sweep(overrides=["train.lr=0.1,0.2"], project_dir=str(project), timeout_s=timeout_s, return_state=True)
    assert state.is_failed() and "the queue did not finish" in state.message and "timeout" in state.message
    with (project / "data/sweeps/sweep/results.csv").open() as f:
        assert [r["state"] != "success" for r in csv.DictReader(f)] == [True, True]
    status = subprocess.run([sys.executable, "-m", "dvc", "queue", "status"], cwd=project, capture_output=True, text=True)
    assert "Running" not in status.stdout and "Queued" not in status.stdout, status.stdout
    # a point was running when the timeout came (else nothing here would test the kill), and it is gone
    started = [int(pid) for pid in pids.read_text().split()] if pids.exists() else []
    assert started, f"no point had started within the {timeout_s} s timeout: the kill went untested"
    procs = []
    for pid in started:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass

    def running(proc) -> bool:
        try:
            return proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    alive = [p for p in psutil.wait_procs(procs, timeout=30)[1] if running(p)]
    assert alive == [], f"sleepers still running after the timeout: {alive}"
    sleepers = [p for p in psutil.process_iter(["cmdline"]) if "sleep.py" in " ".join(p.info["cmdline"] or [])]
    assert psutil.wait_procs(sleepers, timeout=30)[1] == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sweep_stop_after_lets_the_running_point_finish_and_runs_no_other(prefect_harness, tmp_path):
    """--stop-after-s: the point running at the deadline finishes and is collected, the queued ones are
    removed (not run, named in run.json), nothing stays queued, and the run completes."""
    from flows.sweep import sweep

    # The first point is well under way at the deadline (a queue worker starts it within seconds), and
    # runs on past it.
    slow = SWEEP_YAML.replace("cmd: python score.py", "cmd: python -c 'import time; time.sleep(25)' && python score.py")
    project = make_project(tmp_path / "p", slow, {"score.py": SWEEP_SCORE_PY})
    state = sweep(overrides=["train.lr=0.1,0.2,0.3"], project_dir=str(project), stop_after_s=20, return_state=True)
    assert state.is_completed(), state.message
    rows = {r["experiment"]: r["state"] for r in state.result()}
    assert rows == {"lr-0.1": "success", "lr-0.2": "missing", "lr-0.3": "missing"}
    record = json.loads((project / "data/sweeps/sweep/run.json").read_text())
    assert record["not_run"] == ["lr-0.2", "lr-0.3"] and record["succeeded"] == 1
    assert record["command"].endswith("--stop-after-s 20")
    status = subprocess.run([sys.executable, "-m", "dvc", "queue", "status"], cwd=project, capture_output=True, text=True)
    assert "Running" not in status.stdout and "Queued" not in status.stdout, status.stdout

    # A stop before any worker is up: the late worker is told as it comes up and runs at most one point;
    # the run neither hangs nor leaves a point queued.
    state = sweep(overrides=["train.lr=0.4,0.5"], project_dir=str(project), name="late", stop_after_s=0,
                  return_state=True)
    assert state.is_completed(), state.message
    ran = [r["experiment"] for r in state.result() if r["state"] == "success"]
    not_run = json.loads((project / "data/sweeps/late/run.json").read_text()).get("not_run", [])
    assert len(ran) <= 1 and sorted(ran + not_run) == ["lr-0.4", "lr-0.5"]
    status = subprocess.run([sys.executable, "-m", "dvc", "queue", "status"], cwd=project, capture_output=True, text=True)
    assert "Running" not in status.stdout and "Queued" not in status.stdout, status.stdout


def test_queued_points_reads_dvc_queue_status():
    from flows.sweep import queue_tasks, queued_points

    status = """Task     Name    Created    Status
0625a07  p2      09:26 PM   Queued
5d573a6  p3      Dec 02, 2026   Queued
037bea1  p1      09:26 PM   Success
1a2b3c4  p4      09:27 PM   Running

Worker status: 0 active, 0 idle
"""
    assert queued_points(status) == ["p2", "p3"]
    assert queue_tasks(status + "9f8e7d6  p2      09:20 PM   Failed\n", "Failed") == [("9f8e7d6", "p2")]


def test_after_a_stop_the_queue_is_done_once_its_workers_have_left():
    from flows.sweep import WORKER_GRACE_S, queue_workers_done

    assert not queue_workers_done([11], {11}, jobs=1, idle_s=60.0)  # a worker still finishing its point
    assert queue_workers_done([], {11}, jobs=1, idle_s=0.0)  # the one worker -j 1 spawns came and went
    assert not queue_workers_done([], {11}, jobs=2, idle_s=1.0)  # the second of -j 2 may still be starting
    assert queue_workers_done([], {11, 12}, jobs=2, idle_s=1.0)
    assert not queue_workers_done([], set(), jobs=1, idle_s=WORKER_GRACE_S - 1)  # none seen yet: a slow start
    assert queue_workers_done([], set(), jobs=1, idle_s=WORKER_GRACE_S)


def test_live_queue_workers_reads_dvcs_worker_pid_files(tmp_path):
    from flows.sweep import live_queue_workers

    folder = tmp_path / ".dvc/tmp/exps/celery"
    folder.mkdir(parents=True)
    assert live_queue_workers(str(tmp_path)) == []
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (folder / "dvc-exp-worker-1.pid").write_text(gone.stdout.strip())
    (folder / "dvc-exp-worker-2.pid").write_text(str(os.getpid()))
    (folder / "dvc-exp-worker-3.pid").write_text("")  # half-written
    assert live_queue_workers(str(tmp_path)) == [os.getpid()]


def test_flows_keep_prefect_state_in_the_project_from_a_plain_shell(tmp_path):
    """`python -m flows.pipeline` outside make: before, Prefect wrote ~/.prefect/prefect.db."""
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    code = "import flows; from prefect.settings import get_current_settings as s; print(s().home)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(ROOT / ".prefect")
