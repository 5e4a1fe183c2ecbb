"""The whole DAG through DVC on `experiment=swe_micro` (SWE tasks on a real PyPI package), in a fresh copy."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from tests.dvc_project import copy_project

from tests.test_pipeline_e2e import POLICIES, run


@pytest.fixture
def swe_project(tmp_path_factory, subprocess_env):
    """The project copied like the TextWorld e2e test's, params composed from experiment=swe_micro."""
    dst = tmp_path_factory.mktemp("swe_project")
    copy_project(dst, subprocess_env)
    run([sys.executable, "-m", "agentrecipe.cli", "compose-params", "experiment=swe_micro"], dst, subprocess_env)
    return dst


@pytest.mark.slow
def test_dvc_repro_runs_every_stage_on_swe_micro(swe_project, subprocess_env):
    out = run(["dvc", "repro"], swe_project, subprocess_env)
    stages = yaml.safe_load((swe_project / "dvc.yaml").read_text())["stages"]
    for name in stages:
        assert f"Running stage '{name}'" in out
    params = yaml.safe_load((swe_project / "params.yaml").read_text())
    assert params["env"]["name"] == "swe"
    rows = [json.loads(line) for line in (swe_project / "data/envs/manifest.jsonl").read_text().splitlines()]
    assert {r["env"] for r in rows} == {"swe"} and len(rows) == sum(params["env"][f"n_{s}"] for s in
                                                                   ("train", "valid", "test"))
    metrics = json.loads((swe_project / "data/eval/metrics.json").read_text())
    levels = params["env"]["levels"] + params["env"]["ood_levels"]
    for policy in POLICIES:
        for level in levels:
            cell = metrics[policy][level]  # resolve rate = success, mean pass ratio = score, both with intervals
            assert 0.0 <= cell["success_ci_low"] <= cell["success"] <= cell["success_ci_high"] <= 1.0
            assert 0.0 <= cell["score_ci_low"] <= cell["score"] <= cell["score_ci_high"] <= 1.0
            assert cell["n"] > 0, (policy, level)
    for level in levels:  # the expert resolves every task
        assert metrics["expert"][level]["success"] == 1.0 and metrics["expert"][level]["score"] == 1.0
    assert (swe_project / "data/report/report.md").read_text().count("|") > 10
