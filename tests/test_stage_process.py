"""A stage run (`python -m stages.<name>`) imports with Python's garbage collector off and runs with
it on, its imports frozen (stages/__init__.py): about 2 s of CPU less per stage process."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_python_m_sets_argv0_to_dash_m_while_it_imports_the_package(tmp_path):
    """What stages/__init__.py relies on (Python's documented -m behaviour)."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("import sys\nprint('package', sys.argv[0])\n")
    (tmp_path / "pkg" / "mod.py").write_text("import sys\nprint('module', sys.argv[0])\n")
    res = subprocess.run([sys.executable, "-m", "pkg.mod", "-m", "x"], cwd=tmp_path, capture_output=True, text=True)
    assert res.stdout.splitlines() == ["package -m", f"module {tmp_path / 'pkg' / 'mod.py'}"], res.stderr


def test_a_stage_run_imports_without_collections_and_runs_with_its_imports_frozen(tmp_path):
    (tmp_path / "params.yaml").write_text("{}\n")
    code = (
        "import gc, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "sys.argv = ['-m']  # as while `python -m stages.validate` locates the module\n"
        "import stages.validate\n"
        "assert not gc.isenabled(), 'collector on during the imports'\n"
        "sys.argv = ['validate.py', '--params', 'params.yaml']\n"
        "stages.validate.stage_args('the run starts')\n"
        "assert gc.isenabled(), 'collector still off in the run'\n"
        "print(gc.get_freeze_count())\n"
    )
    res = python(code, tmp_path)
    assert res.returncode == 0, res.stderr
    assert int(res.stdout) > 10_000  # the imports: frozen, out of every later scan


def test_importing_a_stage_elsewhere_leaves_the_collector_alone(tmp_path):
    code = (
        "import gc, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import stages.validate\n"
        "assert gc.isenabled()\n"
        "sys.argv = ['validate.py', '--params', 'params.yaml']\n"
        "stages.validate.stage_args('a test calls it')\n"
        "assert gc.isenabled() and gc.get_freeze_count() == 0, gc.get_freeze_count()\n"
    )
    res = python(code, tmp_path)
    assert res.returncode == 0, res.stderr
    assert gc.isenabled()  # this process imported stages too
