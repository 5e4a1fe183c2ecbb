"""ScienceWorld family: task names without Java, the package's variation splits, the gold
plan wins within the admissible list, score-change rewards, Java missing is a clear error."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("scienceworld")

from agentrecipe.config import ConfigError, EnvConfig  # noqa: E402
from agentrecipe.envs import sciworld as S  # noqa: E402
from agentrecipe.envs.build import check_plan  # noqa: E402

needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="ScienceWorld needs Java")
TASK = "find-non-living-thing"


def test_task_names_and_bad_levels():
    names = S.task_names()
    assert len(names) == 30 and names[0] == "boil" and TASK in names
    S.check_level("boil")
    with pytest.raises(ValueError, match="unknown ScienceWorld task 'boiling'; known: boil, melt, "):
        S.check_level("boiling")
    EnvConfig(name="sciworld", levels=["boil"], ood_levels=["melt"])
    with pytest.raises(ConfigError, match="env.levels: unknown ScienceWorld task 'cook'"):
        EnvConfig(name="sciworld", levels=["cook"], ood_levels=[])


def test_java_missing_names_the_debian_package(monkeypatch, tmp_path):
    monkeypatch.setattr(S.shutil, "which", lambda name: None)
    for start in (lambda: S.make_env({}), lambda: S.build_games(TASK, "train", [1], tmp_path, {})):
        with pytest.raises(RuntimeError, match="apt-get install -y openjdk-17-jre-headless"):
            start()
    assert not any(tmp_path.iterdir())  # nothing was built


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return S.build_games(TASK, "train", [1, 2], tmp_path_factory.mktemp("sciworld"), {})


@pytest.fixture(scope="module")
def env():
    e = S.make_env({})
    yield e
    e.close()


@needs_java
def test_splits_are_the_packages_and_disjoint(env, built):
    engine = env._engine
    splits = {s: S.variations(engine, TASK, s) for s in ("train", "valid", "test")}
    assert sorted(splits["train"]) == list(range(150)) and sorted(splits["valid"]) == list(range(150, 225))
    assert sorted(splits["test"]) == list(range(225, 300))
    assert S.variations(engine, TASK, "train") == splits["train"]  # a fixed order
    for game in built:  # seed s takes variation s % N of its split
        assert json.loads(open(game.path).read())["variation"] == splits["train"][game.seed % 150]


@needs_java
def test_gold_plan_admissible_wins_and_rewards_sum_to_100(env, built):
    for game in built:
        check_plan(env, game)
        obs = env.reset(game)
        assert obs.max_score == 100.0 and obs.score == 0.0 and obs.objective.startswith("Your task is to find")
        assert {"look around", "inventory"} <= set(obs.admissible_commands)
        assert len(obs.admissible_commands) <= len(set(game.expert_plan)) + len(S.BASIC) + S.N_SAMPLED
        rewards = []
        for action in game.expert_plan:
            assert action in obs.admissible_commands and obs.expert_action == action
            obs, reward, done, info = env.step(action)
            rewards.append(reward)
            assert not info["invalid"]
        assert obs.won and done and sum(rewards) == 100.0 == obs.score and obs.expert_action is None
        assert any(0 < r < 100 for r in rewards)  # the score moves along the way: dense differs from sparse


@needs_java
def test_points_scored_at_the_start_are_no_actions(env, tmp_path):
    """Variation 0 scores 8 for the start's own look around: the reset says so, and the first action
    earns only what it does (before, the reset said 0 and any first command, `inventory`, got 8)."""
    (game,) = S.build_games(TASK, "train", [0], tmp_path, {})
    obs = env.reset(game)
    assert obs.score == S.current_score(env._engine) == 8.0
    assert env.step("inventory")[1] == 0.0
    obs = env.reset(game)
    rewards = [env.step(action)[1] for action in game.expert_plan]
    assert env.step("look around")[2] and sum(rewards) == 100.0 - 8.0


@needs_java
def test_reset_is_deterministic_and_bad_actions_do_not_crash(env, built):
    game = built[0]
    first = env.reset(game)
    obs, reward, done, info = env.step("xyzzy \\ plugh")
    assert info["invalid"] and reward == 0 and not done and obs.expert_action is None
    assert obs.text == "No known action matches that input."
    assert env.reset(game) == first


@needs_java
def test_listings_of_same_named_things_do_not_change_between_resets(env, tmp_path):
    """The simulator lists same-named things (here three wood cups) in an order that changes from
    reset to reset: the same game started with other text. Now each listing is sorted."""
    game = S.build_games("find-animal", "train", [0], tmp_path, {})[0]
    starts = set()
    for _ in range(4):
        obs = env.reset(game)
        assert obs.text.count("wood cup") == 3
        starts.add(obs.text)
        obs, reward, done, info = env.step("pick up wood cup")  # ambiguous: one of the three moves
        assert obs.text == "You move the wood cup to the inventory." and reward == 0 and not done
    assert len(starts) == 1
    obs, _, _, info = env.step("go to kitchen")  # a listed kind of command the game does not understand here
    assert info["invalid"] == obs.text.startswith(S.NOT_UNDERSTOOD)


@needs_java
def test_gold_plans_that_name_interchangeable_things_still_win(tmp_path):
    """Gold plans move "apple seed in seed jar" while the jar holds five alike: ambiguous, and
    resolved the same way at every reset (a build replays the gold plan to find its winning prefix)."""
    games = S.build_games("grow-fruit", "train", [0], tmp_path, {})
    assert games and games[0].expert_plan
    # play() answers the question itself: the gold plan's answer "0" (before, kept in the plan, where
    # the game did not understand it) is left out
    assert not any(a.isdigit() for a in games[0].expert_plan)
