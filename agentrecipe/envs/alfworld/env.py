"""ALFWorld games behind the Env protocol.

The chain is ALFWorld's own: ``PddlEnv`` -> ``AlfredDemangler`` (ids become
"cabinet 1") -> ``AlfredInfos`` -> ``AlfredExpert`` (handcoded or planner), as
``AlfredTWEnv`` builds it, so observations read like the benchmark.

Reward. The game itself only says won (score 1) or not (0). For a dense signal
the wrapper tracks *subgoal progress*: the task's subgoals in order, counted
from the PDDL facts of the current state (o: an object of the target type,
r: a receptacle of the parent type)

    pick_and_place_simple            hold o (or o in r) | o in r
    pick_{clean,heat,cool}_then_...  hold o (or o in r) | o clean/hot/cool | o in r
    pick_two_obj_and_place           hold o | one o in r | + hold another | two in r
    look_at_obj_in_light             hold o | lamp on at its place while holding (won)

progress = subgoals achieved in order / number of subgoals (best over
candidate objects), 1 when won. ``step()`` returns the change of progress, so
rewards sum to the final progress: 1 for a win (max_score = 1, as TextWorld
custom games) and negative steps when the agent undoes a subgoal (drops the
object). ``info["raw_reward"]`` is the game's own score change (1 on the
winning step), what a sparse reward uses.
"""

from __future__ import annotations

import json
import random
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from agentrecipe.envs.base import GameSpec, Observation

EXPERTS = ("handcoded", "planner", "none")
BANNER = "-= Welcome to TextWorld, ALFRED! =-"


def subgoal_progress(facts, task_type: str, params: dict) -> tuple[int, int]:
    """(subgoals achieved, subgoals) in the state given by PDDL `facts` (textworld Propositions)."""
    obj_t = params["object_target"].lower() + "type"
    parent_t = (params.get("parent_target") or "").lower() + "type"
    otype, rtype = {}, {}
    inrec: dict[str, set[str]] = defaultdict(set)
    preds: dict[str, set[str]] = defaultdict(set)
    held = set()
    for f in facts:
        args = [v.name for v in f.arguments]
        if f.name == "objecttype":
            otype[args[0]] = args[1]
        elif f.name == "receptacletype":
            rtype[args[0]] = args[1]
        elif f.name == "inreceptacle":
            inrec[args[1]].add(args[0])
        elif f.name == "holds":
            held.add(args[1])
        elif f.name in ("isclean", "ishot", "iscool"):
            preds[f.name].add(args[0])
    targets = [o for o, t in otype.items() if t == obj_t]
    placed = {o for r, objs in inrec.items() if rtype.get(r) == parent_t for o in objs}
    if task_type == "pick_two_obj_and_place":
        in_one = max((sum(otype.get(o) == obj_t for o in objs) for r, objs in inrec.items() if rtype.get(r) == parent_t), default=0)
        holding = any(o in held for o in targets)
        return (4, 4) if in_one >= 2 else (2 * in_one + holding, 4)
    if task_type == "look_at_obj_in_light":
        return int(any(o in held for o in targets)), 2
    state = {"pick_clean_then_place_in_recep": "isclean", "pick_heat_then_place_in_recep": "ishot",
             "pick_cool_then_place_in_recep": "iscool"}.get(task_type)
    steps = [lambda o: o in held or o in placed] + ([lambda o: o in preds[state]] if state else []) + [lambda o: o in placed]
    best = 0
    for o in targets:
        k = 0
        while k < len(steps) and steps[k](o):
            k += 1
        best = max(best, k)
    return best, len(steps)


class _Sandbox:
    """Keep the game's global side effects inside: ALFWorld's handcoded expert draws from
    the `random` module (it gets its own stream here), fast-downward overwrites sys.argv."""

    def __init__(self, seed: int):
        self.state = random.Random(seed).getstate()

    def __enter__(self):
        self.outer, self.argv = random.getstate(), list(sys.argv)
        random.setstate(self.state)

    def __exit__(self, *exc):
        self.state = random.getstate()
        random.setstate(self.outer)
        sys.argv[:] = self.argv


class AlfWorldEnv:
    """Plays ALFWorld ``game.tw-pddl`` files (generated or official) one at a time."""

    def __init__(self, expert: str = "handcoded", max_expert_steps: int = 200):
        if expert not in EXPERTS:
            raise ValueError(f"alfworld expert {expert!r}: use one of {', '.join(EXPERTS)}")
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos
        from textworld.envs import PddlEnv

        self.expert = expert
        infos = textworld.EnvInfos(admissible_commands=True, won=True, facts=expert == "handcoded", extras=["gamefile"])
        self._core = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
        self._env = AlfredExpert(self._core, expert_type=expert) if expert != "none" else self._core
        self._max_expert_steps = max_expert_steps
        self._loaded: str | None = None
        self._game: GameSpec | None = None

    # ------------------------------------------------------------------ protocol
    def reset(self, game: GameSpec) -> Observation:
        path = str(Path(game.path).resolve())
        if path != self._loaded:
            self._loaded = None  # a failed load leaves nothing half-loaded behind
            traj = json.loads((Path(path).parent / "traj_data.json").read_text())
            self._task_type, self._params = traj["task_type"], traj["pddl_params"]
            with _Sandbox(0):
                self._env.load(path)
            if self.expert == "handcoded":  # AlfredExpert.load makes it with max_steps=200
                self._env._handcoded_expert.max_steps = self._max_expert_steps
            self._loaded = path
        self._game = game
        self._rng = _Sandbox(game.seed)
        self._expert_ok = self.expert != "none"
        with self._rng:
            state = self._env.reset()
        self._objective = state.feedback.split("Your task is to: ", 1)[-1].strip()
        self._score = self._progress(state)
        self._raw_score = float(state["won"])
        return self._observation(state, state.feedback)

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        if self._game is None:
            raise RuntimeError("reset() before step()")
        command = " ".join(str(action).lower().split())
        was_admissible = command in self._last_admissible
        with self._rng:
            if self._expert_ok:
                try:
                    state, _, _ = self._env.step(command)
                except Exception:  # the handcoded expert gave up (timeout or no subgoal left)
                    state, self._expert_ok = self._env.state, False
            else:
                state, _, _ = self._core.step(command)
        won = bool(state["won"])
        progress = self._progress(state)
        reward, self._score = progress - self._score, progress
        raw_reward, self._raw_score = float(won) - self._raw_score, float(won)
        obs = self._observation(state, state.feedback)
        info = {
            "won": won,
            "raw_reward": raw_reward,
            "raw_score": self._raw_score,
            "progress": progress,
            "admissible": was_admissible,
            # the command as played (lower-cased): the raw reply "Go to shelf 1" is not invalid
            "invalid": not was_admissible,
            "expert_failed": self.expert != "none" and not self._expert_ok,
        }
        return obs, reward, won, info

    def close(self) -> None:
        self._env.close()
        self.forget()

    def forget(self) -> None:
        """Drop the loaded game (the next reset reloads from disk even for the same path)."""
        self._loaded = self._game = None

    # ----------------------------------------------------------------- helpers
    def _progress(self, state) -> float:
        if state["won"]:
            return 1.0
        k, n = subgoal_progress(state["_facts"], self._task_type, self._params)
        return k / n

    def _observation(self, state, feedback: str) -> Observation:
        text = feedback.replace(BANNER, "").strip()
        admissible = tuple(state["admissible_commands"])
        self._last_admissible = admissible
        plan: tuple[str, ...] = ()
        if self._expert_ok and state.get("extra.expert_plan"):
            plan = tuple(state["extra.expert_plan"])
        won = bool(state["won"])
        return Observation(
            text=text,
            objective=self._objective,
            admissible_commands=admissible,
            score=self._score,
            max_score=1.0,
            won=won,
            lost=False,
            expert_action=plan[0] if plan and not won else None,
            expert_plan=plan if not won else (),
            extra={"task_type": self._task_type, "progress": self._score},
        )
