"""TextWorld: level names, in-process game generation (what `tw-make` does), and the Env.

Levels (see params/env/textworld.yaml):

- ``wW-oO-qQ[-pP]``: W rooms, O objects, a quest of Q actions, as ``tw-make custom --world-size W
  --nb-objects O --quest-length Q`` except that quests are linear (breadth 1; tw-make's
  default breadth 1-5 gives another game for 8 of 20 seeds of w2-o3-q4). With ``-pP`` (P >= 2)
  the game has P such quests (TextWorld's parallel quests), each worth 1 point, one after the
  other in the objective: the score moves as each is done and the game is won when all are
  (max score P, a walkthrough of up to P x Q actions: the planner drops a move a later quest
  does not need, 3 actions in 14 of 40 w2-o3-q2-p2 games), so dense reward differs from sparse;
  each later quest's win event carries the earlier quests' actions, so a long P x Q does not
  compile (w1-o0-q40-p2: "Too much text in quotation marks"; w2-o3-q30-p2 and q10-p4 do);
  without it the max score is 1 and the score only moves at the win;
- ``simple[-R][-G]``: ``tw-make tw-simple --rewards R --goal G`` (R dense|balanced|sparse,
  default dense; G detailed|brief|none, default detailed), test games with ``--test``;
- ``cooking-rR-tT-gG``: ``tw-make tw-cooking --recipe R --take T --go G --split S`` (G in 1, 6,
  9, 12; S the game's split).

tw-simple has a few dozen distinct quests: without ``--test`` 19 of 20 test games replayed a
train game's walkthrough (tw-cooking without ``--split``: 17 of 20), so a test split measured
recall of training games. Its valid games stay in the train distribution (from the test one,
validation would select the model on test games). Level names that differ only in spelling
(``simple`` and ``simple-dense-detailed``, ``w02-o3-q4`` and ``w2-o3-q4``) name the same games:
`level_key` gives one name for both.

Games are generated and compiled in the calling process (one interpreter start for many
games). The same level and seed give the same game files, byte for byte: the only
date-dependent bytes of a compiled game, the Z-machine serial number, are fixed.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

from agentrecipe.envs.base import GameSpec, Observation

CUSTOM_LEVEL = re.compile(r"^w(\d+)-o(\d+)-q(\d+)(-p(\d+))?$")
COOKING_LEVEL = re.compile(r"^cooking-r(\d+)-t(\d+)-g(\d+)$")
SIMPLE_LEVEL = re.compile(r"^simple(-(dense|balanced|sparse))?(-(detailed|brief|none))?$")
COOKING_ROOMS = (1, 6, 9, 12)
MAX_ACTION_CHARS = 200
UNKNOWN_VERB = "That's not a verb I recognise."
# Interpreter meta-commands: they write files (save, script), wait for a yes/no
# answer (quit, restart) or change how the game talks. Never sent to the engine.
META_VERBS = frozenset(
    "quit q restart save restore script unscript transcript noscript undo version "
    "notify verbose brief superbrief normal short long".split()
)


# ------------------------------------------------------------------------ levels
def parse_level(name: str, split: str = "train") -> tuple[str, dict[str, Any]]:
    """(kind, settings) of a level name for games of `split` (tw-simple draws test games from its test
    distribution, tw-cooking each split from its own foods); ValueError naming it when it is not a
    TextWorld level."""
    if m := CUSTOM_LEVEL.match(name):
        w, o, q = map(int, m.group(1, 2, 3))
        quests = int(m.group(5) or 1)
        if w < 1 or q < 1:
            raise ValueError(f"TextWorld level {name!r}: needs at least 1 room (w) and a quest length q >= 1")
        if m.group(4) and quests < 2:
            raise ValueError(f"TextWorld level {name!r}: -pP asks for P >= 2 quests (one quest: leave -pP out)")
        return "custom", {"world_size": w, "nb_objects": o, "quest_length": q, "quests": quests}
    if m := SIMPLE_LEVEL.match(name):
        return "tw-simple", {"rewards": m.group(2) or "dense", "goal": m.group(4) or "detailed", "test": split == "test"}
    if m := COOKING_LEVEL.match(name):
        r, t, g = map(int, m.groups())
        if g not in COOKING_ROOMS:
            raise ValueError(f"TextWorld level {name!r}: cooking games have g in {COOKING_ROOMS} rooms, got {g}")
        if r < 1 or t > r:
            raise ValueError(f"TextWorld level {name!r}: cooking needs recipe r >= 1 and take t <= r")
        # The defaults of every other `tw-make tw-cooking` flag.
        return "tw-cooking", {"recipe": r, "take": t, "go": g, "open": False, "cook": False, "cut": False,
                              "drop": False, "recipe_seed": 0, "split": split}
    raise ValueError(
        f"unknown TextWorld level {name!r}; use wW-oO-qQ[-pP] (e.g. w2-o3-q4, w2-o3-q2-p2), "
        "simple[-dense|-balanced|-sparse][-detailed|-brief|-none] or cooking-rR-tT-gG (G in 1, 6, 9, 12)"
    )


def check_level(name: str) -> None:
    parse_level(name)


def level_key(name: str) -> str:
    """One name per set of games: the full spelling of a level (``simple`` -> ``simple-dense-detailed``,
    ``w02-o3-q4`` -> ``w2-o3-q4``), so a level listed under two names is caught."""
    kind, s = parse_level(name)
    if kind == "custom":
        quests = f"-p{s['quests']}" if s["quests"] > 1 else ""
        return f"w{s['world_size']}-o{s['nb_objects']}-q{s['quest_length']}{quests}"
    if kind == "tw-simple":
        return f"simple-{s['rewards']}-{s['goal']}"
    return f"cooking-r{s['recipe']}-t{s['take']}-g{s['go']}"


LEVEL_KEY = "agentrecipe_level"
"""The level name our builds write into a game's .json metadata (any foreign game lacks it)."""


def level_from_metadata(metadata: dict[str, Any]) -> str | None:
    """The level name of a game from its .json metadata, None when no level name describes it.

    Our own games carry it (`LEVEL_KEY`); `tw-make tw-simple` games say their settings in their
    uuid (``tw-simple-rDense+gDetailed+...``), `tw-make tw-cooking` games in `settings` (only
    those that keep every other flag at its default have a level name). `tw-make custom` games
    record neither size nor quest length."""
    if isinstance(metadata.get(LEVEL_KEY), str):
        return metadata[LEVEL_KEY]
    uuid = str(metadata.get("uuid", ""))
    if m := re.match(r"^tw-simple-r(\w+?)\+g(\w+?)\+", uuid):
        name = f"simple-{m.group(1).lower()}-{m.group(2).lower()}"
        return name if SIMPLE_LEVEL.match(name) else None
    settings = metadata.get("settings")
    if uuid.startswith("tw-cooking") and isinstance(settings, dict):
        name = f"cooking-r{settings.get('recipe')}-t{settings.get('take')}-g{settings.get('go')}"
        try:
            _, defaults = parse_level(name)
        except ValueError:
            return None
        return name if all(settings.get(k, v) == v for k, v in defaults.items() if k not in ("recipe", "take", "go", "split")) else None
    return None


DENSE_HINT = ("Use games whose score moves along the way (-S env=textworld_quests: custom games of two quests; "
              "-S env=textworld_dense: tw-simple / cooking).")
"""What the reward-density warning suggests (`agentrecipe.envs.feasibility`)."""


def intermediate_reward(name: str) -> bool:
    """Whether the score of a level's games can move before the win (else dense reward equals sparse)."""
    kind, settings = parse_level(name)
    if kind == "custom":
        return settings["quests"] > 1
    return kind == "tw-cooking" or (kind == "tw-simple" and settings["rewards"] != "sparse")


# -------------------------------------------------------------------- generation
def make_game(level: str, seed: int, path: str | Path, split: str = "train"):
    """A textworld.Game for `level`, `split` and `seed`, with its GameOptions set to compile to `path`."""
    import textworld
    import textworld.challenges
    from textworld.generator import make_game as tw_make_game

    kind, settings = parse_level(level, split)
    options = textworld.GameOptions()
    options.seeds = seed
    options.path = str(path)
    options.file_ext = ".z8"
    options.force_recompile = True
    if kind == "custom":  # as tw-make custom --quest-length Q, linear quests (module docstring)
        from textworld.generator.data import KnowledgeBase

        # the default knowledge base, parsed once per process at import: a fresh GameOptions parses
        # its logic files again for every game (0.6 of the 1.9 s a w2-o3-q4 game took to build)
        options.kb = KnowledgeBase.default()
        q = settings["quest_length"]
        options.nb_rooms = settings["world_size"]
        options.nb_objects = settings["nb_objects"]
        options.chaining.min_length = options.chaining.max_length = options.chaining.max_depth = q
        options.nb_parallel_quests = settings["quests"]
        return tw_make_game(options), options
    _, make, _ = textworld.challenges.CHALLENGES[kind]
    return make(settings=settings, options=options), options


def _fix_serial(z8: Path) -> None:
    """Inform stamps the compile date as the Z-machine serial (header bytes 0x12-0x17,
    outside the checksum); a fixed serial makes the file a function of the seed alone."""
    with open(z8, "r+b") as f:
        f.seek(0x12)
        f.write(b"000000")


def _finish_json(meta: Path, level: str) -> None:
    """TextWorld writes the absolute path of its grammar folder (inside this venv) into the game's
    .json, and playing never reads it: blanked, so the games' bytes do not depend on where the
    project lives (DVC hashes and RL checkpoint fingerprints stay the same in every clone). The
    level name goes into the metadata, so a loose copy of the game still says what it is."""
    data = json.loads(meta.read_text())
    data["KB"]["text_grammars_path"] = ""
    data.setdefault("metadata", {})[LEVEL_KEY] = level
    meta.write_text(json.dumps(data))


def build_games(level: str, split: str, seeds: list[int], out_dir: str | Path, options: dict) -> list[GameSpec]:
    """Generate and compile one game per seed into out_dir (``<level>-s<seed>.z8`` + ``.json``)."""
    from textworld.generator import compile_game

    if options:
        raise ValueError(f"TextWorld games take no build options, got {sorted(options)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    games = []
    for seed in seeds:
        path = out_dir / f"{level}-s{seed}.z8"
        game, game_options = make_game(level, seed, path, split)
        compile_game(game, game_options)
        _fix_serial(path)
        _finish_json(path.with_suffix(".json"), level)
        path.with_suffix(".ni").unlink(missing_ok=True)  # Inform 7 source, not needed to play
        plan = game.metadata.get("walkthrough") or game.walkthrough
        games.append(GameSpec(path=str(path), level=level, env="textworld", split=split, seed=seed,
                              max_score=float(game.max_score), expert_plan=tuple(plan)))
    return games


# ---------------------------------------------------------------------- cleaning
_BANNER_LINE = re.compile(r"^[\s_|\\/$<>]*$")
_STATUS_LINE = re.compile(r"\n>[^\n]*\Z")
_END_QUESTION = "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?"


def clean_observation(text: str) -> str:
    """Game text without the ASCII banner, the trailing prompt + status line and extra blank lines."""
    text = _STATUS_LINE.sub("", text.replace("\r", ""))
    text = text.replace(_END_QUESTION, "")
    lines = text.split("\n")
    while lines and _BANNER_LINE.match(lines[0]):  # banner art and leading blank lines
        lines.pop(0)
    text = "\n".join(line.strip() for line in lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def sanitize_action(action: str) -> str:
    """What may reach the interpreter: printable, no backslash (it crashes dumb-frotz), one line,
    capped, lower case (the parser ignores case; admissible commands are lower case)."""
    action = "".join(c if c.isprintable() else " " for c in action).replace("\\", " ")
    return " ".join(action.lower().split())[:MAX_ACTION_CHARS].strip()


# --------------------------------------------------------------------------- env
class TextWorldEnv:
    """Plays TextWorld games (.z8) one at a time through `textworld.start`.

    Options: ``expert`` (default true) computes the expert's next actions after every
    step (``policy_commands``, a few ms per step); false skips that, and TextWorld's quest
    tracking with it, for fast rollouts.
    """

    def __init__(self, expert: bool = True) -> None:
        self.expert = expert
        self._env = None
        self._path: str | None = None
        self._state = None
        self._obs: Observation | None = None
        self._done = False

    def _start(self, path: str) -> None:
        import textworld

        self.close()
        # No intermediate_reward: asking for it (or for policy_commands) makes TextWorld track the
        # quests and re-plan after every step; score, won and lost come from the game itself.
        infos = textworld.EnvInfos(admissible_commands=True, policy_commands=self.expert,
                                   won=True, lost=True, max_score=True, objective=True, score=True, moves=True)
        with warnings.catch_warnings():  # jericho: "not fully supported" (textworld keeps the score itself)
            warnings.filterwarnings("ignore", message=".*not fully supported")
            self._env = textworld.start(path, request_infos=infos)  # reset() follows
        self._path = path

    def _observation(self, state, text: str | None = None) -> Observation:
        plan = tuple(state["policy_commands"] or ()) if self.expert else ()
        return Observation(
            text=clean_observation(state.feedback) if text is None else text,
            objective=state["objective"] or "",
            admissible_commands=tuple(sorted(state["admissible_commands"] or ())),
            score=float(state["score"]),
            max_score=float(state["max_score"]),
            won=bool(state["won"]),
            lost=bool(state["lost"]),
            expert_action=plan[0] if plan else None,
            expert_plan=plan,
            extra={"moves": state["moves"]},
        )

    def reset(self, game: GameSpec) -> Observation:
        if self._env is None or self._path != str(game.path):
            self._start(str(game.path))
        self._state = self._env.reset()
        self._obs = self._observation(self._state)
        self._done = False
        return self._obs

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        if self._obs is None:
            raise RuntimeError("step() before reset()")
        command = sanitize_action(action)
        invalid = command not in {c.lower() for c in self._obs.admissible_commands}  # sanitize_action lower-cases
        verb = command.split(" ", 1)[0]
        if self._done or not command or verb in META_VERBS:
            # Nothing reaches the engine: same state, the game's own answer to an unknown verb.
            obs = self._obs if self._done else self._observation(self._state, text=UNKNOWN_VERB)
            return obs, 0.0, self._done, {"invalid": True, "action": command}
        state, _, _ = self._env.step(command)
        obs = self._observation(state)
        reward = obs.score - self._obs.score
        self._state, self._obs = state, obs
        self._done = obs.won or obs.lost
        info = {"invalid": invalid, "action": command}
        return obs, reward, self._done, info

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
        self._env, self._path = None, None


POLICY_OPTIONS = {"expert": False}
"""Options for pools that only play policies (the rl and evaluate stages): TextWorld's per-step
expert plan (policy_commands) took 3.7 of 5.9 ms a step (w2-o3-q4, random admissible actions),
and without it TextWorld tracks no quests (the default evaluation: 117.4 -> 106.9 s, the same
episodes)."""


def make_env(options: dict) -> TextWorldEnv:
    unknown = set(options) - {"expert"}
    if unknown:
        raise ValueError(f"unknown TextWorld env options {sorted(unknown)} (known: expert)")
    return TextWorldEnv(expert=bool(options.get("expert", True)))
