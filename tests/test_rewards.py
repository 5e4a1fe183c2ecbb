"""Reward modes and penalties of one episode, by hand."""

import pytest

from agentrecipe.config import RewardConfig
from agentrecipe.rewards import turn_rewards

DELTAS = [0.0, 1.0, 0.0, 3.0]  # score changes of 4 turns; max score 4
VALID = [False] * 4


def test_sparse():
    cfg = RewardConfig(mode="sparse")
    assert turn_rewards(DELTAS, True, VALID, 4.0, cfg) == [0.0, 0.0, 0.0, 1.0]
    assert turn_rewards(DELTAS, False, VALID, 4.0, cfg) == [0.0, 0.0, 0.0, 0.0]
    assert turn_rewards([], False, [], 4.0, cfg) == []


def test_dense_normalised_and_raw():
    # normalised: 1/4 = 0.25, 3/4 = 0.75 (a win sums to 1, like sparse)
    assert turn_rewards(DELTAS, True, VALID, 4.0, RewardConfig(mode="dense")) == [0.0, 0.25, 0.0, 0.75]
    assert turn_rewards(DELTAS, True, VALID, 4.0, RewardConfig(mode="dense", normalize=False)) == DELTAS
    with pytest.raises(ValueError, match="max_score"):
        turn_rewards(DELTAS, True, VALID, 0.0, RewardConfig(mode="dense"))


def test_penalties():
    invalid = [False, True, False, False]
    # dense: r - 0.01 each turn, - 0.1 more on turn 1:
    #   (0 - 0.01, 0.25 - 0.01 - 0.1, 0 - 0.01, 0.75 - 0.01) = (-0.01, 0.14, -0.01, 0.74)
    cfg = RewardConfig(mode="dense", step_penalty=0.01, invalid_penalty=0.1)
    assert turn_rewards(DELTAS, True, invalid, 4.0, cfg) == pytest.approx([-0.01, 0.14, -0.01, 0.74])
    # sparse won: (-0.01, -0.11, -0.01, 1 - 0.01 = 0.99)
    cfg = RewardConfig(mode="sparse", step_penalty=0.01, invalid_penalty=0.1)
    assert turn_rewards(DELTAS, True, invalid, 4.0, cfg) == pytest.approx([-0.01, -0.11, -0.01, 0.99])
    with pytest.raises(ValueError, match="invalid has 3 entries"):
        turn_rewards(DELTAS, True, invalid[:3], 4.0, cfg)
