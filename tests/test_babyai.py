"""BabyAI family: level names, games from seeds, the bot's plan wins, text rendering of
the agent's view, fixed action vocabulary, rewards."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("minigrid")

from agentrecipe.config import ConfigError, EnvConfig  # noqa: E402
from agentrecipe.envs import babyai as B  # noqa: E402
from agentrecipe.envs.build import check_plan  # noqa: E402


@pytest.fixture(scope="module")
def env():
    e = B.make_env({})
    yield e
    e.close()


def test_levels():
    ids = B.level_ids()
    assert len(ids) >= 90 and ids["GoToRedBall"] == "BabyAI-GoToRedBall-v0"
    assert ids["GoToObjS6"] == "BabyAI-GoToObjS6-v1"
    for name in ("GoToRedBall", "PickupLoc", "BossLevel"):
        B.check_level(name)
    with pytest.raises(ValueError, match="unknown BabyAI level 'GoToBlueMoon'; known: ActionObjDoor, "):
        B.check_level("GoToBlueMoon")
    with pytest.raises(ValueError, match="unknown BabyAI level 'BabyAI-GoToRedBall-v0'"):
        B.check_level("BabyAI-GoToRedBall-v0")  # the level name, not the gymnasium id
    with pytest.raises(ConfigError, match="env.levels: unknown BabyAI level 'Nope'"):
        EnvConfig(name="babyai", levels=["Nope"], ood_levels=[])


@pytest.mark.parametrize("level", ["GoToRedBall", "PickupLoc", "PutNextLocal", "UnlockPickup"])
def test_bot_plan_wins_and_live_bot_follows_it(tmp_path, env, level):
    for game in B.build_games(level, "train", [3, 4], tmp_path, {}):
        assert json.loads(open(game.path).read()) == {"env_id": B.level_ids()[level], "seed": game.seed}
        check_plan(env, game)
        obs = env.reset(game)
        for action in game.expert_plan:  # the live bot suggests the recorded plan
            assert obs.expert_action == action and obs.admissible_commands == B.ACTIONS
            obs, reward, done, info = env.step(action)
            assert not info["invalid"]
        assert obs.won and done and 0 < reward == obs.score <= 1 and not obs.lost


def test_same_seed_same_game_and_observation(tmp_path, env):
    a = B.build_games("GoToLocal", "test", [7], tmp_path / "a", {})[0]
    b = B.build_games("GoToLocal", "test", [7], tmp_path / "b", {})[0]
    assert a.expert_plan == b.expert_plan and open(a.path).read() == open(b.path).read()
    assert env.reset(a) == env.reset(b)
    other = B.build_games("GoToLocal", "test", [8], tmp_path / "c", {})[0]
    assert env.reset(other).text != env.reset(a).text or other.expert_plan != a.expert_plan


def test_rendering_and_bad_actions(tmp_path, env):
    game = B.build_games("GoToRedBall", "test", [1], tmp_path, {})[0]
    obs = env.reset(game)
    assert obs.objective == "go to the red ball"
    assert obs.text.startswith("In front of you in this room, you can see several objects: There is a ")
    assert "You are facing a " in obs.text and obs.text.endswith("You are not carrying anything.")
    obs2, reward, done, info = env.step("fly away")
    assert info["invalid"] and reward == 0 and not done and obs2.text == B.UNKNOWN_ACTION
    assert obs2.expert_action == obs.expert_action  # nothing moved, the bot was not asked again
    obs3, _, _, info = env.step("Turn  LEFT")
    assert not info["invalid"] and obs3.text != obs.text


def test_describe_on_a_hand_made_grid():
    """The agent at (1, 2) facing east in an empty walled 8x8 room: a red ball two cells ahead,
    a blue key one ahead and one to the right (south, +y); nothing else but walls."""
    import gymnasium as gym
    from minigrid.core.grid import Grid
    from minigrid.core.world_object import Ball, Key

    level = gym.make("BabyAI-GoToRedBall-v0").unwrapped
    level.reset(seed=0)
    level.grid = Grid(level.width, level.height)
    level.grid.wall_rect(0, 0, level.width, level.height)
    level.agent_pos, level.agent_dir = (1, 2), 0  # dir 0 = east (+x)
    level.grid.set(3, 2, Ball("red"))
    level.grid.set(2, 3, Key("blue"))
    level.carrying = None
    assert B.describe(level) == (
        "In front of you in this room, you can see several objects: "
        "There is a blue key 1 step in front of you and 1 step to your right. "
        "There is a red ball right in front of you 2 steps away. "
        "You are facing a red ball 2 steps away. You are not carrying anything.")
    level.grid.set(3, 2, None)
    level.grid.set(2, 3, None)
    level.carrying = Key("green")
    assert B.describe(level) == ("You cannot see any objects within sight. You are facing a wall 6 steps away. "
                                 "You are carrying a green key.")


def test_options():
    assert B.make_env({"expert": False}).reset is not None
    with pytest.raises(ValueError, match="known: expert"):
        B.make_env({"colour": "red"})
