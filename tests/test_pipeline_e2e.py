"""The whole DAG through DVC on the micro config, in a fresh copy of the project."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.dvc_project import copy_project

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("base", "sft", "rl", "expert", "random", "first")


def run(cmd: list[str], cwd: Path, env: dict) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout + res.stderr


@pytest.fixture
def project(tmp_path_factory, subprocess_env) -> Path:
    """A git + DVC copy of the tracked project files, with params.yaml composed from experiment=micro."""
    dst = tmp_path_factory.mktemp("project")
    copy_project(dst, subprocess_env)
    run([sys.executable, "-m", "agentrecipe.cli", "compose-params", "experiment=micro"], dst, subprocess_env)
    return dst


@pytest.mark.slow
def test_dvc_repro_runs_every_stage_on_the_micro_config(project, subprocess_env):
    # Stages write bytecode next to the modules they import, as on a user's machine (a
    # PYTHONDONTWRITEBYTECODE in the caller's environment would hide dep-hash changes from it).
    env = {k: v for k, v in subprocess_env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = run(["dvc", "repro"], project, env)
    stages = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    for name in stages:
        assert f"Running stage '{name}'" in out
    for stage in stages.values():  # every declared output exists
        for o in stage.get("outs", []):
            path = o if isinstance(o, str) else next(iter(o))
            assert (project / path).exists(), path
    metrics = json.loads((project / "data/eval/metrics.json").read_text())
    params = yaml.safe_load((project / "params.yaml").read_text())
    levels = params["env"]["levels"] + params["env"]["ood_levels"]
    # exactly the policy x level cells of params.yaml (plus the pooled groups), each with its games
    assert sorted(metrics) == sorted(POLICIES)
    for policy in POLICIES:
        assert sorted(metrics[policy]) == sorted(levels + ["in_domain", "ood"]), policy
        for level in levels:
            cell = metrics[policy][level]
            assert cell["n"] == params["eval"]["episodes"] and cell["success_ci_low"] <= cell["success"], (policy, level)
    assert all(metrics["expert"][lvl]["success"] == 1.0 for lvl in levels)
    report = (project / "data/report/report.md").read_text()
    for policy in POLICIES:  # the report's results table has one row per level and policy
        for level in levels:
            assert f"| {level} | {policy} | " in report, (level, policy)
    assert "## What ran" in report and "| rl |" in report  # provenance with the rl stage's wall time

    # Nothing changed: a second repro runs nothing.
    again = run(["dvc", "repro"], project, env)
    assert "Running stage" not in again
    # Changing an RL param leaves everything upstream of rl cached.
    status = run(["dvc", "status"], project, env)
    assert "changed" not in status
    params["rl"]["lr"] = params["rl"]["lr"] * 2
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    status = run(["dvc", "status"], project, env)
    assert "rl:" in status and "build_envs:" not in status and "sft:" not in status

    # A bad value stops the run at the validate stage, before DVC deletes any output.
    params["rl"]["clip_eps"] = -1.0
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    bad = subprocess.run(["dvc", "repro"], cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "rl.clip_eps" in bad.stdout + bad.stderr
    assert "make params" in bad.stdout + bad.stderr
    assert "Running stage 'build_envs'" not in bad.stdout and "Running stage 'rl'" not in bad.stdout
    assert (project / "data/envs/manifest.jsonl").exists() and (project / "data/models/rl/config.json").exists()
