"""Errors that used to surface only after stages ran are refused by the config loader (issue 13, defect 6)."""

from pathlib import Path

import pytest

from agentrecipe.config import ConfigError, parse_config
from agentrecipe.params import compose

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        # micro: 4 train games; 100 units x 1 / 10 per demo = 10 demonstrations
        (["experiment=micro", "budget.sft_fraction=1", "budget.total_units=100"], "budget.sft_fraction",
         "buys 10 demonstrations"),
        (["experiment=micro", "rollout.temperature=0"], "rollout.temperature", "must be > 0 for RL"),
        (["experiment=micro", "rl.curriculum=[[w1-o2-q1],[w2-o3-q2]]"], "rl.curriculum", "w2-o3-q2 have no train games"),
    ],
)
def test_late_errors_are_config_errors(overrides, key, words):
    raw = compose(ROOT / "params", overrides)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
        parse_config(raw, None, " ".join(overrides))
    assert words in str(e.value)


def test_greedy_rollouts_are_fine_when_no_rl_step_runs():
    # Pure SFT (every unit on demonstrations): RL never samples, so temperature 0 is no error.
    raw = compose(ROOT / "params", ["experiment=micro", "budget.sft_fraction=1", "rollout.temperature=0"])
    parse_config(raw, None)


def test_a_partial_params_file_is_checked_on_its_own():
    parse_config({"env": {"levels": ["w1-o2-q1"], "n_train": 1}}, None)  # default budget needs 10 demos: not asked
