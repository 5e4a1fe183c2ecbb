"""Serve the deployments of prefect.yaml from this checkout, with a local Prefect server (`make ui`).

    python -m flows.serve                 # server on 127.0.0.1:4200 unless one answers there, then serve
    python -m flows.serve --no-server     # serve against $PREFECT_API_URL

The server keeps its SQLite database under $PREFECT_HOME (the Makefile points it
at .prefect/ in the project). Ctrl-C stops serving and the server this started.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from flows.settings import ROOT, prefect_env


def healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def start_server(host: str, port: int, env: dict[str, str], log_path: str | Path) -> subprocess.Popen:
    """`prefect server start` in its own process group, output to `log_path`."""
    log = open(log_path, "ab")
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def wait_healthy(api_url: str, proc: subprocess.Popen | None = None, timeout_s: float = 120.0) -> float:
    """Seconds until `api_url`/health answers; raises if the server exits or the time runs out."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if healthy(api_url):
            return time.monotonic() - start
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"prefect server exited with {proc.returncode} before answering {api_url}/health")
        time.sleep(1.0)
    raise TimeoutError(f"{api_url}/health did not answer within {timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen, timeout_s: float = 15.0) -> None:
    """Terminate the server by its PID and every process under it (uvicorn workers and the like)."""
    import psutil

    try:
        parent = psutil.Process(proc.pid)
        family = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for p in family:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(family, timeout=timeout_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    proc.wait(timeout=5)


def _schedules(entries: list[dict[str, Any]] | None) -> list:
    from datetime import timedelta

    from prefect.schedules import Cron, Interval

    out = []
    for entry in entries or []:
        if "cron" in entry:
            out.append(Cron(entry["cron"], timezone=entry.get("timezone"), active=entry.get("active", True)))
        elif "interval" in entry:
            out.append(Interval(timedelta(seconds=entry["interval"]), timezone=entry.get("timezone"), active=entry.get("active", True)))
        else:
            raise ValueError(f"prefect.yaml: schedule {entry} has neither cron nor interval")
    return out


def load_deployments(project: Path = ROOT, with_schedules: bool = True) -> list:
    """The deployments of `project`/prefect.yaml as RunnerDeployments for `prefect.serve`."""
    import yaml

    spec = yaml.safe_load((project / "prefect.yaml").read_text())
    deployments = []
    for d in spec["deployments"]:
        path, _, attr = d["entrypoint"].partition(":")
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), attr)
        deployments.append(
            flow.to_deployment(
                name=d["name"],
                description=d.get("description"),
                tags=d.get("tags"),
                parameters=d.get("parameters"),
                schedules=_schedules(d.get("schedules")) if with_schedules else None,
                concurrency_limit=d.get("concurrency_limit"),
            )
        )
    return deployments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4200)
    parser.add_argument("--no-server", action="store_true", help="serve against $PREFECT_API_URL, start no server")
    parser.add_argument("--startup-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)

    os.chdir(ROOT)  # deployment entrypoints and the flows' project_dir="." are relative to the project
    sys.path.insert(0, str(ROOT))
    env = prefect_env()
    Path(env["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    server = None
    if not args.no_server:
        env["PREFECT_API_URL"] = f"http://{args.host}:{args.port}/api"
        if not healthy(env["PREFECT_API_URL"]):
            log = Path(env["PREFECT_HOME"]) / "server.log"
            print(f"starting Prefect server on {args.host}:{args.port} (log: {log})", flush=True)
            server = start_server(args.host, args.port, env, log)
    os.environ.update(env)  # before prefect is imported: its settings come from the environment
    try:
        if not args.no_server:
            seconds = wait_healthy(env["PREFECT_API_URL"], server, args.startup_timeout)
            print(f"Prefect UI: http://{args.host}:{args.port}  (server healthy after {seconds:.0f} s)", flush=True)
        from prefect import serve

        serve(*load_deployments(ROOT))
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            print("stopping the Prefect server", flush=True)
            stop_server(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
