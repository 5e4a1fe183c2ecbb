"""Many episodes at once: env slots spread over worker processes.

    with EnvPool("textworld", {}, n_workers=2, timeout=30) as pool:
        obs = pool.reset(games)                 # one game per slot
        results = pool.step(actions)            # one action per slot (None: leave it alone)

Slot i lives in worker i % n_workers; each worker steps its slots in turn. A slot whose
env raises fails alone. A worker that dies or does not answer within `timeout` seconds
is killed and restarted, and every episode it held fails. Failures come back as
`StepResult(failed=True, error=...)` (or None from reset) and are counted in
`pool.failures`; the caller never sees an exception from an environment.
`n_workers=0` runs the envs in this process (for debugging; no timeout).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from agentrecipe.envs import registry
from agentrecipe.envs.base import GameSpec, Observation

@dataclass
class StepResult:
    obs: Observation | None
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    failed: bool = False
    error: str = ""


def _run(envs: dict, family, options: dict, cmd: str, payload: dict[int, Any]) -> dict[int, tuple[bool, Any]]:
    """Apply one command to some slots; {slot: (ok, result or error text)}."""
    out = {}
    for slot, arg in payload.items():
        try:
            if cmd == "reset":
                if slot not in envs:
                    envs[slot] = family.make_env(options)
                out[slot] = (True, envs[slot].reset(arg))
            elif slot not in envs:
                out[slot] = (False, "no episode in this slot (reset it first)")
            else:
                out[slot] = (True, envs[slot].step(arg))
        except Exception as e:  # noqa: BLE001 - any env error fails this episode only
            env = envs.pop(slot, None)
            try:
                if env is not None:
                    env.close()
            except Exception:  # noqa: BLE001
                pass
            out[slot] = (False, f"{type(e).__name__}: {e}")
    return out


def _worker(conn: Connection, module: str, options: dict) -> None:
    family = importlib.import_module(module)
    envs: dict[int, Any] = {}
    while (msg := conn.recv()) is not None:
        conn.send(_run(envs, family, options, *msg))
    for env in envs.values():
        env.close()


class EnvPool:
    def __init__(self, family: str, options: dict | None = None, n_workers: int = 2, timeout: float = 30.0,
                 start_timeout: float = 120.0):
        if family not in registry.FAMILIES:
            raise ValueError(f"unknown environment {family!r}; known: {', '.join(sorted(registry.FAMILIES))}")
        if n_workers < 0:
            raise ValueError(f"n_workers must be >= 0, got {n_workers}")
        self.module = registry.FAMILIES[family]  # workers import it by name
        self.options = dict(options or {})
        self.n_workers = n_workers
        self.timeout = timeout
        self.start_timeout = start_timeout
        """Extra seconds a freshly started worker gets for its first answer (imports)."""
        self.failures = 0
        """Episodes failed so far (env error, worker crash or timeout)."""
        self.last_errors: dict[int, str] = {}
        """Slot -> error of the last reset/step call."""
        self._active: set[int] = set()  # slots holding an episode
        self._lost: set[int] = set()  # slots whose episode died with a restarted worker
        self._ctx = mp.get_context("spawn")
        self._workers: list[tuple[mp.Process, Connection, float]] = []  # process, pipe, extra first-answer time
        if n_workers == 0:
            self._family, self._envs = importlib.import_module(self.module), {}
        for _ in range(n_workers):
            self._workers.append(self._start())

    def _start(self) -> tuple[mp.Process, Connection, float]:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child, self.module, self.options), daemon=True)
        proc.start()
        child.close()
        return proc, parent, self.start_timeout

    def _restart(self, w: int) -> None:
        proc, conn, _ = self._workers[w]
        proc.kill()
        proc.join(5)
        conn.close()
        self._workers[w] = self._start()

    def _call(self, cmd: str, payload: dict[int, Any]) -> dict[int, tuple[bool, Any]]:
        if self.n_workers == 0:
            return _run(self._envs, self._family, self.options, cmd, payload)
        out: dict[int, tuple[bool, Any]] = {}
        pending: dict[Connection, int] = {}
        deadline: dict[int, float] = {}
        for w in range(self.n_workers):
            part = {s: a for s, a in payload.items() if s % self.n_workers == w}
            if not part:
                continue
            proc, conn, grace = self._workers[w]
            try:
                conn.send((cmd, part))
                pending[conn], deadline[w] = w, time.monotonic() + self.timeout + grace
            except (OSError, ValueError):  # broken pipe: the worker is already gone
                self._fail_worker(w, "worker died", out, part)
        while pending:
            left = min(deadline[w] for w in pending.values()) - time.monotonic()
            for conn in wait(list(pending), timeout=max(left, 0)):
                w = pending.pop(conn)
                try:
                    out.update(conn.recv())
                    self._workers[w] = (*self._workers[w][:2], 0.0)  # answered once: no more grace
                except (EOFError, OSError):
                    self._fail_worker(w, "worker died", out, payload)
            for conn, w in list(pending.items()):
                if time.monotonic() >= deadline[w]:
                    del pending[conn]
                    self._fail_worker(w, f"no answer within {self.timeout:g} s", out, payload)
        return out

    def _fail_worker(self, w: int, why: str, out: dict, payload: dict[int, Any]) -> None:
        """Restart worker w: fail its slots in this call; its other episodes are lost."""
        self._restart(w)
        mine = {s for s in self._active | set(payload) if s % self.n_workers == w}
        for s in mine & set(payload):
            out[s] = (False, f"worker {w}: {why}")
        self._lost |= mine - set(payload)
        self._active -= mine

    def reset(self, slot_games: list[GameSpec | None]) -> list[Observation | None]:
        """Start one game per slot (None leaves a slot idle); None back where the reset failed."""
        payload = {s: g for s, g in enumerate(slot_games) if g is not None}
        self._lost -= set(payload)
        res = self._call("reset", payload)
        self.last_errors = {s: err for s, (ok, err) in res.items() if not ok}
        self.failures += len(self.last_errors)
        self._active |= {s for s, (ok, _) in res.items() if ok}
        return [res[s][1] if s in res and res[s][0] else None for s in range(len(slot_games))]

    def step(self, actions: list[str | None]) -> list[StepResult | None]:
        """Step every slot with an action (None: skip it, and get None back)."""
        payload = {s: a for s, a in enumerate(actions) if a is not None}
        res = {s: (False, "episode lost: its worker was restarted") for s in payload if s in self._lost}
        res.update(self._call("step", {s: a for s, a in payload.items() if s not in res}))
        self._lost -= set(res)  # a lost episode is reported once, then the slot is idle
        self.last_errors = {s: err for s, (ok, err) in res.items() if not ok}
        self.failures += len(self.last_errors)
        self._active -= set(self.last_errors)
        results: list[StepResult | None] = [None] * len(actions)
        for s, (ok, value) in res.items():
            results[s] = StepResult(*value) if ok else StepResult(None, done=True, failed=True, error=value)
        return results

    def close(self) -> None:
        for proc, conn, _ in self._workers:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        for proc, conn, _ in self._workers:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
            conn.close()
        self._workers = []
        for env in getattr(self, "_envs", {}).values():  # n_workers == 0: envs live in this process
            env.close()
        self._envs = {}

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
