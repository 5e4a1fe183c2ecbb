"""What every stage script shares: reading its params sections and its command line."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

import stages
from agentrecipe import dist
from agentrecipe.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
"""The project: dvc.yaml and the code the stages run."""


TIMINGS_DIR = Path("data/timings")
"""Each stage's wall time, `<stage>.json`, read by the report: written on rank 0 when the stage exits,
and only when DVC runs it (DVC sets DVC_STAGE), as the files are the stages' DVC outputs; a stage run
by hand or by a test leaves the pipeline's files alone."""


def stage_args(description: str, add_arguments=None) -> argparse.Namespace:
    """The run starts: its imports are done (stages.imports_done), its command line parsed, its wall
    time counted from here."""
    stages.imports_done()
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default="params.yaml", help="composed params file")
    if add_arguments:
        add_arguments(parser)
    args = parser.parse_args()
    _record_wall_time()
    return args


_EARLIER_RUNS: dict[str, Any] = {}


def count_earlier_runs(seconds: float, note: str) -> None:
    """A resumed stage: its wall time also counts `seconds` of work it kept from the runs before,
    and the report says so (`note`, in data/timings/<stage>.json as `resumed`)."""
    _EARLIER_RUNS.update(seconds=seconds, note=note)


def timing_record(name: str, seconds: float) -> dict[str, Any]:
    """data/timings/<stage>.json: this run's seconds plus those of earlier runs it resumed."""
    earlier = _EARLIER_RUNS.get("seconds", 0.0)
    return {"stage": name, "seconds": round(seconds + earlier, 1),
            **({"resumed": _EARLIER_RUNS["note"], "this_run_seconds": round(seconds, 1)} if _EARLIER_RUNS else {})}


def _record_wall_time() -> None:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is None or not spec.name.startswith("stages.") or not is_rank0() or "DVC_STAGE" not in os.environ:
        return
    name, start = spec.name.split(".", 1)[1], time.time()

    def write() -> None:
        with contextlib.suppress(OSError):
            TIMINGS_DIR.mkdir(parents=True, exist_ok=True)
            (TIMINGS_DIR / f"{name}.json").write_text(json.dumps(timing_record(name, time.time() - start)))

    atexit.register(write)


def load_sections(path: str, sections: list[str]) -> dict[str, Any]:
    """Typed sections of params.yaml; a bad key stops the stage before any work."""
    try:
        return load_config(path, sections)
    except ConfigError as e:
        sys.exit(f"error: {e}")


def torch_threads() -> None:
    """All the cores this process may use, for torch (AGENTRECIPE_THREADS overrides).

    Rollouts alternate model and environment steps (the workers wait while the model runs and the
    other way round), so one stage alone uses every core in both phases. Measured on 2 cores, RL
    stage of the default recipe, steps 2-3 (`perf/*`): with 2 threads instead of 1, update 9.2-11.6 s
    instead of 14.7-19.8 s, old log-probs 2.7-3.3 s instead of 4.5-5.6 s, generation 3.9-5.0 s
    instead of 5.0-7.4 s, environment time unchanged. Whoever runs several stages side by side sets
    the share: a DVC queue with -j jobs gets cores / jobs (flows/sweep.py), each pytest worker 1
    (tests/conftest.py). Oversubscribed OpenMP threads spin: with the other core busy, one rollout
    took 38.6 s of generation with 2 threads, 2.5 s with 1."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(int(os.environ.get("AGENTRECIPE_THREADS", "0")) or max(1, cores))


def is_rank0() -> bool:
    return dist.is_rank0()


@contextlib.contextmanager
def live_metrics(path: str, resume: bool = False):
    """DVCLive on rank 0 (None on other ranks, whose logger then does nothing)."""
    if not is_rank0():
        yield None
        return
    from dvclive import Live

    with Live(path, save_dvc_exp=False, dvcyaml=None, report=None, resume=resume) as live:
        yield live


def dvclive_logger(live):
    """A `log(step, metrics)` callback writing DVCLive metrics at `step` (no-op without a Live)."""

    def log(step: int, metrics: dict) -> None:
        if live is None:
            return
        live.step = step
        for key, value in metrics.items():
            live.log_metric(key, value)
        live.make_summary()

    return log


def stage_fingerprint(stage: str, params_path: str | Path, inputs: list[Path], launch: dict | None = None) -> str:
    """What a stage's result depends on, as DVC sees it: sha256 (16 hex digits) of the values of
    the params keys dvc.yaml lists for the stage (read from params_path), of the files of its
    code deps (its dvc.yaml deps outside data/) and of its data inputs (the paths given on its
    command line, which stand in for its data/ deps); plus `launch`, what DVC does not see (the
    number of ranks)."""
    from agentrecipe.train.checkpoint import hash_paths

    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"][stage]
    raw = yaml.safe_load(Path(params_path).read_text()) or {}
    params = {}
    for key in spec.get("params", []):
        if isinstance(key, dict):  # `params.yaml:` with no keys: the whole file
            params.update({f"{name}:": raw for name in key})
            continue
        value = raw
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        params[key] = value
    code = [ROOT / dep for dep in spec["deps"] if not dep.startswith("data/")]
    h = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode())
    if launch:
        h.update(json.dumps(launch, sort_keys=True).encode())
    h.update(hash_paths(code).encode())
    h.update(hash_paths(inputs).encode())
    return h.hexdigest()[:16]


def copy_live(src: Path, dst: Path, upto: int | None = None) -> None:
    """Copy a DVCLive folder to dst (replacing it atomically), keeping only steps <= upto.

    Each series is plots/metrics/<name>.tsv with the step in its first column; metrics.json
    (the summary) is rebuilt from the last kept row of every series."""
    from agentrecipe.train.checkpoint import replace_dir

    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    if upto is not None:
        summary: dict = {}
        for tsv in sorted((tmp / "plots" / "metrics").rglob("*.tsv")):
            header, *rows = tsv.read_text().splitlines()
            rows = [r for r in rows if int(r.split("\t")[0]) <= upto]
            tsv.write_text("\n".join([header, *rows]) + "\n")
            if rows:
                node = summary
                *parents, name = tsv.relative_to(tmp / "plots" / "metrics").with_suffix("").parts
                for part in parents:
                    node = node.setdefault(part, {})
                node[name] = float(rows[-1].split("\t")[1])
        summary["step"] = upto
        (tmp / "metrics.json").write_text(json.dumps(summary, indent=4) + "\n")
    dst.parent.mkdir(parents=True, exist_ok=True)
    replace_dir(tmp, dst)


def env_pool(env):
    """The pool the rl and evaluate stages play policies through, for an EnvConfig: its servers
    (env.remote, see agentrecipe/envs/remote_pool.py) when it lists any, else local worker
    processes, which get the family's POLICY_OPTIONS under env's own options (work that only an
    expert's next action needs is skipped; the expert baseline then follows the game's stored plan,
    which the build replayed to a win)."""
    from agentrecipe.envs.pool import open_pool
    from agentrecipe.envs.registry import get_family

    options = {**getattr(get_family(env.name), "POLICY_OPTIONS", {}), **env.family_options}
    return open_pool(env.name, options, env.workers, env.step_timeout, env.remote)
