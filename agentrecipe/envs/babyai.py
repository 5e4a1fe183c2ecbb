"""BabyAI (Chevalier-Boisvert et al., 2019) as a text game, on the levels that ship with `minigrid`.

The family contract (see ``agentrecipe/envs/registry.py``):

- Levels are BabyAI level names without the ``BabyAI-`` prefix and version suffix
  (``GoToRedBall``, ``PickupLoc``, ``UnlockPickup``, ``BossLevel``, ...): every
  ``BabyAI-*`` id registered in gymnasium by minigrid. params/env/babyai.yaml lists an
  easy-to-hard order for a curriculum.
- A game is the level and a seed (a small JSON file); the level's generator makes the
  same grid from the same seed. Splits are disjoint because their seed ranges are
  (EnvConfig checks it).
- Expert: minigrid's ``BabyAIBot``, which replans from the current state after every
  step (so it still helps after the agent strayed, until it gives up). Its plan from the
  start is recorded in the manifest and must win the game at build time.

Observations are rendered as text the way AgentGym's BabyAI server describes the scene:
the objects in the agent's 7x7 view with their distance in front and to the side, what
the agent faces and how far away, what it carries; the mission is the objective.
Actions are minigrid's primitive actions under fixed names (`ACTIONS`), always all
admissible. Reward: the level's own, ``1 - 0.9 * steps / max_steps`` on success and 0
otherwise (the score, max_score 1); an episode that reaches the level's max_steps is lost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from agentrecipe.envs.base import GameSpec, Observation

ACTIONS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")
"""Our names of minigrid's Actions left, right, forward, pickup, drop, toggle (in that order)."""
UNKNOWN_ACTION = "You cannot do that. Use one of: " + ", ".join(ACTIONS) + "."
MAX_EXPERT_STEPS = 1000


# ------------------------------------------------------------------------ levels
@lru_cache(maxsize=1)
def level_ids() -> dict[str, str]:
    """Level name -> gymnasium id, e.g. GoToRedBall -> BabyAI-GoToRedBall-v0."""
    import gymnasium as gym
    import minigrid  # noqa: F401  (registers the BabyAI ids)

    ids = {}
    for env_id in sorted(gym.registry):
        if env_id.startswith("BabyAI-"):
            ids[env_id[len("BabyAI-"):].rsplit("-v", 1)[0]] = env_id
    return ids


def intermediate_reward(name: str) -> bool:
    """A BabyAI level scores only at the win (1 - 0.9 * steps / max_steps): dense reward is sparse's,
    scaled by how fast the game was won, on every level."""
    check_level(name)
    return False


def check_level(name: str) -> None:
    if name not in level_ids():
        raise ValueError(f"unknown BabyAI level {name!r}; known: {', '.join(level_ids())}")


# ------------------------------------------------------------------- rendering
def _name(obj) -> str:
    if obj.type == "door":
        state = "locked" if obj.is_locked else "open" if obj.is_open else "closed"
        return f"{obj.color} {state} door"
    return f"{obj.color} {obj.type}"


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def describe(env) -> str:
    """What the agent sees (env: the unwrapped MiniGridEnv): visible objects nearest first,
    what it faces, what it carries."""
    grid, visible = env.gen_obs_grid()
    size = env.agent_view_size
    me_x, me_y = size // 2, size - 1  # the agent's cell in its own view, facing -y
    seen = []
    for j in range(size):
        for i in range(size):
            obj = grid.get(i, j)
            if (i, j) == (me_x, me_y) or not visible[i, j] or obj is None or obj.type in ("wall", "floor"):
                continue
            front, right = me_y - j, i - me_x
            seen.append((front + abs(right), front, right, _name(obj)))
    if seen:
        parts = []
        for _, front, right, name in sorted(seen):
            side = f"{_steps(abs(right))} to your {'right' if right > 0 else 'left'}"
            where = (f"right in front of you {_steps(front)} away" if right == 0 else
                     side if front == 0 else f"{_steps(front)} in front of you and {side}")
            parts.append(f"There is a {name} {where}.")
        text = "In front of you in this room, you can see several objects: " + " ".join(parts)
    else:
        text = "You cannot see any objects within sight."
    for k in range(1, size):  # the first thing straight ahead
        obj = grid.get(me_x, me_y - k)
        if not visible[me_x, me_y - k]:
            break
        if obj is not None and obj.type != "floor":
            text += f" You are facing a {'wall' if obj.type == 'wall' else _name(obj)} {_steps(k)} away."
            break
    carrying = env.carrying
    text += f" You are carrying a {_name(carrying)}." if carrying is not None else " You are not carrying anything."
    return text


# -------------------------------------------------------------------- games
def _make(env_id: str):
    import gymnasium as gym
    import minigrid  # noqa: F401

    return gym.make(env_id)


def _reset(env, seed: int):
    """env.reset(seed=seed), without the level generator's "Sampling rejected" prints."""
    with contextlib.redirect_stdout(io.StringIO()):
        return env.reset(seed=seed)


def bot_plan(env_id: str, seed: int) -> tuple[list[str], bool]:
    """The BabyAI bot's actions from the start of (level, seed), and whether they win."""
    from minigrid.utils.baby_ai_bot import BabyAIBot

    env = _make(env_id)
    try:
        _reset(env, seed)
        bot = BabyAIBot(env.unwrapped)
        plan, action = [], None
        for _ in range(MAX_EXPERT_STEPS):
            action = bot.replan(action)
            if int(action) >= len(ACTIONS):  # `done`: the bot thinks it finished
                return plan, False
            plan.append(ACTIONS[int(action)])
            _, reward, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                return plan, bool(terminated and reward > 0)
        return plan, False
    finally:
        env.close()


def build_games(level: str, split: str, seeds: list[int], out_dir: str | Path, options: dict) -> list[GameSpec]:
    """One ``<level>-s<seed>.json`` per seed in out_dir, with the bot's plan (it must win)."""
    if options:
        raise ValueError(f"BabyAI games take no build options, got {sorted(options)}")
    check_level(level)
    env_id = level_ids()[level]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    games = []
    for seed in seeds:
        plan, won = bot_plan(env_id, seed)
        if not won:
            raise RuntimeError(f"BabyAI {level} seed {seed}: the BabyAI bot does not solve it ({len(plan)} steps)")
        path = out_dir / f"{level}-s{seed}.json"
        path.write_text(json.dumps({"env_id": env_id, "seed": seed}) + "\n")
        games.append(GameSpec(path=str(path), level=level, env="babyai", split=split, seed=seed,
                              max_score=1.0, expert_plan=tuple(plan)))
    return games


# --------------------------------------------------------------------------- env
class BabyAIEnv:
    """Plays BabyAI games one at a time; `expert` (default true) runs the bot alongside."""

    def __init__(self, expert: bool = True) -> None:
        self.expert = expert
        self._env = None
        self._env_id: str | None = None
        self._obs: Observation | None = None

    def reset(self, game: GameSpec) -> Observation:
        spec = json.loads(Path(game.path).read_text())
        if spec["env_id"] != self._env_id:
            self.close()
            self._env, self._env_id = _make(spec["env_id"]), spec["env_id"]
        raw, _ = _reset(self._env, int(spec["seed"]))
        self._mission = raw["mission"]
        self._score, self._done = 0.0, False
        self._bot = None
        if self.expert:
            from minigrid.utils.baby_ai_bot import BabyAIBot

            self._bot = BabyAIBot(self._env.unwrapped)
        self._obs = self._observation(describe(self._env.unwrapped), False, False, None)
        return self._obs

    def _next_expert(self, taken) -> str | None:
        if self._bot is None:
            return None
        try:
            action = int(self._bot.replan(taken))
        except Exception:  # noqa: BLE001 - the bot gives up on states it cannot handle
            self._bot = None
            return None
        return ACTIONS[action] if action < len(ACTIONS) else None

    def _observation(self, text: str, won: bool, lost: bool, taken) -> Observation:
        expert = None if won or lost else self._next_expert(taken)
        return Observation(text=text, objective=self._mission, admissible_commands=ACTIONS, score=self._score,
                           max_score=1.0, won=won, lost=lost, expert_action=expert,
                           expert_plan=(expert,) if expert else ())

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        if self._obs is None:
            raise RuntimeError("step() before reset()")
        command = " ".join(str(action).lower().split())
        if self._done or command not in ACTIONS:
            obs = self._obs if self._done else dataclasses.replace(self._obs, text=UNKNOWN_ACTION)  # bot not asked
            return obs, 0.0, self._done, {"invalid": True, "action": command}
        taken = self._env.unwrapped.actions(ACTIONS.index(command))
        _, reward, terminated, truncated, _ = self._env.step(taken)
        won = bool(terminated and reward > 0)
        self._done = bool(terminated or truncated)
        self._score += float(reward)
        self._obs = self._observation(describe(self._env.unwrapped), won, self._done and not won, taken)
        return self._obs, float(reward), self._done, {"invalid": False, "action": command}

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
        self._env, self._env_id = None, None


def make_env(options: dict) -> BabyAIEnv:
    unknown = set(options) - {"expert"}
    if unknown:
        raise ValueError(f"unknown BabyAI env options {sorted(unknown)} (known: expert)")
    return BabyAIEnv(expert=bool(options.get("expert", True)))
