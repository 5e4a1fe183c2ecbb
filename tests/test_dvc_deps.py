"""dvc.yaml lists every project module a stage runs (issue 15 item 1): derived, so it cannot drift.

A stage's code is its `python -m stages.X` module and every module of this project that it
imports, transitively (imports inside functions included). Each such file must be covered by
one of the stage's deps (the file itself or a folder above it); otherwise changing it would not
rerun the stage and DVC would record a stale result as current.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agentrecipe", "stages")


def module_file(name: str) -> Path | None:
    """The file of a project module (package: its __init__.py); None for other modules."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def imports_of(path: Path) -> set[str]:
    """Module names imported by a file: `import a.b`, `from a.b import c` (a.b and a.b.c), relative too."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names |= {f"{base}.{a.name}" for a in node.names}
    return names


def project_closure(module: str) -> set[Path]:
    """Files of `module` and of every project module it imports, transitively (parent packages included)."""
    seen: set[Path] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
            path = module_file(".".join(parts[:i]))
            if path is not None and path not in seen:
                seen.add(path)
                todo += sorted(imports_of(path))
    return seen


STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_deps_cover_every_project_module_it_imports(stage):
    spec = STAGES[stage]
    module = re.match(r"python -m (\S+)", spec["cmd"]).group(1)
    deps = [ROOT / d for d in spec.get("deps", [])]
    missing = sorted(str(f.relative_to(ROOT)) for f in project_closure(module)
                     if f.name != "__init__.py" or f.stat().st_size > 0
                     if not any(f == d or d in f.parents for d in deps))
    assert not missing, f"dvc.yaml stage {stage}: add to deps: {missing}"


def test_the_closure_sees_lazy_and_relative_imports():
    files = {str(p.relative_to(ROOT)) for p in project_closure("stages.report")}
    assert {"stages/report.py", "stages/common.py", "agentrecipe/config.py"} <= files


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_code_deps_are_code_it_runs(stage):
    """The converse: a code dep the stage never imports reruns it, and every stage after it, for
    nothing (agentrecipe/agent on build_envs and sft: an edit to the decoder rebuilt the games and
    retrained SFT)."""
    spec = STAGES[stage]
    closure = project_closure(re.match(r"python -m (\S+)", spec["cmd"]).group(1))
    code = [d for d in spec.get("deps", []) if d.split("/")[0] in PACKAGES]
    unused = [d for d in code if not any(f == ROOT / d or ROOT / d in f.parents for f in closure)]
    assert not unused, f"dvc.yaml stage {stage}: it never imports {unused}"


def test_the_stage_times_in_the_report_travel_with_their_stages():
    """Each wall time the report shows is an output of its stage and a dep of the report: a stage
    restored from DVC's run cache brings the time of the run that made its outputs (before, the
    report read whatever file an earlier run of another config had left in data/timings)."""
    from stages.common import TIMINGS_DIR
    from stages.report import STAGE_ORDER

    def paths(entries):
        return [e if isinstance(e, str) else next(iter(e)) for e in entries]

    for stage in STAGE_ORDER:
        timing = f"{TIMINGS_DIR}/{stage}.json"
        assert timing in paths(STAGES[stage]["outs"]) and timing in STAGES["report"]["deps"], stage
    assert "params" in STAGES["report"]["deps"]  # the defaults the report diffs params.yaml against


def test_a_stage_run_outside_dvc_leaves_the_pipelines_times_alone(tmp_path, subprocess_env):
    """The times are DVC outputs: only a stage DVC runs (DVC_STAGE set) writes one. Before, the tests
    that run stages from the project root rewrote data/timings/*.json there, and DVC then saw
    build_envs, sft and evaluate as changed."""
    import subprocess
    import sys

    env = {**subprocess_env, "PYTHONPATH": str(ROOT)}
    env.pop("DVC_STAGE", None)
    for stage_env in (env, {**env, "DVC_STAGE": "validate"}):
        subprocess.run([sys.executable, "-m", "stages.validate", "--params", str(ROOT / "params.yaml"), "--out",
                        str(tmp_path / "validated")], cwd=tmp_path, env=stage_env, check=True, capture_output=True)
        written = (tmp_path / "data" / "timings" / "validate.json").exists()
        assert written == ("DVC_STAGE" in stage_env)
