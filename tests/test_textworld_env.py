"""TextWorld family: level names, observation cleaning, action sanitising, rewards along expert plans."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from agentrecipe.envs.textworld_env import (
    POLICY_OPTIONS,
    UNKNOWN_VERB,
    build_games,
    check_level,
    clean_observation,
    make_env,
    sanitize_action,
)


@pytest.mark.parametrize("name", ["w2-o3-q4", "w2-o3-q2-p3", "simple", "simple-sparse", "simple-balanced-none", "cooking-r3-t2-g9"])
def test_check_level_accepts(name):
    check_level(name)


@pytest.mark.parametrize("name", ["w2-o3", "w2-o3-q2-p1", "w2-o3-q2-p", "simple-foo", "cooking-r1-t1-g2", "cooking-r1-t2-g1", "w0-o3-q1", "alf"])
def test_check_level_names_the_bad_level(name):
    with pytest.raises(ValueError, match=name):
        check_level(name)


def test_clean_observation_on_real_text(tw_games):
    import textworld

    env = textworld.start(tw_games["simple"].path, request_infos=textworld.EnvInfos(objective=True))
    state = env.reset()
    raw_reset, objective = state.feedback, state["objective"]
    raw_step = env.step("look")[0].feedback
    env.close()
    assert "$$$$" in raw_reset and "\n>" in raw_step  # the artefacts are there ...
    reset, step = clean_observation(raw_reset), clean_observation(raw_step)
    assert "$$" not in reset and "____" not in reset  # ... and gone: no banner,
    assert reset.startswith(objective)
    for text in (reset, step):
        assert ">" not in text and "0/" not in text  # no prompt or status line (room, score/moves)
        assert "\n\n\n" not in text and text == text.strip()
    assert step.startswith("-= ")  # the room description follows `look`


def test_clean_observation_end_of_game():
    raw = ("\nYou eat the meal.\n\n\n*** The End ***\n\nYou scored 3 out of a possible 3, in 6 turns.\n\n\n"
           "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?\n>     -= Kitchen =-2/5")
    clean = "You eat the meal.\n\n*** The End ***\n\nYou scored 3 out of a possible 3, in 6 turns."
    assert clean_observation(raw) == clean


def test_sanitize_action():
    assert sanitize_action("  Take\\ the\x00 key\n from   BOX\t") == "take the key from box"
    assert sanitize_action("x" * 1000) == "x" * 200
    assert sanitize_action("\\\n\x07") == ""


@pytest.mark.parametrize("kind", ["custom", "quests", "simple", "cooking"])
def test_expert_plan_wins_and_scores_sum_to_max(tw_games, kind):
    game = tw_games[kind]
    env = make_env({})
    obs = env.reset(game)
    assert obs.score == 0 and not obs.won and obs.max_score == game.max_score
    assert obs.admissible_commands == tuple(sorted(obs.admissible_commands))
    total, rewards = 0.0, []
    for i, action in enumerate(game.expert_plan):
        obs, reward, done, info = env.step(action)
        rewards.append(reward)
        total += reward
        last = i == len(game.expert_plan) - 1
        assert obs.won == last and done == last, f"won/done at step {i} of {len(game.expert_plan)}"
        assert not info["invalid"], action
    env.close()
    assert total == game.max_score == obs.score
    if kind == "simple":  # dense: the score moves along the way, not only at the end
        assert game.max_score > 1 and sum(r > 0 for r in rewards) >= 3
    if kind == "quests":  # two quests of one action each: a point for each, the first before the win
        assert game.max_score == 2 and len(game.expert_plan) == 2 and rewards == [1.0, 1.0]
    if kind == "custom":  # one quest: the score only moves at the win
        assert game.max_score == 1 and rewards[:-1] == [0.0] * (len(rewards) - 1)


def test_following_expert_action_wins(tw_games):
    env = make_env({})
    obs = env.reset(tw_games["custom"])
    for _ in range(30):
        assert obs.expert_plan and obs.expert_action == obs.expert_plan[0]
        obs, _, done, _ = env.step(obs.expert_action)
        if done:
            break
    assert obs.won and obs.expert_action is None


@pytest.mark.parametrize("kind", ["custom", "simple", "cooking"])
def test_policy_pools_see_the_same_game_without_the_experts_plan(tw_games, kind):
    """What the rl and evaluate stages' pools run (POLICY_OPTIONS): the same observations, scores and
    ends as with the expert on, only no per-step expert plan; the stored plan still wins (the expert
    baseline follows it there)."""
    game = tw_games[kind]
    fast, full = make_env(POLICY_OPTIONS), make_env({})
    a, b = fast.reset(game), full.reset(game)
    for action in ("look", "inventory", *game.expert_plan):
        assert dataclasses.replace(a, expert_action=None, expert_plan=()) == dataclasses.replace(b, expert_action=None,
                                                                                               expert_plan=())
        assert a.expert_action is None and a.expert_plan == () and b.expert_plan
        a, reward_a, done_a, _ = fast.step(action)
        b, reward_b, done_b, _ = full.step(action)
        assert (reward_a, done_a) == (reward_b, done_b)
    assert a.won and b.won
    fast.close()
    full.close()


def test_invalid_and_meta_commands(tw_games, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `save` / `script` would write files here if they reached the engine
    env = make_env({"expert": False})
    start = env.reset(tw_games["custom"])
    for action in ["save", "script", "quit", "restart", "", "  \\ "]:
        obs, reward, done, info = env.step(action)
        assert obs.text == UNKNOWN_VERB and reward == 0 and not done and info["invalid"]
        assert obs.extra["moves"] == start.extra["moves"]
    assert list(tmp_path.iterdir()) == []
    obs, reward, done, info = env.step("xyzzy")
    assert info["invalid"] and reward == 0 and not done and obs.expert_plan == ()
    obs, *_ = env.step(start.admissible_commands[0])  # the game still answers
    assert obs.text and obs.text != UNKNOWN_VERB
    with pytest.raises(ValueError, match="unknown TextWorld env options"):
        make_env({"bogus": 1})


def test_step_after_end_changes_nothing(tw_games):
    game = tw_games["custom"]
    env = make_env({"expert": False})
    env.reset(game)
    for action in game.expert_plan:
        won_obs, *_ = env.step(action)
    obs, reward, done, info = env.step("look")
    assert obs == won_obs and reward == 0 and done and info["invalid"]


def test_same_seed_same_bytes(tw_games, tmp_path):
    game = tw_games["custom"]
    again = build_games(game.level, game.split, [game.seed], tmp_path, {})[0]
    assert again == dataclasses.replace(game, path=again.path)
    for ext in (".z8", ".json"):
        a, b = (open(g.path.replace(".z8", ext), "rb").read() for g in (game, again))
        assert a == b, ext


def test_admissible_commands_with_capitals_are_valid(tmp_path):
    """Entity names keep their case ("American style passkey") while actions are lower-cased."""
    from agentrecipe.envs.textworld_env import build_games, make_env

    [game] = build_games("w2-o3-q4", "train", [50001], tmp_path, {})
    env = make_env({})
    obs = env.reset(game)
    capitals = [c for c in obs.admissible_commands if c != c.lower()]
    assert capitals, "this seed's game has capitalised entity names"
    for action in game.expert_plan:
        obs, _, _, info = env.step(action)
        assert not info["invalid"], action
    env.close()


@pytest.mark.slow
def test_the_build_stage_writes_the_same_bytes_whatever_the_hash_seed(tmp_path):
    """TextWorld writes some sets in hash order: built in processes with other PYTHONHASHSEEDs, the
    same tw-cooking and tw-simple games had other bytes (other DVC hashes, another RL fingerprint)."""
    import subprocess
    import sys

    import yaml

    from agentrecipe.params import compose

    root = Path(__file__).resolve().parents[1]
    params = compose(root / "params", ["env=textworld_dense", "env.levels=[cooking-r1-t1-g1]",
                                       "env.ood_levels=[simple-dense-detailed]", "env.n_train=1", "env.n_valid=1",
                                       "env.n_test=1", "env.workers=1",
                                       "eval.episodes=1", "budget.sft_fraction=0"])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    built = {}
    for hash_seed in ("1", "2"):
        out = tmp_path / f"envs-{hash_seed}"
        subprocess.run([sys.executable, "-m", "stages.build_envs", "--params", str(tmp_path / "params.yaml"),
                        "--out", str(out)], cwd=root, check=True, env={**os.environ, "PYTHONHASHSEED": hash_seed})
        built[hash_seed] = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.suffix in (".z8", ".json")}
    assert len(built["1"]) == (3 + 1) * 2 and built["1"] == built["2"]  # 3 cooking splits, 1 OOD test game


def test_test_games_come_from_each_splits_own_distribution(tmp_path, monkeypatch):
    """tw-simple has a few dozen distinct quests: before, 19 of 20 test games replayed a train game's
    walkthrough (50 train games; TextWorld's --test distribution was never used; with it, 0 of 20),
    and tw-cooking games ignored their split's foods. Building enough games to show it takes
    minutes, so this checks the wiring."""
    from agentrecipe.envs import textworld_env as tw

    assert [tw.parse_level("simple", split)[1]["test"] for split in ("train", "valid", "test")] == [False, False, True]
    assert tw.parse_level("cooking-r1-t1-g1", "valid")[1]["split"] == "valid"
    seen = []

    def make_game(level, seed, path, split="train"):
        seen.append(split)
        raise InterruptedError

    monkeypatch.setattr(tw, "make_game", make_game)
    for split in ("train", "test"):
        with pytest.raises(InterruptedError):
            tw.build_games("simple-dense-detailed", split, [1], tmp_path, {})
    assert seen == ["train", "test"]


def test_parallel_quests_level_names_and_reward_density():
    """-pP: P quests, the score moving at each (dense differs from sparse); one quest is the plain name."""
    from agentrecipe.envs import textworld_env as tw

    assert tw.parse_level("w2-o3-q2-p2")[1] == {"world_size": 2, "nb_objects": 3, "quest_length": 2, "quests": 2}
    assert tw.parse_level("w2-o3-q4")[1]["quests"] == 1
    assert tw.level_key("w02-o3-q2-p02") == "w2-o3-q2-p2" and tw.level_key("w2-o3-q4") == "w2-o3-q4"
    assert tw.intermediate_reward("w2-o3-q2-p2") and not tw.intermediate_reward("w2-o3-q4")


def test_a_level_under_two_names_is_refused():
    from agentrecipe.config import ConfigError, EnvConfig

    with pytest.raises(ConfigError, match="env.ood_levels: simple also in env.levels"):
        EnvConfig(levels=["simple-dense-detailed"], ood_levels=["simple"])
    with pytest.raises(ConfigError, match="env.levels: w02-o3-q4, w2-o3-q4 listed twice"):
        EnvConfig(levels=["w2-o3-q4", "w02-o3-q4"])
    EnvConfig(levels=["simple-dense-detailed"], ood_levels=["simple-sparse"])  # other games: accepted
