"""Write a sampled scene as an ALFWorld game: ``game.tw-pddl`` + ``traj_data.json``.

The problem follows ALFRED's own writer (``alfworld/gen/game_states/planned_game_state.py``):
ids mangled with ``_bar_``/``_minus_``/``_plus_``/``_dot_``, locations
``loc|x|z|rot|horizon``, every object and receptacle type declared (the domain
names SinkBasinType, MicrowaveType, FridgeType, KnifeType as constants), the goal
taken from ``alfworld.gen.goal_library``. The grammar is ``alfred.twl2`` with
the task filled in by ``alfworld.agents.utils.misc.add_task_to_grammar``, so
ALFWorld's loaders (``AlfredTWEnv``, ``alfworld-play-tw``) and experts accept it.
"""

from __future__ import annotations

import json
import random
import sys
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from agentrecipe.envs.alfworld.scene import LAMPS, Scene

GENERATOR = "agentrecipe.alfworld/1"


def mangle(name: str) -> str:
    """ALFRED id -> PDDL name (``PlannedGameState.fix_pddl_str_chars``)."""
    for a, b in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        name = name.replace(a, b)
    return name


def _loc(loc: tuple[int, int, int, int]) -> str:
    return mangle("loc|%d|%d|%d|%d" % loc)


@lru_cache(maxsize=1)
def game_logic() -> tuple[str, str]:
    """(pddl_domain, grammar) shipped with alfworld."""
    import alfworld

    data = Path(alfworld.__file__).parent / "data"
    return (data / "alfred.pddl").read_text(), (data / "alfred.twl2").read_text()


@contextmanager
def seeded_global_random(seed):
    """Run code that calls the `random` module (alfworld does) with a fixed seed, then restore."""
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)


@contextmanager
def keep_argv():
    """fast-downward's PDDL translator overwrites sys.argv; put it back."""
    argv = list(sys.argv)
    try:
        yield
    finally:
        sys.argv[:] = argv


def problem_pddl(scene: Scene) -> str:
    import alfworld.gen.constants as C
    import alfworld.gen.goal_library as glib

    rtypes = sorted(set(C.RECEPTACLES) - set(C.MOVABLE_RECEPTACLES))
    otypes = sorted(set(C.OBJECTS_SET) - set(rtypes))
    recep_by_id = {r.id: r for r in scene.receptacles}
    locations = sorted({_loc(r.loc) for r in scene.receptacles} | {_loc(scene.agent_loc)})
    act = C.VAL_ACTION_OBJECTS

    objects = ["agent1 - agent"]
    objects += [f"{t}Type - otype" for t in otypes]
    objects += [f"{t}Type - rtype" for t in rtypes]
    objects += [f"{mangle(o.id)} - object" for o in scene.objects]
    objects += [f"{mangle(r.id)} - receptacle" for r in scene.receptacles]
    objects += [f"{loc} - location" for loc in locations]

    init = [f"(atLocation agent1 {_loc(scene.agent_loc)})"]
    for r in scene.receptacles:
        rid = mangle(r.id)
        init.append(f"(receptacleType {rid} {r.cls}Type)")
        init.append(f"(receptacleAtLocation {rid} {_loc(r.loc)})")
        if r.cls in C.OPENABLE_CLASS_SET:
            init.append(f"(openable {rid})")
        if r.id in scene.opened:
            init.append(f"(opened {rid})")
    obj_classes = sorted({o.cls for o in scene.objects})
    for r_cls in sorted({r.cls for r in scene.receptacles}):
        for o_cls in obj_classes:
            if o_cls in C.VAL_RECEPTACLE_OBJECTS.get(r_cls, ()):
                init.append(f"(canContain {r_cls}Type {o_cls}Type)")
    for o in scene.objects:
        oid, parent = mangle(o.id), recep_by_id[o.parent]
        init.append(f"(objectType {oid} {o.cls}Type)")
        init.append(f"(inReceptacle {oid} {mangle(parent.id)})")
        init.append(f"(wasInReceptacle {oid} {mangle(parent.id)})")
        init.append(f"(objectAtLocation {oid} {_loc(parent.loc)})")
        if o.cls not in LAMPS:
            init.append(f"(pickupable {oid})")
        if o.cls in C.MOVABLE_RECEPTACLES_SET:
            init.append(f"(isReceptacleObject {oid})")
        for prop, pred in (("Cleanable", "cleanable"), ("Heatable", "heatable"), ("Coolable", "coolable"), ("Sliceable", "sliceable")):
            if o.cls in act[prop]:
                init.append(f"({pred} {oid})")
        if o.cls in LAMPS:
            init.append(f"(toggleable {oid})")
        if parent.cls == "Fridge" and o.cls in act["Coolable"]:
            init.append(f"(isCool {oid})")  # as ALFRED: what starts in the fridge is cold

    goal = glib.gdict[scene.task_type]["pddl"].format(
        obj=scene.object_target, recep=scene.parent_target, toggle=scene.toggle_target, mrecep=""
    )
    goal = goal.replace("#", "-").strip()  # the library writes '#' for '-'; it also closes (define
    name = f"plan_{scene.task_type}_{scene.floorplan}_{scene.seed}"
    sep = "\n        "
    return (
        f"(define (problem {name})\n    (:domain alfred)\n    (:objects{sep}{sep.join(objects)}\n    )\n"
        f"    (:init{sep}{sep.join(init)}\n    )\n    {goal}\n"
    )


def traj_data(scene: Scene, task_desc: str, level: str) -> dict:
    """The fields of ALFRED's traj_data.json that ALFWorld reads, plus where the game came from."""
    return {
        "task_id": f"gen_{scene.task_type}_{scene.floorplan}_{scene.seed}",
        "task_type": scene.task_type,
        "pddl_params": {
            "object_target": scene.object_target,
            "parent_target": scene.parent_target,
            "toggle_target": scene.toggle_target,
            "mrecep_target": "",
            "object_sliced": False,
        },
        "scene": {"floor_plan": f"FloorPlan{scene.floorplan}", "scene_num": scene.floorplan, "random_seed": scene.seed},
        "turk_annotations": {"anns": [{"task_desc": task_desc, "high_descs": [], "votes": []}]},
        "generator": {"name": GENERATOR, "level": level, "seed": scene.seed},
    }


def game_dirname(scene: Scene) -> str:
    """ALFRED's folder naming: <task>-<object>-<mrecep>-<parent>-<scene>/trial_<id>."""
    target = scene.parent_target or scene.toggle_target
    return f"{scene.task_type}-{scene.object_target}-None-{target}-{scene.floorplan}/trial_gen_{scene.seed:06d}"


def make_game(scene: Scene, level: str) -> tuple[dict, dict]:
    """(game.tw-pddl data without walkthrough, traj_data) for a scene."""
    from alfworld.agents.utils.misc import add_task_to_grammar

    domain, grammar = game_logic()
    traj = traj_data(scene, "", level)
    with seeded_global_random(scene.seed):  # the task template is a random.choice
        grammar = add_task_to_grammar(grammar, traj)
    traj["turk_annotations"]["anns"][0]["task_desc"] = grammar.split("Your task is to: ", 1)[1].split('"', 1)[0].rstrip(".")
    game = {"pddl_domain": domain, "grammar": grammar, "pddl_problem": problem_pddl(scene), "solvable": None, "walkthrough": None}
    return game, traj


@lru_cache(maxsize=1)
def _solver():
    """One planner env per process: each PddlEnv loads its own 33 MB copy of libdownward."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs import PddlEnv

    return AlfredDemangler(PddlEnv(textworld.EnvInfos(policy_commands=True, won=True)), shuffle=False)


def solve(game: dict, max_plan_len: int = 100) -> list[str] | None:
    """The planner's walkthrough (demangled commands, as ALFWorld stores it), or None if unsolvable."""
    env = _solver()
    with keep_argv():
        try:
            env.load(game)
            plan = env.reset()["policy_commands"]
        except Exception:  # the planner raises when the goal is unreachable
            return None
    if not plan or len(plan) > max_plan_len:
        return None
    return list(plan)


def write_game(folder: Path, game: dict, traj: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "traj_data.json").write_text(json.dumps(traj, indent=2, sort_keys=True) + "\n")
    path = folder / "game.tw-pddl"
    path.write_text(json.dumps(game))
    return path
