"""Turn-limit (ScalingInter-RL) and curriculum schedules."""

import pytest

from agentrecipe.schedules import curriculum_levels, turn_limit


def test_turn_limit_moves_up_every_n_steps_then_stays():
    schedule = [10, 20, 30]
    # every 5: steps 0-4 -> 10, 5-9 -> 20, 10+ -> 30 (last phase lasts)
    got = [turn_limit(s, schedule, every=5, default=99) for s in (0, 4, 5, 9, 10, 14, 1000)]
    assert got == [10, 10, 20, 20, 30, 30, 30]
    assert turn_limit(7, [], every=5, default=12) == 12
    with pytest.raises(ValueError):
        turn_limit(0, schedule, every=0, default=99)
    with pytest.raises(ValueError):
        turn_limit(-1, schedule, every=5, default=99)


def test_curriculum_levels():
    phases = [["w1-o1-q1"], ["w1-o1-q1", "w2-o3-q4"]]
    assert curriculum_levels(0, phases, every=3, default=["x"]) == ["w1-o1-q1"]
    assert curriculum_levels(2, phases, every=3, default=["x"]) == ["w1-o1-q1"]
    assert curriculum_levels(3, phases, every=3, default=["x"]) == ["w1-o1-q1", "w2-o3-q4"]
    assert curriculum_levels(300, phases, every=3, default=["x"]) == ["w1-o1-q1", "w2-o3-q4"]
    default = ["w2-o3-q4"]
    got = curriculum_levels(5, [], every=3, default=default)
    assert got == default and got is not default
    curriculum_levels(0, phases, every=3, default=["x"]).append("mutated")
    assert phases[0] == ["w1-o1-q1"]
