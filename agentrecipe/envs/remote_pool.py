"""EnvPool's interface over environment servers (`agentrecipe serve-env`, see server.py).

    with RemotePool("textworld", ["http://127.0.0.1:8765", "http://127.0.0.1:8766"], timeout=30) as pool:
        obs = pool.reset(games)                 # one game per slot
        results = pool.step(actions)            # one action per slot (None: leave it alone)

Each slot's episode is one OpenEnv WebSocket session (`openenv.core.env_client.EnvClient`) on
one server; a reset starts every new episode on the live server holding the fewest of this
pool's episodes, so episodes spread evenly. A session is closed when its episode ends (done),
when its slot is reset and when the pool closes. All sessions are stepped at once (asyncio, in
the pool's own thread).

Failures are EnvPool's: an env error, a request without an answer within `timeout` seconds, or a
server that died or hangs fails only the episodes it held, each once, as
`StepResult(failed=True, error=...)` (or None from reset), counted in `failures`, never raised.
Every reset first asks each server's `/stats` (within `connect_timeout`); a server that does
not answer, or reports an env call running longer than `timeout` (hung: its /health still
answers, but its env thread never comes back; `start_timeout` more until it has answered this
pool once) gets no new episodes for `retry_after` seconds and is then asked again. A request
left without an answer sets nothing aside by itself: the next reset's /stats tells a hung or
frozen server from one call that was slow (before, one 0.4 s step against a 0.3 s timeout kept
a healthy server out for `retry_after`, and every episode of the next reset failed).
A server's first resets get `start_timeout` more seconds (imports).
A server that does not answer when the pool starts, serves another family, or plays it with other
options that change episodes (the family's PLAY_OPTIONS, e.g. env.swe.window) than this run's
`options`, is an error then: the run would record its own options and play the server's.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentrecipe.envs import registry
from agentrecipe.envs.base import GameSpec, Observation
from agentrecipe.envs.pool import StepResult
from agentrecipe.envs.server import GameModel, TextAction, TextObservation  # first: it keeps gradio out of openenv

from openenv.core.client_types import StepResult as OpenEnvStepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server import State


class FamilyClient(EnvClient[TextAction, TextObservation, State]):
    """OpenEnv client of one agentrecipe env server session."""

    def _step_payload(self, action: TextAction) -> dict[str, Any]:
        return {"text": action.text}

    def _parse_result(self, payload: dict[str, Any]) -> OpenEnvStepResult[TextObservation]:
        obs = TextObservation(**payload.get("observation", {}), reward=payload.get("reward"),
                              done=bool(payload.get("done", False)))
        return OpenEnvStepResult(observation=obs, reward=obs.reward, done=obs.done)

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)

    async def end(self, timeout: float) -> None:
        """Ask the server to end the session and wait until it has closed the connection; cut it after
        `timeout` s (a dead or hung server). Closing first, as `disconnect()` does, makes OpenEnv 0.3.0's
        server log a traceback for every session."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        try:
            await asyncio.wait_for(self._close_from_server(ws), timeout)
        except Exception:  # noqa: BLE001
            ws.transport.abort()

    def abort(self) -> None:
        """Drop the connection now (after a failed request; the server then ends the session)."""
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.transport.abort()

    @staticmethod
    async def _close_from_server(ws) -> None:
        await ws.send(json.dumps({"type": "close"}))
        await ws.wait_closed()


def absolute(game: GameSpec) -> GameSpec:
    """`game` with its path made absolute where it names a file or folder here: a server opens a
    relative path in its own working folder, where a queued experiment's (or another clone's)
    games are not, or are another build's of the same name."""
    path = Path(game.path)
    return replace(game, path=str(path.resolve())) if not path.is_absolute() and path.exists() else game


def _timed_out(e: BaseException) -> bool:
    return isinstance(e, (asyncio.TimeoutError, TimeoutError))


def _why(e: BaseException) -> str:
    if _timed_out(e):
        return "no answer in time"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


class RemotePool:
    def __init__(self, family: str, urls: list[str], timeout: float = 30.0, connect_timeout: float = 5.0,
                 retry_after: float = 30.0, start_timeout: float = 120.0, options: dict[str, Any] | None = None):
        if not urls:
            raise ValueError("RemotePool needs at least one server URL")
        self.family = family
        self.play_options = registry.play_options(family, options)  # what every server must play with
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout = timeout
        """Seconds one env call may take. A server runs its env calls one at a time, so a request
        waits for the others of the same call on its server: it gets `timeout` x their number."""
        self.connect_timeout = connect_timeout
        self.retry_after = retry_after
        self.start_timeout = start_timeout
        """Extra seconds for a server's first resets (its family's imports happen then)."""
        self._warm: set[int] = set()  # servers that have answered a reset
        self._answered: set[int] = set()  # ... ever (a server still importing may be busy past timeout)
        self.failures = 0
        """Episodes failed so far (env error, dead or hung server, timeout)."""
        self.last_errors: dict[int, str] = {}
        """Slot -> error of the last reset/step call."""
        self._sessions: dict[int, tuple[int, FamilyClient]] = {}  # slot -> (server, its session)
        self._down_until: dict[int, float] = {}  # server -> when to ask it again
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="remote-pool", daemon=True)
        self._thread.start()
        problems = self._run(self._check_servers())
        if problems:
            self.close()
            raise ConnectionError(f"env.remote: {'; '.join(problems)} (each URL needs "
                                  f"`agentrecipe serve-env --env {family} --port P --params <this run's "
                                  f"params.yaml>` running)")

    # ---------------------------------------------------------------- plumbing
    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _get(self, server: int, path: str) -> dict:
        import httpx

        async with httpx.AsyncClient(timeout=self.connect_timeout, trust_env=False) as http:
            r = await http.get(self.urls[server] + path)
            r.raise_for_status()
            return r.json()

    async def _check_servers(self) -> list[str]:
        """Every server answers, serves this family and plays it with this run's play options; what is
        wrong otherwise."""
        async def check(server: int) -> str | None:
            try:
                name = (await self._get(server, "/metadata")).get("name")
                if name != self.family:
                    return f"{self.urls[server]} serves {name!r}, not {self.family!r}"
                served = (await self._get(server, "/stats")).get("play_options", {})
            except Exception as e:  # noqa: BLE001
                return f"{self.urls[server]} does not answer ({_why(e)})"
            differ = registry.option_differences(self.family, self.play_options, served)
            return f"{self.urls[server]} plays other options ({'; '.join(differ)})" if differ else None

        return [p for p in await asyncio.gather(*(check(i) for i in range(len(self.urls)))) if p]

    async def _live_servers(self) -> list[int]:
        """Servers answering /stats now, with no env call running past `timeout` (before, a server
        whose env call hung still answered /health, so after each `retry_after` it got new episodes,
        and every one of them failed by timeout); others are left alone for retry_after seconds."""
        now = time.monotonic()
        asked = [i for i in range(len(self.urls)) if self._down_until.get(i, 0.0) <= now]

        async def healthy(server: int) -> bool:
            # another client's first call there may be importing the family: start_timeout more then
            limit = self.timeout + (0.0 if server in self._answered else self.start_timeout)
            try:
                stuck = (await self._get(server, "/stats")).get("busy_s", 0.0) > limit
            except Exception:  # noqa: BLE001
                stuck = True
            if stuck:
                self._set_down(server)
            return not stuck

        answers = await asyncio.gather(*(healthy(i) for i in asked))
        return [i for i, ok in zip(asked, answers) if ok]

    def _set_down(self, server: int) -> None:
        self._down_until[server] = time.monotonic() + self.retry_after
        self._warm.discard(server)  # it may come back as a fresh process

    async def _drop(self, slot: int, cut: bool = False) -> None:
        """End the slot's session; `cut`: drop the connection at once (a request got no answer)."""
        _, client = self._sessions.pop(slot, (None, None))
        if client is not None and cut:
            client.abort()
        elif client is not None:
            await client.end(self.connect_timeout)

    async def _drop_all(self) -> None:
        await asyncio.gather(*(self._drop(s) for s in list(self._sessions)))

    # ---------------------------------------------------------------- episodes
    async def _reset_one(self, slot: int, server: int, game: GameSpec, calls: int) -> tuple[bool, Any]:
        """`calls`: env calls of this reset queued on the server (this one included)."""
        limit = self.timeout * calls + (0.0 if server in self._warm else self.start_timeout)
        # every request is bounded by the wait_for around it, which knows how many share the server
        client = FamilyClient(self.urls[server], connect_timeout_s=self.connect_timeout, message_timeout_s=None)
        self._sessions[slot] = (server, client)
        try:
            result = await asyncio.wait_for(client.reset(game=GameModel.from_spec(absolute(game)).model_dump()),
                                            self.connect_timeout + limit)
        except Exception as e:  # noqa: BLE001 - any failure fails this episode only
            await self._drop(slot, cut=_timed_out(e))
            return False, f"{self.urls[server]}: {_why(e)}"
        self._warm.add(server)
        self._answered.add(server)
        return True, result.observation.observation()

    async def _reset(self, payload: dict[int, GameSpec]) -> dict[int, tuple[bool, Any]]:
        await asyncio.gather(*(self._drop(s) for s in payload if s in self._sessions))
        live = await self._live_servers()
        if not live:
            return {s: (False, f"no environment server answers ({', '.join(self.urls)})") for s in payload}
        load = Counter(server for server, _ in self._sessions.values())
        assigned = {}
        for s in payload:
            assigned[s] = min(live, key=lambda i: (load[i], i))
            load[assigned[s]] += 1
        calls = Counter(assigned.values())
        answers = await asyncio.gather(*(self._reset_one(s, assigned[s], g, calls[assigned[s]])
                                         for s, g in payload.items()))
        return dict(zip(payload, answers))

    async def _step_one(self, slot: int, action: str, calls: Counter) -> tuple[bool, Any]:
        """`calls`: env calls of this step queued on each server."""
        if slot not in self._sessions:
            return False, "no episode in this slot (reset it first)"
        server, client = self._sessions[slot]
        try:
            result = await asyncio.wait_for(client.step(TextAction(text=action)), self.timeout * calls[server])
        except Exception as e:  # noqa: BLE001
            await self._drop(slot, cut=_timed_out(e))
            return False, f"{self.urls[server]}: {_why(e)}"
        if result.done:  # the server has closed the episode's env; end the session too
            await self._drop(slot)
        obs = result.observation
        return True, (obs.observation(), float(obs.reward or 0.0), bool(obs.done), obs.info)

    async def _step(self, payload: dict[int, str]) -> dict[int, tuple[bool, Any]]:
        calls = Counter(self._sessions[s][0] for s in payload if s in self._sessions)
        answers = await asyncio.gather(*(self._step_one(s, a, calls) for s, a in payload.items()))
        return dict(zip(payload, answers))

    # ---------------------------------------------------------------- EnvPool's interface
    def reset(self, slot_games: list[GameSpec | None]) -> list[Observation | None]:
        """Start one game per slot (None leaves a slot idle); None back where the reset failed."""
        res = self._run(self._reset({s: g for s, g in enumerate(slot_games) if g is not None}))
        self.last_errors = {s: err for s, (ok, err) in res.items() if not ok}
        self.failures += len(self.last_errors)
        return [res[s][1] if s in res and res[s][0] else None for s in range(len(slot_games))]

    def step(self, actions: list[str | None]) -> list[StepResult | None]:
        """Step every slot with an action (None: skip it, and get None back)."""
        res = self._run(self._step({s: a for s, a in enumerate(actions) if a is not None}))
        self.last_errors = {s: err for s, (ok, err) in res.items() if not ok}
        self.failures += len(self.last_errors)
        results: list[StepResult | None] = [None] * len(actions)
        for s, (ok, value) in res.items():
            results[s] = StepResult(*value) if ok else StepResult(None, done=True, failed=True, error=value)
        return results

    def close(self) -> None:
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            self._run(self._drop_all())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    def __enter__(self) -> RemotePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class PoolEnv:
    """Slot 0 of a pool as an `Env`, for code that plays one game at a time (the expert replays of
    SFT data generation: `replay_expert(PoolEnv(pool), game)`). A failure raises, as an in-process
    env's error would; closing is the pool owner's business."""

    def __init__(self, pool) -> None:
        self.pool = pool

    def reset(self, game: GameSpec) -> Observation:
        obs = self.pool.reset([game])[0]
        if obs is None:
            raise RuntimeError(f"{game.path}: reset failed: {self.pool.last_errors.get(0, 'unknown error')}")
        return obs

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        res = self.pool.step([action])[0]
        if res.failed:
            raise RuntimeError(f"step {action!r} failed: {res.error}")
        return res.obs, res.reward, res.done, res.info

    def close(self) -> None:
        pass
