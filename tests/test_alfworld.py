"""ALFWorld family: generated games are solvable, deterministic, split-disjoint,
playable by ALFWorld's own loader and experts; official data is imported."""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import yaml

pytest.importorskip("alfworld")
pytest.importorskip("fast_downward")

from agentrecipe.envs import alfworld as family  # noqa: E402
from agentrecipe.envs.alfworld import scene as S  # noqa: E402
from agentrecipe.envs.base import Env, GameSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SEEDS = {"train": [11, 12], "valid": [21], "test": [31]}


def level_of(task: str) -> str:
    return f"{task}-r5-d2"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, list[GameSpec]]:
    """Games of every task type and split (24 games, about 20 s), laid out as the curriculum build does."""
    out = tmp_path_factory.mktemp("alfworld_games")
    games: dict[str, list[GameSpec]] = {}
    for task in S.TASK_TYPES:
        level = level_of(task)
        games[task] = [g for split, seeds in SEEDS.items() for g in family.build_games(level, split, seeds, out / level / split, {})]
    return games


@pytest.fixture(scope="module")
def env():
    e = family.make_env({"expert": "none"})
    yield e
    e.close()


def play(env, game: GameSpec, actions) -> tuple[list[float], object]:
    obs = env.reset(game)
    rewards = []
    for a in actions:
        assert not obs.won, f"{game.path}: won before the plan ended"
        obs, r, done, info = env.step(a)
        assert info["admissible"], f"{game.path}: {a!r} not admissible"
        rewards.append(r)
    return rewards, obs


# ------------------------------------------------------------------ levels, params
def test_check_level():
    for name in ("pick_and_place_simple-r6-d2", "any-r8-d4", "look_at_obj_in_light-r3-d0", "pick_two_obj_and_place-r12-d10"):
        family.check_level(name)
    for bad in ("w2-o3-q4", "pick_and_place-r6-d2", "any-r2-d1", "any-r6", "ANY-r6-d2"):
        with pytest.raises(ValueError, match="ALFWorld level"):
            family.check_level(bad)


def test_options_refuse_unknown_keys():
    with pytest.raises(ValueError, match="unknown option"):
        family.options_of({"floorplan": "seen"})
    assert family.options_of({"floorplans": {"test": "all"}})["floorplans"] == {"train": "seen", "valid": "seen", "test": "all"}


def test_params_yaml_documents_every_option():
    params = yaml.safe_load((ROOT / "params/env/alfworld.yaml").read_text())
    assert params["name"] == "alfworld"
    assert params["alfworld"] == family.DEFAULTS
    for lvl in params["levels"] + params["ood_levels"]:
        family.check_level(lvl)


def test_compose_params_env_alfworld(tmp_path):
    from agentrecipe.cli import main

    assert main(["compose-params", "env=alfworld", "--output", str(tmp_path / "p.yaml")]) == 0
    env = yaml.safe_load((tmp_path / "p.yaml").read_text())["env"]
    assert env["name"] == "alfworld" and env["alfworld"]["expert"] == "handcoded"


def test_floorplan_selection():
    assert S.select_floorplans("1-3,201") == [1, 2, 3, 201]
    assert not set(S.select_floorplans("seen")) & set(S.select_floorplans("unseen"))
    with pytest.raises(ValueError):
        S.select_floorplans("kitchens")


# ------------------------------------------------------------------ generated games
@pytest.mark.parametrize("task", S.TASK_TYPES)
def test_games_solvable_and_walkthrough_wins(built, env, task):
    games = built[task]
    assert len(games) == sum(map(len, SEEDS.values()))
    for game in games:
        data = json.loads(Path(game.path).read_text())
        assert set(data) == {"pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough"}
        assert data["solvable"] is True and data["walkthrough"] == list(game.expert_plan)
        traj = json.loads((Path(game.path).parent / "traj_data.json").read_text())
        assert traj["task_type"] == task
        assert set(traj["pddl_params"]) == {"object_target", "parent_target", "toggle_target", "mrecep_target", "object_sliced"}
        rewards, obs = play(env, game, game.expert_plan)
        assert obs.won and obs.score == obs.max_score == 1.0
        assert sum(rewards) == pytest.approx(1.0)  # progress changes telescope to the win
        assert min(rewards) >= 0  # the planner never undoes a subgoal
    assert len({json.loads((Path(g.path).parent / "traj_data.json").read_text())["scene"]["scene_num"] for g in games}) > 1


@pytest.mark.slow
@pytest.mark.parametrize("task", S.TASK_TYPES)
def test_experts_win_every_game(built, task):
    """Following its own next action, the handcoded expert wins every game, the planner too."""
    for game in built[task]:
        assert family.expert_steps(game, "handcoded", family.DEFAULTS["max_expert_steps"]) is not None, game.path
    assert family.expert_steps(built[task][0], "planner", 60) is not None


def test_observations_read_like_the_benchmark(built, env):
    game = built["pick_heat_then_place_in_recep"][0]
    obs = env.reset(game)
    assert isinstance(env, Env)
    assert obs.text.startswith("You are in the middle of a room. Looking quickly around you, you see a ")
    assert "Welcome" not in obs.text and "_bar_" not in obs.text
    assert obs.text.endswith("Your task is to: " + obs.objective)
    assert obs.objective.startswith(("put a hot", "heat some"))
    assert "look" in obs.admissible_commands and "inventory" in obs.admissible_commands
    assert any(c.startswith("go to ") for c in obs.admissible_commands)
    obs, r, done, info = env.step("fly to the moon")
    assert obs.text == "Nothing happens." and r == 0 and not done and not info["admissible"] and info["invalid"]
    # the game plays commands lower-cased: a capitalised admissible one is valid (before, the episode
    # compared the raw reply with the list and counted it invalid, with the invalid-action penalty)
    go = next(c for c in env.reset(game).admissible_commands if c.startswith("go to "))
    obs, _, _, info = env.step(go.capitalize())
    assert info["admissible"] and not info["invalid"] and obs.text.startswith("You arrive at")


def test_progress_rewards_and_regress(built, env):
    game = built["pick_and_place_simple"][0]
    plan = list(game.expert_plan)
    take = next(i for i, a in enumerate(plan) if a.startswith("take "))
    rewards, obs = play(env, game, plan[: take + 1])
    assert rewards[-1] == pytest.approx(0.5) and obs.score == pytest.approx(0.5) and sum(rewards[:-1]) == 0
    # putting the object back where it was undoes the subgoal: negative reward
    obj, recep = plan[take][len("take "):].split(" from ")
    obs, r, done, info = env.step(f"move {obj} to {recep}")
    assert r == pytest.approx(-0.5) and obs.score == 0 and info["raw_reward"] == 0


def test_handcoded_expert_in_observation(built):
    e = family.make_env({"expert": "handcoded"})
    obs = e.reset(built["pick_and_place_simple"][0])
    assert obs.expert_action == "look"  # ALFWorld's handcoded expert always starts by looking
    obs, *_ = e.step(obs.expert_action)
    assert obs.expert_action in obs.admissible_commands
    e.close()


def test_same_seed_same_files(tmp_path):
    argv = list(sys.argv)
    for out in ("a", "b"):
        family.build_games("any-r4-d1", "train", [7, 8], tmp_path / out, {})
    assert sys.argv == argv  # fast-downward rewrites sys.argv; the family puts it back
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert files_a == files_b and len(files_a) == 4
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def _signature(game: GameSpec) -> str:
    """The scene without names that carry the seed."""
    problem = json.loads(Path(game.path).read_text())["pddl_problem"]
    return problem.split("(:domain", 1)[1]


def test_splits_disjoint(built):
    by_split: dict[str, set] = {"train": set(), "valid": set(), "test": set()}
    plans: dict[str, set] = {"train": set(), "test": set()}
    for games in built.values():
        for g in games:
            by_split[g.split].add(_signature(g))
            traj = json.loads((Path(g.path).parent / "traj_data.json").read_text())
            plans.setdefault(g.split, set()).add(traj["scene"]["scene_num"])
    assert not by_split["train"] & by_split["valid"]
    assert not by_split["train"] & by_split["test"] and not by_split["valid"] & by_split["test"]
    assert not plans["test"] & set(S.select_floorplans("seen"))  # test games are in unseen rooms
    assert plans["train"] <= set(S.select_floorplans("seen"))


def test_alfworld_own_loader_accepts_games(built, tmp_path):
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    for games in built.values():
        for g in games:
            if g.split == "train":
                trial = Path(g.path).parent
                shutil.copytree(trial, tmp_path / trial.parent.name / trial.name)
    config = {
        "env": {"goal_desc_human_anns_prob": 0, "task_types": [1, 2, 3, 4, 5, 6]},
        "dataset": {"data_path": str(tmp_path), "num_train_games": -1},
    }
    tw_env = AlfredTWEnv(config, train_eval="train")
    assert tw_env.num_games == 2 * len(S.TASK_TYPES)


# ------------------------------------------------------------------ official data
def _official_fixture(built, root: Path) -> Path:
    """A folder laid out like the official download, from generated games (plus ones to skip)."""
    data = root / "json_2.1.1"
    official = {"train": "train", "valid": "valid_seen", "test": "valid_unseen"}
    for task, games in built.items():
        for g in games:
            src = Path(g.path).parent
            dest = data / official[g.split] / src.parent.name / src.name.replace("trial_gen_", "trial_T2019_")
            shutil.copytree(src, dest)
    # AlfredTWEnv skips these (sorted first); so must we
    skip = data / "train" / "pick_and_place_with_movable_recep-Apple-Bowl-Fridge-1" / "trial_T1"
    shutil.copytree(Path(built["pick_and_place_simple"][0].path).parent, skip)
    unsolvable = data / "train" / "pick_and_place_simple-AAA-None-Fridge-1" / "trial_T1"
    shutil.copytree(Path(built["pick_and_place_simple"][0].path).parent, unsolvable)
    game = json.loads((unsolvable / "game.tw-pddl").read_text())
    (unsolvable / "game.tw-pddl").write_text(json.dumps({**game, "solvable": False}))
    return root


def test_import_official_data(built, env, tmp_path, monkeypatch):
    root = _official_fixture(built, tmp_path / "alfworld_data")
    level = "pick_and_place_simple-r6-d2"
    out = tmp_path / "games" / level / "train"
    games = family.build_games(level, "train", [100, 101], out, {"data_dir": str(root)})
    official = [g for g in built["pick_and_place_simple"] if g.split == "train"]
    assert sorted(Path(g.path).parent.name for g in games) == sorted(
        Path(g.path).parent.name.replace("trial_gen_", "trial_T2019_") for g in official
    )  # the unsolvable and movable-receptacle folders were skipped
    for g in games:
        assert Path(g.path).is_relative_to(out / "train") and not Path(g.path).is_symlink()
        assert g.expert_plan and g.env == "alfworld" and g.split == "train"
        _, obs = play(env, g, g.expert_plan)
        assert obs.won
    # seed -> game does not depend on how the seeds are batched
    one_by_one = [family.build_games(level, "train", [s], out, {"data_dir": str(root)})[0] for s in (100, 101)]
    assert [g.path for g in one_by_one] == [g.path for g in games]
    with pytest.raises(ValueError, match="holds 2 pick_and_place_simple games; 3 were asked"):
        family.build_games(level, "train", [100, 101, 102], out, {"data_dir": str(root)})
    # the pool the build stage checks a whole split against (its batches each see a part)
    assert sorted(p.name for p in family.game_pool(level, "train", {"data_dir": str(root)})) == sorted(
        Path(g.path).parent.name for g in games)
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    assert family.game_pool(level, "train", {}) is None  # generated games: every seed its own

    # any task, valid -> valid_seen, through $ALFWORLD_DATA, symlinked
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    valid = family.build_games("any-r6-d2", "valid", range(6), tmp_path / "valid", {"link": True})
    assert len({g.path for g in valid}) == len(S.TASK_TYPES) and all("valid_seen" in g.path for g in valid)
    assert all(Path(g.path).is_symlink() for g in valid)
    # the manifest lists them where they were put (before, resolving the link failed the build)
    from agentrecipe.envs.manifest import read_manifest, write_manifest

    write_manifest(valid, tmp_path / "manifest.jsonl")
    assert sorted(g.path for g in read_manifest(tmp_path / "manifest.jsonl")) == sorted(g.path for g in valid)
    tasks = {json.loads((Path(g.path).parent / "traj_data.json").read_text())["task_type"] for g in valid}
    assert tasks == set(S.TASK_TYPES)

    with pytest.raises(FileNotFoundError, match="no official ALFWorld data"):
        family.build_games(level, "train", [1], out, {"data_dir": str(tmp_path / "missing")})


def test_official_games_two_levels_or_splits_share_are_refused(built, tmp_path):
    """Official games ignore R and D, so two levels of one task type draw the same test games,
    and `any`'s pool holds every task type's games."""
    from agentrecipe.config import EnvConfig
    from agentrecipe.envs.build import check_pools

    root = _official_fixture(built, tmp_path / "alfworld_data")

    def check(levels, ood_levels, seed_test=60, **options):
        cfg = EnvConfig(name="alfworld", levels=levels, ood_levels=ood_levels, n_train=2, n_valid=1, n_test=1,
                        seed_train=0, seed_valid=10, seed_test=seed_test, alfworld={"data_dir": str(root), **options})
        check_pools(cfg, family, cfg.family_options)

    with pytest.raises(ValueError, match="1 of the pick_and_place_simple-r6-d2 test games are also "
                                         "pick_and_place_simple-r12-d8 test games; a valid or test game"):
        check(["pick_and_place_simple-r6-d2"], ["pick_and_place_simple-r12-d8"])
    with pytest.raises(ValueError, match="1 of the pick_and_place_simple-r6-d2 valid games are also "
                                         "pick_and_place_simple-r6-d2 test games"):
        check(["pick_and_place_simple-r6-d2"], [], splits={"test": "valid_seen"})
    # `any`'s test pool holds one game of each task type: the seed that draws the pick_and_place one
    any_pool = family.game_pool("any-r6-d2", "test", {"data_dir": str(root)})
    k = [p.parent.name.split("-")[0] for p in any_pool].index("pick_and_place_simple")
    with pytest.raises(ValueError, match="1 of the pick_and_place_simple-r6-d2 test games are also any-r6-d2 test"):
        check(["pick_and_place_simple-r6-d2"], ["any-r6-d2"], seed_test=60 + k)
    check(["pick_and_place_simple-r6-d2"], ["any-r6-d2"], seed_test=60 + (k + 1) % 6)  # another task's game
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check(["pick_and_place_simple-r6-d2"], ["look_at_obj_in_light-r12-d8"])  # distinct task types


def test_evaluate_reads_a_folder_of_alfworld_game_folders(built, tmp_path):
    """`agentrecipe evaluate --games` on the official layout: every solvable game, its task type as its level."""
    from agentrecipe.cli import main
    from agentrecipe.eval.evaluate import games_from_folder

    root = _official_fixture(built, tmp_path / "alfworld_data")
    games = games_from_folder(root)
    n_built = sum(len(g) for g in built.values())
    assert len(games) == n_built + 1  # the unsolvable one is left out
    assert {g.level for g in games} == set(S.TASK_TYPES) and all(g.env == "alfworld" and g.expert_plan for g in games)
    out = tmp_path / "eval"
    argv = ["evaluate", "--model", "expert", "--games", str(root), "--episodes", "1", "--workers", "1",
            "--max-turns", "60", "--params", str(tmp_path / "absent.yaml"), "--out", str(out)]
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())["expert"]
    assert {lvl: metrics[lvl]["success"] for lvl in S.TASK_TYPES} == dict.fromkeys(S.TASK_TYPES, 1.0)


def test_no_target_starts_in_its_tasks_appliance():
    """As ALFRED: what starts in the fridge is cold, so a cool task whose object started there
    needed no cooling (44 of 200 generated scenes); the same holds for the microwave and the sink."""
    import random

    for split in ("seen", "unseen"):
        plans = S.select_floorplans(split)
        for task, appliance in S.APPLIANCE.items():
            for seed in range(60):
                scene = S.sample_scene(task, 4, 1, seed, plans, rng=random.Random(f"{task}/{seed}"))
                where = {r.id: r.cls for r in scene.receptacles}
                assert not any(o.cls == scene.object_target and where[o.parent] == appliance for o in scene.objects), \
                    (task, split, seed)
