"""Environments as a service: any registered family over HTTP, in OpenEnv's protocol.

    agentrecipe serve-env --env textworld --host 127.0.0.1 --port 8765

The server is OpenEnv's (`openenv.core.env_server`, FastAPI + uvicorn), so OpenEnv clients
(`openenv.core.env_client.EnvClient`, what TRL integrates) talk to it as to any OpenEnv
environment. One WebSocket session (`/ws`) plays one episode at a time:

    -> {"type": "reset", "data": {"game": {"path": ..., "level": ..., "env": "textworld", ...}}}
    <- {"type": "observation", "data": {"observation": {...}, "reward": 0.0, "done": false}}
    -> {"type": "step", "data": {"text": "open door"}}
    <- {"type": "observation", "data": {"observation": {...}, "reward": 1.0, "done": true}}
    -> {"type": "close"}

`game` holds the fields of `GameSpec` (the game file must be readable on the server's host);
`observation` the fields of `Observation` plus `info`, the step's info dict. Many sessions run
at once, each with its own family env; their env calls run one at a time in one thread
(families need not be thread-safe), so one server uses about one core: run more servers to use
more. A hung env call therefore stalls its whole server for good (a thread cannot be stopped):
the remote pool fails that server's episodes by timeout, and `GET /stats` reports how long the
running env call has taken (`busy_s`), from which the pool sees the server is still hung and
gives it no new episodes (its /health still answers: the event loop is not stuck). Only the session routes of
OpenEnv's "production" mode are served (/ws, /health, /metadata, /schema), not its stateless
/reset and /step (a fresh env per request, useless for multi-turn games).

Memory stays bounded (AgentGym's WebShop server ran out of memory because episodes were never
closed): a session's family env is made at reset and closed when the episode ends (`done`), at
the session's next reset, when the session closes or its client disconnects, and when it has
been idle for `idle_timeout` seconds; at most `max_episodes` sessions exist at once.
`GET /stats` counts open envs and episodes played.

Bad input: actions are plain strings handed to the family's `step` (never evaluated; each
family sanitises its own commands), at most `MAX_ACTION_CHARS` long; a `game` must name this
server's family and, with `game_root`, lie under that folder; WebSocket messages and HTTP bodies
over `MAX_BODY_BYTES` are refused. The server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentrecipe.envs import registry
from agentrecipe.envs.base import GameSpec, Observation

# openenv-core 0.3.0 imports gradio (its optional web UI) when its server package is imported:
# 6 s and 130 MB more per process, measured. The UI is never enabled here, and OpenEnv skips it
# when gradio cannot be imported, so keep it out (unless this process already loaded gradio).
sys.modules.setdefault("gradio", None)  # type: ignore[arg-type]

from openenv.core.env_server import (  # noqa: E402
    Action,
    ConcurrencyConfig,
    Environment,
    HTTPEnvServer,
    ServerMode,
    State,
)
from openenv.core.env_server import Observation as OpenEnvObservation  # noqa: E402
from openenv.core.env_server.types import EnvironmentMetadata  # noqa: E402

MAX_ACTION_CHARS = 4096
"""Longest action accepted (a policy reply is a few dozen tokens)."""
MAX_BODY_BYTES = 1 << 20
"""Largest WebSocket message or HTTP request body accepted (a game spec with a long plan is a few KiB)."""


class TextAction(Action):
    """One command, as the agent wrote it."""

    text: str = Field(max_length=MAX_ACTION_CHARS)


class GameModel(BaseModel):
    """A `GameSpec` on the wire."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, max_length=4096)
    level: str = Field(max_length=256)
    env: str = Field(max_length=64)
    split: str = Field(default="train", max_length=64)
    seed: int = 0
    max_score: float = 1.0
    expert_plan: list[str] = Field(default_factory=list, max_length=10_000)

    @classmethod
    def from_spec(cls, game: GameSpec) -> GameModel:
        return cls(path=str(game.path), level=game.level, env=game.env, split=game.split, seed=game.seed,
                   max_score=game.max_score, expert_plan=list(game.expert_plan))

    def spec(self) -> GameSpec:
        return GameSpec(self.path, self.level, self.env, self.split, self.seed, self.max_score, tuple(self.expert_plan))


class TextObservation(OpenEnvObservation):
    """An `Observation` on the wire, plus the step's info dict (`done` and `reward` are OpenEnv's)."""

    text: str
    objective: str
    admissible_commands: list[str]
    score: float
    max_score: float
    won: bool = False
    lost: bool = False
    expert_action: str | None = None
    expert_plan: list[str] = Field(default_factory=list)
    extra: dict[str, Any] = Field(default_factory=dict)
    info: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_step(cls, obs: Observation, reward: float, done: bool, info: dict[str, Any]) -> TextObservation:
        return cls(text=obs.text, objective=obs.objective, admissible_commands=list(obs.admissible_commands),
                   score=obs.score, max_score=obs.max_score, won=obs.won, lost=obs.lost,
                   expert_action=obs.expert_action, expert_plan=list(obs.expert_plan), extra=dict(obs.extra),
                   info=dict(info), reward=float(reward), done=bool(done))

    def observation(self) -> Observation:
        return Observation(self.text, self.objective, tuple(self.admissible_commands), self.score, self.max_score,
                           self.won, self.lost, self.expert_action, tuple(self.expert_plan), dict(self.extra))


class _Counts:
    """Open family envs, episodes started and the running env call of this server process (for /stats)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open_envs = 0
        self.episodes = 0
        self.call_started: float | None = None
        """time.monotonic() when the env call now running began (None: no call running)."""

    @contextlib.contextmanager
    def env_call(self):
        """Time one env call (they run one at a time, in the sessions' one thread)."""
        self.call_started = time.monotonic()
        try:
            yield
        finally:
            self.call_started = None

    def busy_s(self) -> float:
        """Seconds the running env call has taken so far (0 when none runs)."""
        started = self.call_started
        return 0.0 if started is None else time.monotonic() - started


COUNTS = _Counts()


class FamilyEnvironment(Environment):
    """One OpenEnv session playing games of one family, one episode at a time."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session owns its family env ...
    REQUIRES_SINGLE_THREAD_EXECUTOR = True  # ... but all run in one thread: families need not be thread-safe
    # (TextWorld is not: three games loading at once in threads failed in its grammar parser, measured)

    def __init__(self, family: str, options: dict[str, Any], game_root: str | None = None):
        super().__init__()
        self.family_name = family
        self.family = importlib.import_module(registry.FAMILIES[family])
        self.options = options
        self.game_root = Path(game_root).resolve() if game_root else None
        self._env = None
        self._closed = False  # closed by OpenEnv (client gone, or reaped idle): its socket may still send
        self._state = State()

    def _close_env(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            with COUNTS.lock:
                COUNTS.open_envs -= 1
            env.close()

    def _check_game(self, game: GameModel) -> GameSpec:
        if game.env != self.family_name:
            raise ValueError(f"this server plays {self.family_name!r} games, not {game.env!r}")
        if self.game_root is not None and not Path(game.path).resolve().is_relative_to(self.game_root):
            raise ValueError(f"game path {game.path!r} is outside this server's game folder")
        return game.spec()

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              game: dict[str, Any] | None = None) -> TextObservation:
        spec = self._check_game(GameModel.model_validate(game if game is not None else {}))
        with COUNTS.env_call():
            self._close_env()
            self._refuse_if_closed()
            self._env = self.family.make_env(self.options)
            with COUNTS.lock:
                COUNTS.open_envs += 1
                COUNTS.episodes += 1
            try:
                obs = self._env.reset(spec)
                self._refuse_if_closed()  # closed while this reset ran: its env would outlive the session
            except BaseException:
                self._close_env()
                raise
        self._state = State(episode_id=episode_id, step_count=0)
        return TextObservation.from_step(obs, 0.0, False, {})

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        if self._env is None:
            raise ValueError("no episode in this session (reset it first)")
        with COUNTS.env_call():
            try:
                obs, reward, done, info = self._env.step(action.text)
            except BaseException:
                self._close_env()
                raise
            self._state.step_count += 1
            if done:  # the episode is over: free its env now, not when the client disconnects
                self._close_env()
        return TextObservation.from_step(obs, reward, done, info)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:  # not timed: OpenEnv may call it outside the env thread, beside a running call
        self._closed = True
        self._close_env()

    def _refuse_if_closed(self) -> None:
        """An idle session OpenEnv reaped keeps its WebSocket: a reset there would open an env that no
        session accounts for (never closed, outside --max-episodes, off the one env thread)."""
        if self._closed:
            raise ValueError("this session was closed (idle past the server's idle timeout): open a new one")

    def get_metadata(self) -> EnvironmentMetadata:
        """`name` is the family: the remote pool checks it at start."""
        return EnvironmentMetadata(name=self.family_name, description="agentrecipe environment family")


def create_app(family: str, options: dict[str, Any] | None = None, max_episodes: int = 256,
               idle_timeout: float = 600.0, game_root: str | None = None):
    """The FastAPI app serving `family` (an unknown family fails here, listing the known ones, and so do
    bad options)."""
    played = registry.play_options(family, options)  # in /stats: a remote pool checks them against its run's
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    factory = functools.partial(FamilyEnvironment, family, dict(options or {}), game_root)
    app = FastAPI(title=f"agentrecipe: {family} environments (OpenEnv protocol)")
    # Production mode: sessions (/ws) only, no stateless /reset and /step (a fresh env per request,
    # in a pool of threads); /health, /metadata and /schema stay.
    HTTPEnvServer(factory, TextAction, TextObservation,
                  concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_episodes, session_timeout=idle_timeout),
                  ).register_routes(app, mode=ServerMode.PRODUCTION)

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        if request.method in ("POST", "PUT", "PATCH"):
            length = request.headers.get("content-length")
            if length is None:
                return JSONResponse({"detail": "a request body needs a Content-Length"}, status_code=411)
            if not length.isdigit() or int(length) > MAX_BODY_BYTES:
                return JSONResponse({"detail": f"request body over {MAX_BODY_BYTES} bytes"}, status_code=413)
        return await call_next(request)

    @app.get("/stats")
    def stats() -> dict[str, Any]:
        return {"family": family, "open_envs": COUNTS.open_envs, "episodes": COUNTS.episodes, "pid": os.getpid(),
                "busy_s": COUNTS.busy_s(), "play_options": played}

    return app


def serve(family: str, host: str = "127.0.0.1", port: int = 8765, options: dict[str, Any] | None = None,
          max_episodes: int = 256, idle_timeout: float = 600.0, game_root: str | None = None) -> None:
    """Serve `family` until interrupted."""
    import uvicorn

    app = create_app(family, options, max_episodes, idle_timeout, game_root)
    print(f"serve-env: {family} on http://{host}:{port} (pid {os.getpid()}, at most {max_episodes} episodes at once)",
          flush=True)
    uvicorn.run(app, host=host, port=port, ws_max_size=MAX_BODY_BYTES, log_level="warning")
