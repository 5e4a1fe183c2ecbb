"""Environment steps per second: in-process, through the local pool, through one and two servers.

    python bench/env_throughput.py [--family textworld fixed] [--slots 16] [--rounds 2]

Every variant plays the same batches: `--slots` episodes at once (one game per slot), `--rounds`
times, each slot stepping its game's expert plan (TextWorld, level w2-o3-q4) or any command
(the fixed-turn env, 20 steps, pure Python: the transport's own cost). In-process plays the
episodes one after another in one env (`make_env`); the others go through
`EnvPool(n_workers=2)` or `RemotePool` over `agentrecipe serve-env` servers on 127.0.0.1 that
this script starts and stops (by PID). Resets count in the time, as they do in a rollout.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from agentrecipe.envs import registry  # noqa: E402
from agentrecipe.envs.base import GameSpec  # noqa: E402

registry.FAMILIES["fixed"] = "fixed_turn_env"
FIXED_TURNS = 20
LAUNCH = f"""
import sys
sys.path[:0] = [{str(ROOT / 'bench')!r}]
from agentrecipe.envs import registry
registry.FAMILIES["fixed"] = "fixed_turn_env"
from agentrecipe.cli import main
sys.exit(main(sys.argv[1:]))
"""


def games_of(family: str, n: int, cache: Path) -> list[GameSpec]:
    if family == "fixed":
        return [GameSpec(path=f"fixed-{s}", level=f"t{FIXED_TURNS}", env="fixed", seed=s) for s in range(n)]
    from agentrecipe.envs.textworld_env import build_games

    return build_games("w2-o3-q4", "test", list(range(1, n + 1)), cache / "w2-o3-q4", {})


def plans(games: list[GameSpec]) -> list[list[str]]:
    return [list(g.expert_plan) or ["look"] * FIXED_TURNS for g in games]


def in_process(family: str, games: list[GameSpec], rounds: int) -> int:
    env = registry.get_family(family).make_env({})
    steps = 0
    for _ in range(rounds):
        for g, plan in zip(games, plans(games)):
            env.reset(g)
            for action in plan:
                steps += 1
                if env.step(action)[2]:
                    break
    env.close()
    return steps


def through(pool, games: list[GameSpec], rounds: int) -> int:
    steps = 0
    for _ in range(rounds):
        pool.reset(games)
        todo = plans(games)
        for t in range(max(len(p) for p in todo)):
            actions = [p[t] if t < len(p) else None for p in todo]
            for i, res in enumerate(pool.step(actions)):
                if res is not None:
                    steps += 1
                    if res.done:
                        todo[i] = todo[i][: t + 1]
        assert pool.failures == 0, pool.last_errors
    return steps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_servers(family: str, n: int, log_dir: Path) -> list[tuple[subprocess.Popen, str]]:
    import httpx

    servers = []
    for _ in range(n):
        port = free_port()
        with open(log_dir / f"server-{family}-{port}.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "serve-env", "--env", family, "--port", str(port),
                                     "--params", str(log_dir / "none.yaml")], cwd=ROOT, stdout=log,
                                    stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        servers.append((proc, f"http://127.0.0.1:{port}"))
    for proc, url in servers:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{url} exited; see {log_dir}")
            try:
                httpx.get(url + "/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
    return servers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", nargs="+", default=["textworld", "fixed"], choices=["textworld", "fixed"])
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache", default=str(ROOT / ".cache" / "bench_env_throughput"))
    args = parser.parse_args()
    from agentrecipe.envs.pool import EnvPool
    from agentrecipe.envs.remote_pool import RemotePool

    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    rows = []
    for family in args.family:
        games = games_of(family, args.slots, cache)
        servers = start_servers(family, 2, cache)
        try:
            for name in ("in-process", "local pool (2 workers)", "1 server", "2 servers"):
                start = time.perf_counter()
                if name == "in-process":
                    steps = in_process(family, games, args.rounds)
                elif name.startswith("local"):
                    with EnvPool(family, {}, n_workers=2) as pool:
                        pool.reset(games[:2])  # the workers' start and imports are not timed
                        start = time.perf_counter()
                        steps = through(pool, games, args.rounds)
                else:
                    urls = [url for _, url in servers[: int(name[0])]]
                    with RemotePool(family, urls) as pool:
                        pool.reset(games[:2])  # the servers' first game loads are not timed
                        start = time.perf_counter()
                        steps = through(pool, games, args.rounds)
                seconds = time.perf_counter() - start
                rows.append((family, name, args.slots * args.rounds, steps, seconds))
                print(f"{family:10s} {name:24s} {steps:5d} steps {seconds:6.2f} s {steps / seconds:8.1f} steps/s",
                      flush=True)
        finally:
            for proc, _ in servers:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
    print("\n| family | how | episodes | steps | seconds | steps/s |\n|---|---|---|---|---|---|")
    for family, name, episodes, steps, seconds in rows:
        print(f"| {family} | {name} | {episodes} | {steps} | {seconds:.2f} | {steps / seconds:.1f} |")


if __name__ == "__main__":
    main()
