"""Real packages for SWE tasks: a pinned sdist, its files, and one traced run of its own tests.

`prepare(spec, cache)`:
1. ``pip download --no-binary :all: --no-deps NAME==VERSION`` into ``cache/sdists/``
   (once; PyPI or whatever index pip is configured with);
2. unpacks it to ``cache/<name>-<version>/src/`` (adding an empty ``pytest.ini`` when it has
   no pytest config, so none is taken from a folder above) and lists its source files
   (``*.py`` outside test folders, setup/docs/versioneer) and test files (``test_*.py`` /
   ``*_test.py``);
3. runs the whole test suite once in the sandbox with a line tracer
   (`pytest_report`), which gives every test's outcome and, for each source line,
   the tests that executed it. Saved as ``baseline.json``; reused afterwards.

A package whose tests do not all pass unmodified is refused (`BrokenPackage`): mutations
are kept only when tests that passed start failing, which needs a green baseline.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from agentrecipe.envs.swe.sandbox import Limits, remove_path, run_limited

SPEC = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")
SKIP_DIRS = {"tests", "test", "testing", "docs", "doc", "examples", "benchmarks", "bench", "build", ".git"}
SKIP_FILES = {"setup.py", "conftest.py", "versioneer.py", "_version.py", "noxfile.py", "tasks.py", "fabfile.py"}


class BrokenPackage(RuntimeError):
    """The package's own tests do not pass before any mutation (or do not run at all)."""


@dataclass(frozen=True)
class Package:
    spec: str
    """NAME==VERSION as pinned in params."""
    root: Path
    """The unpacked sdist (read-only template of every task of this package)."""
    sources: tuple[str, ...]
    """Source files (relative to root) that mutations may touch."""
    tests: tuple[str, ...]
    """Test files (relative to root); restored before every test run of an episode."""
    outcomes: dict
    """{nodeid: {"passed": bool, "skipped": bool, "message": str}} of the unmodified package (skipped
    tests are never PASS_TO_PASS)."""
    coverage: dict
    """{file: {line: [nodeid, ...]}}: the tests that execute each source line."""
    seconds: float
    """Wall time of the baseline run (traced)."""

    @property
    def name(self) -> str:
        return self.spec.split("==")[0]


def parse_spec(spec: str) -> tuple[str, str]:
    m = SPEC.match(spec)
    if not m:
        raise ValueError(f"env.swe.packages: {spec!r} is not NAME==VERSION (pin an exact version)")
    return m.group(1), m.group(2)


def pytest_argv(report: str, tests: list[str] = (), trace: list[str] | None = None) -> list[str]:
    """The command every test run uses (autoloaded plugins off: see clean_env)."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "agentrecipe.envs.swe.pytest_report",
            "--swe-report", report, "-o", "addopts=", "--rootdir", ".", "--no-header", "-rN", "--tb=no"]
    if trace is not None:
        argv += ["--swe-trace", ",".join(trace)]
    return argv + list(tests)


def python_path(root: Path) -> dict[str, str]:
    """PYTHONPATH: the repo root (and src/ for a src layout), then where agentrecipe is installed."""
    here = Path(__file__).resolve().parents[3]
    parts = [str(root / "src")] if (root / "src").is_dir() else []
    return {"PYTHONPATH": os.pathsep.join([*parts, str(root), str(here)])}


def download(spec: str, cache: Path) -> Path:
    """The sdist archive of `spec` under cache/sdists (downloaded once)."""
    name, version = parse_spec(spec)
    folder = cache / "sdists"
    stem = re.compile(rf"^{re.escape(name).replace('_', '[-_.]').replace('-', '[-_.]')}-{re.escape(version)}\.(tar\.gz|zip)$", re.I)
    found = [p for p in folder.glob("*") if stem.match(p.name)] if folder.is_dir() else []
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                                  "--disable-pip-version-check", "-q", spec, "-d", tmp],
                                 capture_output=True, text=True, timeout=600)
            got = [p for p in Path(tmp).iterdir() if stem.match(p.name)]
            if res.returncode != 0 or not got:
                raise RuntimeError(f"pip download {spec} failed: {res.stderr.strip()[-500:]}")
            found = [got[0].rename(folder / got[0].name)]  # atomic within the folder
    return found[0]


def plain_members(tar: tarfile.TarFile, dest: str | Path) -> list[tarfile.TarInfo]:
    """The archive's files and folders that stay inside `dest` (no links, devices, absolute paths
    or `..` leaving it)."""
    root = os.path.realpath(dest)
    return [m for m in tar.getmembers() if (m.isfile() or m.isdir())
            and os.path.commonpath([root, os.path.realpath(os.path.join(root, m.name))]) == root]


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive lock on `path` (created) while the block runs: one process at a time, others wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def unpack(archive: Path, dest: Path) -> Path:
    """Unpack an sdist into dest (its single top folder becomes dest)."""
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(tmp)
        else:
            with tarfile.open(archive) as t:
                # Python >= 3.11.4 (and 3.8.17, 3.9.17, 3.10.12) has the 'data' filter; earlier ones
                # get only the members check, which leaves out what the filter would refuse.
                extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                t.extractall(tmp, members=plain_members(t, tmp), **extra)
        tops = list(Path(tmp).iterdir())
        top = tops[0] if len(tops) == 1 and tops[0].is_dir() else Path(tmp)
        for p in list(top.rglob("*")):  # no symlinks in a template
            if p.is_symlink():
                p.unlink()
        top.rename(dest)
    return dest


PYTEST_SECTIONS = {"pytest.ini": "", ".pytest.ini": "", "pyproject.toml": "[tool.pytest.ini_options]",
                   "tox.ini": "[pytest]", "setup.cfg": "[tool:pytest]"}


def pin_pytest_root(root: Path) -> None:
    """Give the package a pytest config file of its own (an empty ``pytest.ini``) unless it has one,
    so pytest never takes a config (and the node ids' root) from a folder above it."""
    for name, section in PYTEST_SECTIONS.items():
        if (root / name).is_file() and section in (root / name).read_text(errors="replace"):
            return
    (root / "pytest.ini").write_text("[pytest]\n")


def list_files(root: Path) -> tuple[list[str], list[str]]:
    """(source files, test files) of an unpacked package, sorted, relative to root."""
    sources, tests = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        name = rel.name
        if name.startswith("test_") or name.endswith("_test.py"):
            tests.append(str(rel))
        elif not (set(rel.parts[:-1]) & SKIP_DIRS) and name not in SKIP_FILES and not name.startswith("."):
            sources.append(str(rel))
    return sources, tests


MAX_REPORT_BYTES = 64 * 2**20


def read_report(path: Path) -> dict:
    """The report the sandboxed run wrote, or {"tests": {}} when there is none to trust.

    The run's code is the model's: where the report should be it may have left a FIFO (a plain
    read would block this process for good, outside the sandbox's time limit), a symlink, a
    folder or garbage. Only a regular file is read, without following links or blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {"tests": {}}
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_REPORT_BYTES:
            return {"tests": {}}
        try:
            data = json.loads(f.read())
        except ValueError:
            return {"tests": {}}
    ok = isinstance(data, dict) and isinstance(data.get("tests"), dict) and all(
        isinstance(o, dict) and isinstance(o.get("passed"), bool) for o in data["tests"].values())
    return data if ok else {"tests": {}}


def run_tests(root: Path, tests: list[str], limits: Limits, trace: list[str] | None = None,
              hidden: tuple[Path, ...] = ()) -> tuple[dict, object]:
    """(report, RunResult) of pytest on `tests` (all when empty) in folder `root`; `hidden`: folders
    the run must not see (`run_limited`)."""
    report = root / ".swe_report.json"
    remove_path(report)
    res = run_limited(pytest_argv(report.name, tests, trace), root, limits, python_path(root), writable=True,
                      hidden=hidden)
    data = read_report(report)
    remove_path(report)
    return data, res


def prepare(spec: str, cache: str | Path, limits: Limits) -> Package:
    """The package of `spec`, unpacked and baselined under `cache` (cached on disk)."""
    cache = Path(cache)
    name, version = parse_spec(spec)
    home = cache / f"{name}-{version}"
    base = home / "baseline.json"
    with locked(cache / f"{name}-{version}.lock"):  # build workers share the cache: one prepares, the others wait
        if not base.exists():
            _baseline(spec, cache, home, base, limits)
    row = json.loads(base.read_text())
    return Package(spec, home / "src", tuple(row["sources"]), tuple(row["tests"]), row["outcomes"],
                   row["coverage"], float(row["seconds"]))


def _baseline(spec: str, cache: Path, home: Path, base: Path, limits: Limits) -> None:
    """Unpack `spec` into home/src (downloading it first) and write its baseline: sources, tests,
    their outcomes before any mutation and the lines each test runs."""
    src = home / "src"
    if not src.exists():  # (a test may seed the cache with an unpacked package)
        archive = download(spec, cache)
        home.mkdir(parents=True, exist_ok=True)
        unpack(archive, src)
    pin_pytest_root(src)
    sources, tests = list_files(src)
    if not tests:
        raise BrokenPackage(f"{spec}: its sdist ships no test files (test_*.py)")
    data, res = run_tests(src, tests, Limits(**{**limits.__dict__, "wall_s": max(limits.wall_s, 300.0)}),
                          trace=sources)
    failing = [t for t, o in data["tests"].items() if not o["passed"] and not o.get("skipped")]
    if not any(o["passed"] for o in data["tests"].values()) or failing:
        why = f"{len(failing)} of {len(data['tests'])} tests fail, e.g. {failing[:3]}" if failing else (
            f"no test ran (exit {res.returncode}): {res.output[-800:]}")
        raise BrokenPackage(f"{spec}: its own tests do not pass before mutation: {why}")
    order = data["order"]
    coverage = {f: {n: [order[i] for i in ix if i >= 0] for n, ix in lines.items()}
                for f, lines in data["lines"].items()}
    tmp = base.with_suffix(".tmp")
    tmp.write_text(json.dumps({"spec": spec, "sources": sources, "tests": tests, "outcomes": data["tests"],
                               "coverage": coverage, "seconds": round(res.seconds, 3)}, sort_keys=True))
    tmp.rename(base)
