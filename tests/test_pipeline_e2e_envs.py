"""The whole DAG through DVC on `experiment=<env>_micro` for BabyAI, TextCraft and ScienceWorld."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_pipeline_e2e import POLICIES, run
from tests.dvc_project import copy_project

PRESETS = {"babyai": "minigrid", "textcraft": "textcraft", "sciworld": "scienceworld"}
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("overrides", [[f"experiment={f}_micro"] for f in PRESETS] + [[f"env={f}"] for f in PRESETS])
def test_presets_compose_and_validate(overrides):
    from agentrecipe.config import parse_config
    from agentrecipe.params import compose

    cfg = parse_config(compose(ROOT / "params", overrides), None, " ".join(overrides))
    assert cfg["env"].name == overrides[0].split("=")[1].removesuffix("_micro")


@pytest.mark.slow
@pytest.mark.parametrize("family", list(PRESETS))
def test_dvc_repro_runs_every_stage_on_the_env_micro_preset(family, tmp_path, subprocess_env):
    pytest.importorskip(PRESETS[family])
    if family == "sciworld" and shutil.which("java") is None:
        pytest.skip("ScienceWorld needs Java (openjdk-17-jre-headless)")
    project = copy_project(tmp_path, subprocess_env)
    run([sys.executable, "-m", "agentrecipe.cli", "compose-params", f"experiment={family}_micro"], project,
        subprocess_env)
    out = run(["dvc", "repro"], project, subprocess_env)
    for name in yaml.safe_load((project / "dvc.yaml").read_text())["stages"]:
        assert f"Running stage '{name}'" in out, name

    params = yaml.safe_load((project / "params.yaml").read_text())
    assert params["env"]["name"] == family
    rows = [json.loads(line) for line in (project / "data/envs/manifest.jsonl").read_text().splitlines()]
    levels = params["env"]["levels"] + params["env"]["ood_levels"]
    assert {r["env"] for r in rows} == {family} and {r["level"] for r in rows} == set(levels)
    # the turn limit leaves room for every expert plan, so the expert must win every test game
    assert max(r["plan_len"] for r in rows if r["split"] == "test") <= params["eval"]["max_turns"]
    metrics = json.loads((project / "data/eval/metrics.json").read_text())
    for policy in POLICIES:
        for level in levels:
            cell = metrics[policy][level]
            assert cell["n"] == params["eval"]["episodes"] and 0.0 <= cell["success"] <= 1.0, (policy, level)
    assert all(metrics["expert"][level]["success"] == 1.0 for level in levels)
    report = (project / "data/report/report.md").read_text()
    assert all(f"| {level} | expert | " in report for level in levels)
