"""The validate stage stops a bad params.yaml before DVC touches any output (issue 14 item 5)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_every_stage_depends_on_the_validate_stage():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    out = "data/validated"
    assert [next(iter(o)) if isinstance(o, dict) else o for o in stages["validate"]["outs"]] == [out]
    producers = {(next(iter(o)) if isinstance(o, dict) else o): name
                 for name, st in stages.items() for o in st.get("outs", [])}

    def upstream(name: str) -> set[str]:
        found = set()
        for dep in stages[name].get("deps", []):
            for path, producer in producers.items():
                if dep == path or dep.startswith(path + "/"):
                    found |= {producer} | upstream(producer)
        return found

    for name in stages:
        if name != "validate":
            assert "validate" in upstream(name), f"stage {name} runs without the params check"


def test_validate_names_the_bad_key_and_how_to_restore_the_default(tmp_path, subprocess_env):
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["rl"]["learning_rate"] = 0.1
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    out = tmp_path / "validated"
    res = subprocess.run([sys.executable, "-m", "stages.validate", "--params", str(tmp_path / "params.yaml"),
                          "--out", str(out)], cwd=ROOT, env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "rl.learning_rate: unknown key" in res.stderr and "make params" in res.stderr
    assert not out.exists()
    res = subprocess.run([sys.executable, "-m", "stages.validate", "--out", str(out)], cwd=ROOT, env=subprocess_env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert out.read_text() == "params.yaml validated\n"
