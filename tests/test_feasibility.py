"""Runs that cannot answer their question are flagged before training (issue 14 items 2-3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrecipe.envs import alfworld, textworld_env
from agentrecipe.envs.base import GameSpec
from agentrecipe.envs.feasibility import InfeasibleRun, check_feasible, reward_density_warning, turn_limit_warnings
from agentrecipe.params import compose

PARAMS = Path(__file__).resolve().parents[1] / "params"


def games(level: str, plan_lens: list[int]) -> list[GameSpec]:
    return [GameSpec(path=f"g{i}", level=level, seed=i, expert_plan=("go",) * n) for i, n in enumerate(plan_lens)]


def test_turn_limit_below_every_plan_of_a_level_is_refused_with_the_key_to_raise():
    with pytest.raises(InfeasibleRun, match=r"rollout.max_turns=6 .*simple \(plans 8-12 steps\).*at least 8"):
        turn_limit_warnings(games("simple", [8, 12, 10]) + games("w1", [2, 3]), 6, "rollout.max_turns")


def test_turn_limit_below_some_plans_warns_with_counts():
    notes = turn_limit_warnings(games("w2", [3, 9, 4, 10]), 8, "eval.max_turns")
    assert len(notes) == 1 and "2 of 4 w2 games" in notes[0] and "up to 10 steps" in notes[0]
    assert turn_limit_warnings(games("w2", [3, 8]), 8, "eval.max_turns") == []
    assert turn_limit_warnings(games("unknown", [0, 0]), 1, "k") == []  # no known plan: nothing to judge


def test_check_feasible_exits_on_the_largest_limit_and_only_warns_for_early_schedule_phases(capsys):
    check_feasible(games("simple", [8, 10]), [6, 10], "rl.turn_schedule")
    assert "only in the phases with this limit" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="error: rl.turn_schedule=7"):
        check_feasible(games("simple", [8, 10]), [6, 7], "rl.turn_schedule")


def test_dense_reward_on_games_that_score_only_at_the_win_warns():
    assert "dense reward equals sparse" in reward_density_warning(["w2-o3-q4"], textworld_env, "dense")
    assert reward_density_warning(["w2-o3-q4"], textworld_env, "sparse") is None
    assert reward_density_warning(["simple-dense-detailed", "cooking-r1-t1-g1", "w2-o3-q2-p2"], textworld_env, "dense") is None
    assert "simple-sparse" in reward_density_warning(["simple-sparse"], textworld_env, "dense")
    assert reward_density_warning(["pick_and_place_simple-r4-d1"], alfworld, "dense") is None
    from agentrecipe.envs import babyai  # scores at the win only: warned about (it was not)

    warning = reward_density_warning(["GoToRedBall"], babyai, "dense")
    assert "GoToRedBall" in warning and "textworld" not in warning  # each family's own hint, if any
    assert "env=textworld_quests" in reward_density_warning(["w2-o3-q4"], textworld_env, "dense")


def test_micro_shrinks_sizes_but_leaves_the_env_group_to_the_command_line():
    micro = compose(PARAMS, ["experiment=micro"])
    dense = compose(PARAMS, ["env=textworld_dense", "experiment=micro"])
    assert micro["env"]["levels"] == ["w1-o2-q1"]
    assert dense["env"]["levels"] == compose(PARAMS, ["env=textworld_dense"])["env"]["levels"]
    assert dense["env"]["n_train"] == micro["env"]["n_train"] == 4
    assert compose(PARAMS, ["experiment=alfworld_micro"])["env"]["name"] == "alfworld"


def test_a_manifest_row_with_a_null_plan_reads_as_no_plan(tmp_path):
    from agentrecipe.envs.manifest import read_manifest

    (tmp_path / "manifest.jsonl").write_text('{"path": "g.z8", "level": "w1", "env": "textworld", "split": "test", '
                                             '"seed": 0, "max_score": 1, "expert_plan": null}\n')
    (game,) = read_manifest(tmp_path / "manifest.jsonl")
    assert game.expert_plan == () and turn_limit_warnings([game], 1, "k") == []


def test_a_manifest_row_without_a_field_is_refused_not_defaulted(tmp_path):
    """Before, a row without max_score read as 1.0 (a ScienceWorld game's dense reward 100 times too
    large), and a row with a misspelt field raised a bare TypeError without the row."""
    from agentrecipe.envs.manifest import read_manifest

    (tmp_path / "manifest.jsonl").write_text('{"path": "g.z8", "level": "w1", "env": "sciworld", "split": "test", "seed": 0}\n')
    with pytest.raises(ValueError, match=r"manifest.jsonl:1: manifest row lacks max_score"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.jsonl").write_text('{"path": "g.z8", "level": "w1", "env": "textworld", "split": "test", '
                                             '"seed": 0, "max_score": 1, "levle": "w2"}\n')
    with pytest.raises(ValueError, match="has unknown levle"):
        read_manifest(tmp_path)
