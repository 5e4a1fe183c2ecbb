"""Many episodes at once: env slots spread over worker processes.

    with EnvPool("textworld", {}, n_workers=2, timeout=30) as pool:
        obs = pool.reset(games)                 # one game per slot
        results = pool.step(actions)            # one action per slot (None: leave it alone)

Slot i lives in worker i % n_workers; each worker steps its slots in turn. A slot whose
env raises fails alone. A worker that dies or does not answer within `timeout` seconds
per env call it was sent (a worker holding 3 slots gets 3 x `timeout` for a step) is killed and restarted, and only the slot it was busy with fails: the pool remembers
each slot's game and actions, so the worker's other episodes are replayed on the fresh
worker (text games are deterministic) and go on as if nothing happened. After a death
the slot it was busy with is retried alone once (a worker killed from outside loses
nothing); dying again convicts it. Its error names the game, the worker's exit code and
the last lines the worker (or the game interpreter it runs) wrote.

Failures come back as `StepResult(failed=True, error=...)` (or None from reset) and are
counted in `pool.failures`; the caller never sees an exception from an environment.
`n_workers=0` runs the envs in this process (for debugging; no timeout).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Iterator

from agentrecipe.envs import registry
from agentrecipe.envs.base import GameSpec, Observation

OUTPUT_TAIL = 600
"""Characters of a dead worker's output quoted in the error."""


@contextmanager
def main_module_hidden() -> Iterator[None]:
    """Processes spawned inside this block do not re-run the parent's main module.

    multiprocessing's spawn imports the parent's `__main__` again in every child (by module name or
    path), so a worker of `python -m stages.evaluate` imported torch and transformers first: about
    10 s of CPU per worker, paid by every stage that opens a pool. Worker targets live in importable
    modules and need nothing from `__main__`, so the block hides its name and path from the spawn
    preparation while the children start; each child is still a fresh interpreter (no torch threads,
    no CUDA state) with the parent's current environment variables."""
    main = sys.modules["__main__"]
    saved = {key: main.__dict__[key] for key in ("__spec__", "__file__") if key in main.__dict__}
    main.__spec__ = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.update(saved)


@dataclass
class StepResult:
    obs: Observation | None
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    failed: bool = False
    error: str = ""


@dataclass
class _Worker:
    proc: Any
    conn: Connection
    busy: Any
    """Shared int: the slot the worker is working on (-1 between slots)."""
    log: Path
    """The worker's stdout and stderr (the interpreter's last words before a crash)."""
    grace: float
    """Extra seconds for the first answer of a fresh worker (imports)."""


@dataclass
class _Failure:
    why: str
    slot: int | None
    """The slot the worker was busy with, if it was inside one."""
    hung: bool


def _run(envs: dict, family, options: dict, cmd: str, payload: dict[int, Any],
         busy=None) -> dict[int, tuple[bool, Any]]:
    """Apply one command to some slots; {slot: (ok, result or error text)}.

    reset: {slot: game}; step: {slot: action}; replay: {slot: (game, actions)} resets the game
    and plays the actions (the result is the last one's)."""
    out = {}
    for slot, arg in payload.items():
        if busy is not None:
            busy.value = slot
        try:
            if cmd in ("reset", "replay"):
                game, actions = (arg, ()) if cmd == "reset" else arg
                if slot not in envs:
                    envs[slot] = family.make_env(options)
                result = envs[slot].reset(game)
                for action in actions:
                    result = envs[slot].step(action)
                out[slot] = (True, result)
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
    if busy is not None:
        busy.value = -1
    return out


def _worker(conn: Connection, module: str, options: dict, busy, log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)  # C-level output too (a game interpreter's fatal error)
    os.dup2(fd, 2)
    family = importlib.import_module(module)
    envs: dict[int, Any] = {}
    while (msg := conn.recv()) is not None:
        conn.send(_run(envs, family, options, *msg, busy=busy))
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
        self.restarts = 0
        """Workers restarted so far (crashes and timeouts)."""
        self.last_errors: dict[int, str] = {}
        """Slot -> error of the last reset/step call."""
        self._games: dict[int, GameSpec] = {}  # slots holding an episode: its game ...
        self._history: dict[int, list[str]] = {}  # ... and the actions played since its reset
        self._lost: dict[int, str] = {}  # slots whose episode could not be replayed after a restart
        self._ctx = mp.get_context("spawn")
        self._logs = Path(tempfile.mkdtemp(prefix="envpool-")) if n_workers else None
        # The worker logs' folder goes with the pool, also when it is dropped or the process exits unclosed.
        self._remove_logs = weakref.finalize(self, shutil.rmtree, self._logs, True) if n_workers else None
        self._workers: list[_Worker] = []
        if n_workers == 0:
            self._family, self._envs = importlib.import_module(self.module), {}
        for w in range(n_workers):
            self._workers.append(self._start(w))

    # ------------------------------------------------------------- workers
    def _start(self, w: int) -> _Worker:
        parent, child = self._ctx.Pipe()
        busy = self._ctx.Value("i", -1, lock=False)
        log = self._logs / f"worker{w}.log"
        log.write_bytes(b"")
        proc = self._ctx.Process(target=_worker, args=(child, self.module, self.options, busy, str(log)), daemon=True)
        with main_module_hidden():
            proc.start()
        child.close()
        return _Worker(proc, parent, busy, log, self.start_timeout)

    def _kill(self, w: int) -> str:
        """Stop worker w; what it left behind (exit code, last output) for the error message."""
        worker = self._workers[w]
        worker.proc.kill()
        worker.proc.join(5)
        worker.conn.close()
        code = worker.proc.exitcode
        tail = " ".join(worker.log.read_text(errors="replace")[-OUTPUT_TAIL:].split())
        return f"exit code {code}" + (f", its last output: {tail!r}" if tail else ", no output")

    def _restart(self, w: int) -> str:
        report = self._kill(w)
        self._workers[w] = self._start(w)
        self.restarts += 1
        return report

    def _send(self, w: int, cmd: str, part: dict[int, Any]) -> float | None:
        """Send a command to worker w; its deadline, or None when the pipe is already broken."""
        worker = self._workers[w]
        try:
            worker.conn.send((cmd, part))
        except (OSError, ValueError):
            return None
        return time.monotonic() + self._budget(cmd, part) + worker.grace

    def _budget(self, cmd: str, part: dict[int, Any]) -> float:
        """Seconds worker w gets for `part`: `timeout` per env call (its slots play in turn)."""
        calls = sum(1 + len(arg[1]) for arg in part.values()) if cmd == "replay" else len(part)
        return self.timeout * calls

    def _receive(self, w: int) -> dict[int, tuple[bool, Any]] | _Failure:
        """Worker w's answer (its pipe is readable), or how it failed."""
        worker = self._workers[w]
        try:
            answer = worker.conn.recv()
            worker.grace = 0.0  # answered once: no more grace
            return answer
        except (EOFError, OSError):
            return self._failure(w, "died", hung=False)

    def _failure(self, w: int, why: str, hung: bool) -> _Failure:
        slot = self._workers[w].busy.value
        return _Failure(why, slot if slot >= 0 else None, hung)

    def _call_one(self, w: int, cmd: str, part: dict[int, Any]) -> dict[int, tuple[bool, Any]] | _Failure:
        deadline = self._send(w, cmd, part)
        if deadline is None:
            return _Failure("died", None, hung=False)
        if wait([self._workers[w].conn], timeout=max(deadline - time.monotonic(), 0)):
            return self._receive(w)
        return self._failure(w, f"gave no answer within {self._budget(cmd, part):g} s", hung=True)

    # --------------------------------------------------------------- calls
    def _call(self, cmd: str, payload: dict[int, Any]) -> dict[int, tuple[bool, Any]]:
        if self.n_workers == 0:
            return _run(self._envs, self._family, self.options, cmd, payload)
        out: dict[int, tuple[bool, Any]] = {}
        parts = {w: {s: a for s, a in payload.items() if s % self.n_workers == w} for w in range(self.n_workers)}
        pending: dict[Connection, int] = {}
        deadline: dict[int, float] = {}
        failed: dict[int, _Failure] = {}
        for w, part in parts.items():
            if part:
                if (d := self._send(w, cmd, part)) is None:
                    failed[w] = _Failure("died", None, hung=False)
                else:
                    pending[self._workers[w].conn], deadline[w] = w, d
        while pending:
            left = min(deadline[w] for w in pending.values()) - time.monotonic()
            for conn in wait(list(pending), timeout=max(left, 0)):
                w = pending.pop(conn)
                answer = self._receive(w)
                if isinstance(answer, _Failure):
                    failed[w] = answer
                else:
                    out.update(answer)
            for conn, w in list(pending.items()):
                if time.monotonic() >= deadline[w]:
                    del pending[conn]
                    failed[w] = self._failure(w, f"gave no answer within {self._budget(cmd, parts[w]):g} s",
                                              hung=True)
        for w, failure in failed.items():
            out.update(self._recover(w, cmd, parts[w], failure))
        return out

    def _recover(self, w: int, cmd: str, part: dict[int, Any], failure: _Failure) -> dict[int, tuple[bool, Any]]:
        """Worker w failed a call on `part`: restart it, convict the slot at fault, replay the rest.

        Every episode worker w held is rebuilt on the fresh worker (its game and actions so
        far, then this call's action). A hang convicts the slot it hung in. After a death the
        slot the worker was busy with is retried alone once and convicted if it dies again;
        when the worker died outside any slot, the slots are retried one at a time. A
        convicted slot fails with its game's path and the dead worker's exit code and last
        output; the others get their normal results."""
        todo: dict[int, tuple[GameSpec, list[str]]] = {}
        for s, arg in part.items():
            todo[s] = (arg, []) if cmd == "reset" else (self._games[s], self._history[s] + [arg])
        for s in self._games:  # episodes of this worker that were not in the call: only rebuilt
            if s % self.n_workers == w and s not in todo:
                todo[s] = (self._games[s], list(self._history[s]))
        out: dict[int, tuple[bool, Any]] = {}
        rebuilt: dict[int, tuple[GameSpec, list[str]]] = {}  # living in the current worker process
        alone: set[int] = set()  # slots already retried on their own
        while True:
            report = self._restart(w)
            todo.update(rebuilt)  # the restart lost them again
            rebuilt = {}
            suspect = failure.slot if failure.slot in todo else None
            if suspect is not None and (failure.hung or suspect in alone):
                self._convict(suspect, f"worker {w} {failure.why} while playing {todo.pop(suspect)[0].path} ({report})",
                              part, out)
                suspect = None
            one_by_one = suspect is None and failure.slot is None
            while todo:
                batch = [suspect] if suspect is not None else [next(iter(todo))] if one_by_one else list(todo)
                if len(batch) == 1:
                    alone.add(batch[0])
                answer = self._call_one(w, "replay", {s: todo[s] for s in batch})
                if isinstance(answer, _Failure):
                    failure = answer
                    if failure.slot is None and len(batch) == 1:
                        failure.slot = batch[0]  # it died outside the env call, but playing only this slot
                    break
                for s, (ok, result) in answer.items():
                    entry = todo.pop(s)
                    if ok:
                        rebuilt[s] = entry
                    if s in part:
                        out.setdefault(s, (ok, result))
                    elif not ok:
                        self._convict(s, result, part, out)
                suspect = None  # cleared: the rest together (or still one at a time)
            if not todo:
                return out

    def _convict(self, s: int, error: str, part: dict[int, Any], out: dict) -> None:
        """Slot s's episode fails: now if it was in the call, else at its next step."""
        if s in part:
            out[s] = (False, error)
        else:
            self._lost[s] = error
            self._games.pop(s, None)
            self._history.pop(s, None)

    def _record(self, res: dict[int, tuple[bool, Any]], payload: dict[int, Any], cmd: str) -> None:
        """Book-keeping after a call: each slot's game and actions (for replays), errors, failures."""
        self.last_errors = {s: err for s, (ok, err) in res.items() if not ok}
        self.failures += len(self.last_errors)
        for s, (ok, _) in res.items():
            if not ok:
                self._games.pop(s, None)
                self._history.pop(s, None)
            elif cmd == "reset":
                self._games[s], self._history[s] = payload[s], []
            else:
                self._history[s].append(payload[s])

    def reset(self, slot_games: list[GameSpec | None]) -> list[Observation | None]:
        """Start one game per slot (None leaves a slot idle); None back where the reset failed."""
        payload = {s: g for s, g in enumerate(slot_games) if g is not None}
        for s in payload:
            self._lost.pop(s, None)
            self._games.pop(s, None)
            self._history.pop(s, None)
        res = self._call("reset", payload)
        self._record(res, payload, "reset")
        return [res[s][1] if s in res and res[s][0] else None for s in range(len(slot_games))]

    def step(self, actions: list[str | None]) -> list[StepResult | None]:
        """Step every slot with an action (None: skip it, and get None back)."""
        payload = {s: a for s, a in enumerate(actions) if a is not None}
        res = {s: (False, f"episode lost: {self._lost.pop(s)}") for s in list(payload) if s in self._lost}
        live = {s: a for s, a in payload.items() if s not in res and s in self._games}
        idle = [s for s in payload if s not in res and s not in live]
        res.update({s: (False, "no episode in this slot (reset it first)") for s in idle})
        res.update(self._call("step", live) if live else {})
        self._record(res, payload, "step")
        results: list[StepResult | None] = [None] * len(actions)
        for s, (ok, value) in res.items():
            results[s] = StepResult(*value) if ok else StepResult(None, done=True, failed=True, error=value)
        return results

    def close(self) -> None:
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass
        for worker in self._workers:
            worker.proc.join(5)
            if worker.proc.is_alive():
                worker.proc.kill()
                worker.proc.join()
            worker.conn.close()
        self._workers = []
        if self._remove_logs is not None:
            self._remove_logs()
        for env in getattr(self, "_envs", {}).values():  # n_workers == 0: envs live in this process
            env.close()
        self._envs = {}

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_pool(family: str, options: dict, workers: int, timeout: float, remote: list[str] | tuple = ()):
    """The pool to play `family` through: its servers when `remote` lists any (OpenEnv HTTP,
    agentrecipe/envs/remote_pool.py; they must play with `options`' play options), else `workers`
    local worker processes."""
    if remote:
        from agentrecipe.envs.remote_pool import RemotePool

        return RemotePool(family, list(remote), timeout=timeout, options=options)
    return EnvPool(family, options, n_workers=workers, timeout=timeout)
