"""Scenes and tasks sampled from the ALFRED floor plans that ship with ALFWorld.

A floor plan (``alfworld/gen/layouts/FloorPlanN-*``) gives the object classes
present in the room (``-objects.json``), the receptacle instances with their
ALFRED ids and interaction poses (``-openable.json``) and the reachable floor
points (``-layout.npy``). A scene keeps ``n_receptacles`` of those receptacles,
puts the task's objects and ``n_distractors`` other objects in receptacles
that may hold them (``constants.VAL_RECEPTACLE_OBJECTS``), opens some openable
receptacles, and places the agent on a floor point away from every receptacle
(so the first observation reads "You are in the middle of a room").

Everything is a pure function of (level, seed, floor plans): one
``random.Random(seed)`` drives all choices, lists are sorted before sampling.
"""

from __future__ import annotations

import json
import random
import re
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
LEVEL_RE = re.compile(r"^(any|" + "|".join(TASK_TYPES) + r")-r(\d+)-d(\d+)$")
MIN_RECEPTACLES = 3

# Receptacle that must exist for a task (the domain's Clean/Heat/CoolObject name these types).
APPLIANCE = {
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}
# Object property a task needs (constants.VAL_ACTION_OBJECTS keys).
ACTION_PROPERTY = {
    "pick_clean_then_place_in_recep": "Cleanable",
    "pick_heat_then_place_in_recep": "Heatable",
    "pick_cool_then_place_in_recep": "Coolable",
}
LAMPS = ("DeskLamp", "FloorLamp")
# ALFRED lists no receptacle for lamps; in ALFWorld they stand on furniture.
LAMP_RECEPTACLES = ("Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand")
ROOM_TYPES = {"Kitchen": range(1, 31), "LivingRoom": range(201, 231), "Bedroom": range(301, 331), "Bathroom": range(401, 431)}
P_OPEN = 0.25
"""Chance that an openable receptacle starts open."""


def parse_level(name: str) -> tuple[str, int, int]:
    """``<task>-rR-dD`` -> (task type or "any", receptacles, distractor objects)."""
    m = LEVEL_RE.match(name)
    if not m:
        raise ValueError(
            f"unknown ALFWorld level {name!r}; use <task>-rR-dD with task in any|{'|'.join(TASK_TYPES)}, "
            f"R receptacles (>= {MIN_RECEPTACLES}) and D distractor objects, e.g. pick_and_place_simple-r6-d2"
        )
    task, r, d = m.group(1), int(m.group(2)), int(m.group(3))
    if r < MIN_RECEPTACLES:
        raise ValueError(f"ALFWorld level {name!r}: needs at least {MIN_RECEPTACLES} receptacles, got r{r}")
    return task, r, d


# ------------------------------------------------------------------ floor plans
def _constants():
    import alfworld.gen.constants as C

    return C


def layouts_dir() -> Path:
    import alfworld.gen

    return Path(alfworld.gen.__file__).parent / "layouts"


def room_type(scene_num: int) -> str:
    for name, nums in ROOM_TYPES.items():
        if scene_num in nums:
            return name
    raise ValueError(f"FloorPlan{scene_num} is not an ALFRED floor plan")


def available_floorplans() -> list[int]:
    nums = {int(p.name[len("FloorPlan"):].split("-")[0]) for p in layouts_dir().glob("FloorPlan*-objects.json")}
    return sorted(nums)


FLOORPLAN_SETS = ("seen", "unseen", "all")


def parse_floorplans(spec) -> set[int] | None:
    """The floor plan numbers a `spec` lists (a list of numbers, or a string of numbers and ranges
    such as "1-30,201-230"); None for a named set (FLOORPLAN_SETS); ValueError for anything else."""
    if isinstance(spec, str) and spec in FLOORPLAN_SETS:
        return None
    if isinstance(spec, (list, tuple)) and all(isinstance(n, int) and not isinstance(n, bool) for n in spec):
        return set(spec)
    if isinstance(spec, str) and re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", spec.replace(" ", "")):
        nums: set[int] = set()
        for part in spec.replace(" ", "").split(","):
            a, _, b = part.partition("-")
            nums |= set(range(int(a), int(b or a) + 1))
        return nums
    raise ValueError(f"floor plans {spec!r}: use seen, unseen, all, a list of numbers or a string like '1-30,201-230'")


def select_floorplans(spec) -> list[int]:
    """Floor plans named by `spec`: "seen" (ALFRED train rooms), "unseen" (ALFRED test
    rooms), "all", a list of numbers, or a string of numbers and ranges ("1-30,201-230")."""
    C = _constants()
    avail = set(available_floorplans())
    nums = parse_floorplans(spec)
    if nums is None:
        nums = {"seen": set(C.TRAIN_SCENE_NUMBERS), "unseen": set(C.TEST_SCENE_NUMBERS), "all": avail}[spec]
    missing = sorted(nums - avail)
    if missing:
        raise ValueError(f"floor plans {missing} are not shipped with alfworld (have {len(avail)} layouts)")
    return sorted(nums)


@dataclass(frozen=True)
class Receptacle:
    id: str
    """ALFRED object id, e.g. ``Cabinet|+00.68|+00.50|-02.20``."""
    cls: str
    loc: tuple[int, int, int, int]
    """Interaction pose (x/0.25, z/0.25, rotation/90, horizon), as ALFRED's ``loc|x|z|r|h``."""


@dataclass(frozen=True)
class FloorPlan:
    num: int
    room: str
    receptacles: tuple[Receptacle, ...]
    objects: tuple[str, ...]
    """Classes of pickupable objects present in the room."""
    floor: tuple[tuple[int, int], ...]
    """Reachable floor points in grid units (x/0.25, z/0.25)."""


def _fmt(v: float) -> str:
    """ALFRED's coordinate format: +01.25, -00.50, 00.00."""
    s = f"{v:+06.2f}"
    return "00.00" if s in ("+00.00", "-00.00") else s


@lru_cache(maxsize=None)
def load_floorplan(num: int) -> FloorPlan:
    C = _constants()
    static = set(C.RECEPTACLES) - set(C.MOVABLE_RECEPTACLES)
    base = layouts_dir() / f"FloorPlan{num}"
    classes = json.loads(Path(f"{base}-objects.json").read_text())
    poses = json.loads(Path(f"{base}-openable.json").read_text())
    floor = tuple(sorted({(int(round(x / 0.25)), int(round(z / 0.25))) for x, z in np.load(f"{base}-layout.npy")}))

    receps = []
    for rid in sorted(poses):
        parts = rid.split("|")
        cls = parts[-1] if len(parts) == 5 else parts[0]  # Sink|x|y|z|SinkBasin -> SinkBasin
        if cls not in static:
            continue
        x, z, rot, hor = poses[rid]
        receps.append(Receptacle(rid, cls, (int(round(x / 0.25)), int(round(z / 0.25)), int(rot) // 90 % 4, int(hor))))
    # Receptacles the room has but whose poses were not precomputed (toasters,
    # coffee machines, stove burners, garbage cans...): one instance each, on a
    # floor point chosen by a hash of the room and class (fixed per floor plan).
    have = {r.cls for r in receps}
    for cls in sorted(set(classes) & static - have):
        h = zlib.crc32(f"{num}/{cls}".encode())
        fx, fz = floor[h % len(floor)]
        y = 0.5 + (h >> 8) % 100 / 100
        rid = f"{cls}|{_fmt(fx * 0.25)}|{_fmt(y)}|{_fmt(fz * 0.25)}"
        receps.append(Receptacle(rid, cls, (fx, fz, (h >> 16) % 4, 30)))

    holders = {o for objs in C.VAL_RECEPTACLE_OBJECTS.values() for o in objs}
    objects = sorted(
        c for c in set(classes)
        if c in C.OBJECTS and c not in static and "Sliced" not in c and (c in holders or c in LAMPS)
    )
    return FloorPlan(num, room_type(num), tuple(receps), tuple(objects), floor)


def can_hold(recep_cls: str, obj_cls: str) -> bool:
    if obj_cls in LAMPS:
        return recep_cls in LAMP_RECEPTACLES
    return obj_cls in _constants().VAL_RECEPTACLE_OBJECTS.get(recep_cls, ())


# ---------------------------------------------------------------------- scenes
@dataclass(frozen=True)
class Obj:
    id: str
    cls: str
    parent: str
    """Id of the receptacle it starts in."""


@dataclass(frozen=True)
class Scene:
    floorplan: int
    task_type: str
    object_target: str
    parent_target: str
    """Receptacle class to put the object(s) in ("" for look_at_obj_in_light)."""
    toggle_target: str
    """Lamp class for look_at_obj_in_light ("" otherwise)."""
    receptacles: tuple[Receptacle, ...]
    objects: tuple[Obj, ...]
    opened: tuple[str, ...]
    """Ids of openable receptacles that start open."""
    agent_loc: tuple[int, int, int, int]
    seed: int


@dataclass(frozen=True)
class TaskChoice:
    object_target: str
    parent_target: str
    toggle_target: str


def task_choices(fp: FloorPlan, task: str) -> list[TaskChoice]:
    """Every (object, parent, lamp) this floor plan supports for `task`, sorted."""
    C = _constants()
    if fp.room not in C.GOALS_VALID[task]:
        return []
    rclasses = sorted({r.cls for r in fp.receptacles})
    if task in APPLIANCE and APPLIANCE[task] not in rclasses:
        return []
    choices = []
    if task == "look_at_obj_in_light":
        for lamp in (c for c in LAMPS if c in fp.objects):
            if not any(can_hold(r, lamp) for r in rclasses):
                continue
            for obj in fp.objects:
                if obj not in LAMPS and any(can_hold(r, obj) for r in rclasses):
                    choices.append(TaskChoice(obj, "", lamp))
        return choices
    for obj in fp.objects:
        if obj in LAMPS or (task in ACTION_PROPERTY and obj not in C.VAL_ACTION_OBJECTS[ACTION_PROPERTY[task]]):
            continue
        for parent in rclasses:
            if parent == APPLIANCE.get(task) or not can_hold(parent, obj):
                continue
            # the object must be able to start somewhere that is not a parent nor the task's appliance
            if any(can_hold(r, obj) for r in rclasses if r not in (parent, APPLIANCE.get(task))):
                choices.append(TaskChoice(obj, parent, ""))
    return choices


def _object_id(cls: str, recep: Receptacle, taken: set[str], rng: random.Random) -> str:
    x, y, z = (float(v) for v in recep.id.split("|")[1:4])
    while True:
        oid = f"{cls}|{_fmt(x + rng.uniform(-0.4, 0.4))}|{_fmt(y + rng.uniform(0.0, 0.3))}|{_fmt(z + rng.uniform(-0.4, 0.4))}"
        if oid not in taken:
            taken.add(oid)
            return oid


def sample_scene(
    task: str, n_receptacles: int, n_distractors: int, seed: int, floorplans: list[int], rng: random.Random | None = None
) -> Scene:
    """One scene and task; raises ValueError when no floor plan supports the task.

    `seed` names the game; `rng` (default ``random.Random(seed)``) draws it, so a
    caller can redraw a seed whose scene turned out unsolvable."""
    rng = rng or random.Random(seed)
    task_type = rng.choice(TASK_TYPES) if task == "any" else task
    options = [(n, c) for n in floorplans for c in task_choices(load_floorplan(n), task_type)]
    if not options:
        raise ValueError(f"no floor plan among {len(floorplans)} supports {task_type}")
    # Uniform over floor plans first, then over that room's tasks (rooms differ a lot in size).
    num = rng.choice(sorted({n for n, _ in options}))
    fp = load_floorplan(num)
    choice = rng.choice([c for n, c in options if n == num])
    obj_cls, parent_cls, lamp = choice.object_target, choice.parent_target, choice.toggle_target

    # Receptacles: the required ones first, the rest at random up to n_receptacles.
    pool = list(fp.receptacles)
    rng.shuffle(pool)
    keep: list[Receptacle] = []

    def take(pred) -> Receptacle:
        r = next(r for r in pool if pred(r))
        pool.remove(r)
        keep.append(r)
        return r

    n_targets = 2 + (rng.random() < 0.3) if task_type == "pick_two_obj_and_place" else 1 + (rng.random() < 0.3)
    if parent_cls:
        take(lambda r: r.cls == parent_cls)
    if task_type in APPLIANCE:
        take(lambda r: r.cls == APPLIANCE[task_type])
    if lamp:
        lamp_home = take(lambda r: can_hold(r.cls, lamp))
    # the targets must not start in a receptacle of the parent class (the goal would hold already),
    # nor in the task's appliance (as ALFRED: what starts in the fridge is cold, so a cool task
    # would need no cooling; about a fifth of them did)
    unfit = (parent_cls, APPLIANCE.get(task_type))
    target_homes = [r for r in pool + keep if r.cls not in unfit and can_hold(r.cls, obj_cls)]
    home = rng.choice(sorted(target_homes, key=lambda r: r.id))
    if home not in keep:
        pool.remove(home)
        keep.append(home)
    while len(keep) < n_receptacles and pool:
        keep.append(pool.pop())

    taken: set[str] = set()
    objects: list[Obj] = []

    def place(cls: str, recep: Receptacle) -> None:
        objects.append(Obj(_object_id(cls, recep, taken, rng), cls, recep.id))

    kept = sorted(keep, key=lambda r: r.id)
    homes = [r for r in kept if r.cls not in unfit and can_hold(r.cls, obj_cls)]
    place(obj_cls, home)
    for _ in range(n_targets - 1):
        place(obj_cls, rng.choice(homes))
    if lamp:
        place(lamp, lamp_home)
    others = [c for c in fp.objects if c not in (obj_cls, lamp) and c not in LAMPS and any(can_hold(r.cls, c) for r in kept)]
    for _ in range(n_distractors if others else 0):
        cls = rng.choice(others)
        place(cls, rng.choice([r for r in kept if can_hold(r.cls, cls)]))

    C = _constants()
    opened = tuple(sorted(r.id for r in kept if r.cls in C.OPENABLE_CLASS_SET and rng.random() < P_OPEN))
    used = {r.loc[:2] for r in fp.receptacles}
    free = [p for p in fp.floor if p not in used] or list(fp.floor)
    ax, az = rng.choice(free)
    agent_loc = (ax, az, rng.randrange(4), 30)
    return Scene(
        floorplan=num,
        task_type=task_type,
        object_target=obj_cls,
        parent_target=parent_cls,
        toggle_target=lamp,
        receptacles=tuple(kept),
        objects=tuple(sorted(objects, key=lambda o: o.id)),
        opened=opened,
        agent_loc=agent_loc,
        seed=seed,
    )
