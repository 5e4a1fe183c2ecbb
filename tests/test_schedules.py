"""Turn-limit (ScalingInter-RL) and curriculum schedules."""

import pytest

from agentrecipe.schedules import curriculum_levels, phase_steps, turn_limit, unreached_phases


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


def test_phase_steps_split_the_run_when_every_is_zero():
    assert phase_steps(0, 3, 25) == 8  # steps 0-7, 8-15, 16-24
    assert [turn_limit(s, [6, 10, 14], phase_steps(0, 3, 25), 99) for s in (0, 7, 8, 15, 16, 24)] == [6, 6, 10, 10, 14, 14]
    assert phase_steps(0, 3, 2) == 1 and phase_steps(5, 3, 25) == 5 and phase_steps(0, 0, 25) == 25
    with pytest.raises(ValueError):
        phase_steps(-1, 3, 25)


@pytest.mark.parametrize("n_steps", range(3, 40))
@pytest.mark.parametrize("n_phases", [2, 3, 4, 5])
def test_every_zero_reaches_the_last_phase_whenever_there_is_a_step_per_phase(n_phases, n_steps):
    every = phase_steps(0, n_phases, n_steps)
    phases = [turn_limit(s, list(range(n_phases)), every, 99) for s in range(n_steps)]
    assert set(phases) == set(range(n_phases)) if n_steps >= n_phases else True
    assert unreached_phases("k", n_phases, 0, n_steps) is None or n_steps < n_phases


def test_a_schedule_the_run_never_finishes_names_the_key_and_the_most_that_fits():
    # the old default: [6, 10, 14] moving every 20 steps in a 25-step run never reaches 14
    error = unreached_phases("rl.turn_schedule_every", 3, 20, 25)
    assert error.startswith("rl.turn_schedule_every=20: the last of the 3 phases starts at step 40")
    assert "at most 12" in error  # (3 - 1) * 12 = 24 < 25
    assert unreached_phases("rl.turn_schedule_every", 3, 12, 25) is None
    assert unreached_phases("rl.turn_schedule_every", 3, 0, 25) is None  # split: reached
    assert "only 2 RL steps" in unreached_phases("rl.turn_schedule_every", 3, 0, 2)  # fewer steps than phases
    assert unreached_phases("rl.curriculum_every", 1, 20, 5) is None  # one phase: nothing to reach
