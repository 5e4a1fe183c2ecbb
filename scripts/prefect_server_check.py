"""Check that a real Prefect server works here: start, run a flow against it, see it COMPLETED, stop.

    python scripts/prefect_server_check.py [--port N] [--timeout 120]

Starts `prefect server start --host 127.0.0.1 --port <free port>` with a
temporary PREFECT_HOME, waits for /api/health, runs a trivial flow with
PREFECT_API_URL pointing at it, reads the run back through the API, then stops
the server by its PID (and its children). Exit status 0 when all of that worked.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.serve import prefect_env, start_server, stop_server, wait_healthy  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_flow_against_server() -> str:
    """Run a trivial flow on the server in PREFECT_API_URL; return its final state type as the API reports it."""
    from prefect import flow, task
    from prefect.client.orchestration import get_client

    @task
    def add(a: int, b: int) -> int:
        return a + b

    @flow(name="server-check")
    def check() -> int:
        return add(1, 2)

    state = check(return_state=True)
    assert state.result() == 3, state
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
        tasks = client.read_task_runs()
    print(f"flow run {run.name} ({run.id}): {run.state_type.value}; task runs: {[t.state_type.value for t in tasks]}")
    # Send the queued logs and events now, while the server is still up.
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    EventsWorker.drain_all(timeout=10)
    return run.state_type.value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0, help="0 = a free port")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for /api/health")
    args = parser.parse_args(argv)

    home = tempfile.mkdtemp(prefix="prefect-check-")
    port = args.port or free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = prefect_env(home)
    env["PREFECT_API_URL"] = api_url
    t0 = time.monotonic()
    server = start_server("127.0.0.1", port, env, Path(home) / "server.log")
    print(f"prefect server pid {server.pid} on port {port}, PREFECT_HOME={home}", flush=True)
    try:
        print(f"healthy after {wait_healthy(api_url, server, args.timeout):.1f} s", flush=True)
        os.environ.update(env)  # before prefect is imported
        t1 = time.monotonic()
        state = run_flow_against_server()
        print(f"flow run took {time.monotonic() - t1:.1f} s", flush=True)
        ok = state == "COMPLETED"
    except Exception as e:  # report, stop the server, fail
        print(f"FAILED: {type(e).__name__}: {e}", flush=True)
        log = Path(home) / "server.log"
        if log.exists():
            print("--- server log (end) ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
        ok = False
    finally:
        stop_server(server)
        print(f"server stopped (exit {server.returncode}); total {time.monotonic() - t0:.1f} s", flush=True)
    with socket.socket() as s:  # the port is free again
        port_free = s.connect_ex(("127.0.0.1", port)) != 0
    shutil.rmtree(home, ignore_errors=True)
    print("OK" if ok and port_free else "FAILED", flush=True)
    return 0 if ok and port_free else 1


if __name__ == "__main__":
    sys.exit(main())
