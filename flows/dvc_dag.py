"""What the flows need from DVC: the stage graph, and running `dvc` with streamed output.

The stage list and its order come from dvc.yaml through DVC's own index
(`Repo.index.graph`); nothing here repeats a stage name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from flows.settings import NO_TELEMETRY


@dataclass
class Dag:
    """Pipeline stages in run order (dependencies first, ties in dvc.yaml order)."""

    stages: list[str]
    """Stage addresses as `dvc repro` takes them: `name`, or `sub/dvc.yaml:name` outside the root."""
    upstream: dict[str, list[str]] = field(default_factory=dict)
    """Stages each stage depends on directly."""
    outs: dict[str, list[str]] = field(default_factory=dict)
    """What each stage writes: its outs, as paths relative to the project."""
    metrics: list[str] = field(default_factory=list)
    """Metrics files (dvc.yaml's `metrics:`, and outs marked as metrics), relative to the project."""

    def writer(self, path: str) -> str | None:
        """The stage whose out is `path` or a folder holding it (None: no stage writes it)."""
        parts = Path(path).parts
        return next((s for s, outs in self.outs.items() for o in outs if parts[:len(Path(o).parts)] == Path(o).parts), None)

    @property
    def metric_stages(self) -> list[str]:
        """Stages that write a metrics file."""
        return list(dict.fromkeys(w for m in self.metrics if (w := self.writer(m)) is not None))

    def select(self, targets: list[str] | None) -> list[str]:
        """`targets` and everything upstream of them, in run order (all stages for None or [])."""
        if not targets:
            return list(self.stages)
        wanted: set[str] = set()
        todo = [self.resolve(t) for t in targets]
        while todo:
            stage = todo.pop()
            if stage not in wanted:
                wanted.add(stage)
                todo.extend(self.upstream.get(stage, []))
        return [s for s in self.stages if s in wanted]

    def resolve(self, target: str) -> str:
        """A stage address from `name` or `dvc.yaml:name`; unknown names are refused."""
        name = target.removeprefix("dvc.yaml:")
        if name in self.stages:
            return name
        raise ValueError(f"unknown stage {target!r}; stages in this project: {', '.join(self.stages)}")


def read_dag(project_dir: str | Path = ".") -> Dag:
    """Read every pipeline stage of the project and order them for `dvc repro --single-item`."""
    import networkx as nx
    from dvc.repo import Repo
    from dvc.stage import PipelineStage

    root = Path(project_dir).resolve()
    with Repo(str(root)) as repo, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # DVC's own, about its trie library
        graph = repo.index.graph  # edges point from a stage to the stages it depends on
        declared = list(repo.index.stages)  # files in path order, stages in file order

        def address(stage) -> str:
            dvcfile = os.path.relpath(stage.dvcfile.path, repo.root_dir)
            return stage.name if dvcfile == "dvc.yaml" else f"{dvcfile}:{stage.name}"

        position = {id(s): i for i, s in enumerate(declared)}
        order = nx.lexicographical_topological_sort(graph.reverse(copy=True), key=lambda s: position.get(id(s), -1))
        # .dvc files (`dvc add`) are graph nodes too; only stages with a command are run.
        stages = [s for s in order if isinstance(s, PipelineStage)]
        upstream = {
            address(s): [address(d) for d in graph.successors(s) if isinstance(d, PipelineStage)] for s in stages
        }
        outs = {address(s): [os.path.relpath(o.fs_path, repo.root_dir) for o in s.outs] for s in stages}
        dvcfiles = {s.dvcfile.path: s.dvcfile for s in stages}
        metrics = [os.path.relpath(os.path.join(os.path.dirname(path), m), repo.root_dir)
                   for path, dvcfile in dvcfiles.items() for m in getattr(dvcfile, "metrics", None) or []]
        metrics += [os.path.relpath(o.fs_path, repo.root_dir) for s in stages for o in s.outs if o.metric]
        return Dag([address(s) for s in stages], upstream, outs, list(dict.fromkeys(metrics)))


def site_cache_dir(project_dir: str | Path) -> str | None:
    """core.site_cache_dir made absolute (a relative one breaks queued experiments)."""
    from dvc.config import Config

    root = Path(project_dir).resolve()
    value = Config(dvc_dir=str(root / ".dvc")).get("core", {}).get("site_cache_dir")
    if not value:
        return None
    return str((root / value).resolve()) if not os.path.isabs(value) else value


def dvc_env(project_dir: str | Path) -> dict[str, str]:
    """Environment for `dvc` subprocesses: this interpreter's bin first, no analytics, unbuffered stages.

    DVC reads a relative core.site_cache_dir against the process' working
    directory, which for a queued experiment is a temporary copy without
    that folder ("unable to open database file"); DVC_SITE_CACHE_DIR pins it.
    """
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for key, value in NO_TELEMETRY.items():
        env.setdefault(key, value)
    env["PYTHONUNBUFFERED"] = "1"
    if "DVC_SITE_CACHE_DIR" not in env and (cache := site_cache_dir(project_dir)):
        env["DVC_SITE_CACHE_DIR"] = cache
    return env


def dvc(*args: str) -> list[str]:
    """A `dvc` command line run by this interpreter (no PATH lookup)."""
    return [sys.executable, "-m", "dvc", *args]


@dataclass
class Completed:
    returncode: int
    stdout: str
    stderr: str
    stderr_tail: list[str]


def run_streaming(
    cmd: list[str],
    cwd: str | Path,
    env: dict[str, str] | None = None,
    on_line: Callable[[str, str], None] | None = None,
    tail: int = 20,
) -> Completed:
    """Run `cmd`, passing each stdout/stderr line to `on_line(stream, line)` as it arrives.

    A line rewritten with carriage returns (a progress bar) is reported once, in its final form.
    """
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out: dict[str, list[str]] = {"stdout": [], "stderr": []}
    err_tail: deque[str] = deque(maxlen=tail)

    def pump(stream_name: str, pipe) -> None:
        for raw in iter(pipe.readline, b""):
            segments = [s for s in raw.decode(errors="replace").rstrip("\n").split("\r") if s.strip()]
            if not segments:
                continue
            line = segments[-1].rstrip()
            out[stream_name].append(line)
            if stream_name == "stderr":
                err_tail.append(line)
            if on_line is not None:
                on_line(stream_name, line)
        pipe.close()

    threads = [threading.Thread(target=pump, args=(n, p), daemon=True) for n, p in (("stdout", proc.stdout), ("stderr", proc.stderr))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rc = proc.wait()
    return Completed(rc, "\n".join(out["stdout"]), "\n".join(out["stderr"]), list(err_tail))


def run(cmd: list[str], cwd: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a short `dvc` command to completion, capturing its output as text."""
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
