"""params/ composition, params.yaml drift, and the typed loader's errors."""

from pathlib import Path

import pytest
import yaml

from agentrecipe.config import BudgetConfig, ConfigError, load_config, parse_config
from agentrecipe.params import compose, compose_yaml

ROOT = Path(__file__).resolve().parents[1]


def test_params_yaml_is_the_composed_default():
    committed = (ROOT / "params.yaml").read_text()
    assert committed == compose_yaml(ROOT / "params"), (
        "params.yaml differs from params/ composed: run `make params` (python -m agentrecipe.cli compose-params)"
    )


@pytest.mark.parametrize(
    "overrides",
    [[], ["rl=ppo", "reward=dense"], ["rl=rloo"], ["rl=reinforce_pp"], ["experiment=micro"],
     ["experiment=turn_schedule"], ["env=textworld_dense"], ["env=textworld_quests"], ["env=textworld_complex"], ["model=smollm2-135m"],
     ["deepspeed=zero3"], ["rollout=vllm"], ["budget.sft_fraction=0"], ["experiment=alfworld_micro"], ["env=textworld_dense", "experiment=micro"],
     ["experiment=gpu_qwen1.5b"], ["experiment=gpu_qwen7b"]],
)
def test_every_preset_composes_and_validates(overrides):
    parse_config(compose(ROOT / "params", overrides), None, " ".join(overrides))


def _write(tmp_path, raw):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_unknown_key_names_key_and_file(tmp_path):
    raw = compose(ROOT / "params")
    raw["rl"]["learning_rate"] = 0.1
    path = _write(tmp_path, raw)
    with pytest.raises(ConfigError, match=r"params.yaml: rl.learning_rate: unknown key"):
        load_config(path, ["env"])  # a typo anywhere fails, whatever section the stage asked for


def test_mistyped_key_is_refused(tmp_path):
    raw = compose(ROOT / "params")
    raw["env"]["n_train"] = "forty"
    with pytest.raises(ConfigError, match=r"env.n_train: expected an integer"):
        load_config(_write(tmp_path, raw))


def test_unknown_section_is_refused(tmp_path):
    raw = compose(ROOT / "params")
    raw["trainer"] = {}
    with pytest.raises(ConfigError, match=r"trainer: unknown section"):
        load_config(_write(tmp_path, raw))


def test_one_seed_key_sets_every_seed_of_a_run():
    cfg = parse_config(compose(ROOT / "params", ["seed=3"]))
    assert [cfg[s].seed for s in ("model", "sft", "rl", "eval")] == [3, 3, 3, 3]
    assert cfg["env"].seed_train == parse_config(compose(ROOT / "params"))["env"].seed_train  # same games
    one = parse_config(compose(ROOT / "params", ["seed=3", "rl.seed=5"]))  # one can still be decoupled
    assert (one["rl"].seed, one["sft"].seed) == (5, 3)


def test_each_seed_draws_its_own_test_games_and_keeps_the_train_games():
    default, other = (parse_config(compose(ROOT / "params", o))["env"] for o in ([], ["seed=2"]))
    assert (default.test_draw, other.test_draw) == (0, 2)
    assert default.split_seeds()["test"] == range(1, 21) and other.split_seeds()["test"] == range(41, 61)
    assert other.split_seeds()["train"] == default.split_seeds()["train"] == range(50001, 50051)
    with pytest.raises(ConfigError, match=r"env.seed_test: seed range of valid \[40001, 40011\) overlaps test starting at 40001"):
        parse_config(compose(ROOT / "params", ["env.test_draw=2000"]))


def test_mistyped_root_seed_is_refused(tmp_path):
    raw = compose(ROOT / "params")
    raw["seed"] = "one"
    with pytest.raises(ConfigError, match=r"seed: expected an integer"):
        load_config(_write(tmp_path, raw))


def test_bad_level_and_negative_count_fail_naming_the_key():
    raw = compose(ROOT / "params")
    raw["env"]["levels"] = ["w2-o3"]
    with pytest.raises(ConfigError, match=r"env.levels: unknown TextWorld level 'w2-o3'"):
        parse_config(raw)
    raw = compose(ROOT / "params")
    raw["env"]["n_test"] = -1
    with pytest.raises(ConfigError, match=r"env.n_test: must be >= 0"):
        parse_config(raw)


def test_a_level_trained_on_and_out_of_domain_is_refused():
    # evaluation plays env.levels + env.ood_levels: such a level's test games were played twice,
    # n doubled, and they counted in both the in-domain and the out-of-domain cells
    raw = compose(ROOT / "params", ["env.ood_levels=[w4-o6-q8,w2-o3-q4]"])
    with pytest.raises(ConfigError, match=r"env.ood_levels: w2-o3-q4 also in env.levels"):
        parse_config(raw)


def test_overlapping_seed_ranges_are_refused():
    raw = compose(ROOT / "params", ["env.seed_valid=50010"])
    with pytest.raises(ConfigError, match="overlaps"):
        parse_config(raw)


def test_group_methods_need_a_group():
    with pytest.raises(ConfigError, match="rl.group_size"):
        parse_config(compose(ROOT / "params", ["rl=grpo", "rl.group_size=1"]))


@pytest.mark.parametrize("fraction,demos,episodes", [(0.0, 0, 500), (0.5, 25, 250), (1.0, 50, 0)])
def test_budget_split(fraction, demos, episodes):
    b = BudgetConfig(total_units=500, demo_cost=10, sft_fraction=fraction)
    assert (b.n_demos, b.rl_episodes) == (demos, episodes)
    assert b.n_demos * b.demo_cost + b.rl_episodes == b.total_units


def test_pure_sft_plays_no_rl_episode():
    # 505 units buy 50 demonstrations; the 5 left over are not a 1-step RL run on a "pure SFT" point
    b = BudgetConfig(total_units=505, demo_cost=10, sft_fraction=1.0)
    assert (b.n_demos, b.rl_episodes, b.rl_steps(4)) == (50, 0, 0)
    assert BudgetConfig(total_units=505, demo_cost=10, sft_fraction=0.99).rl_episodes == 15


def test_a_split_with_rl_that_buys_no_step_on_its_ranks_is_an_error():
    # validation counts one rank; the rl stage asks again with its ranks (16 x 16 episodes > 200 left)
    b = BudgetConfig(total_units=500, demo_cost=10, sft_fraction=0.6)
    assert b.no_rl_step(16) is None and b.rl_steps(16) == 12
    assert "200 RL episodes, less than one step of 16 (rl.games_per_step x rl.group_size) x 16 rank(s)" in b.no_rl_step(16, 16)
    assert BudgetConfig(total_units=500, demo_cost=10, sft_fraction=1.0).no_rl_step(16, 16) is None
    assert "leaves 3 RL episodes" in BudgetConfig(total_units=3, demo_cost=10, sft_fraction=0.0).no_rl_step(4)  # pure RL


def test_budget_split_rounds_demos_down():
    b = BudgetConfig(total_units=105, demo_cost=10, sft_fraction=0.5)  # 52.5 units -> 5 demos, 55 episodes
    assert (b.n_demos, b.rl_episodes) == (5, 55)
    # exact arithmetic: in floats 100 * 0.29 = 28.999... gave 28 demonstrations
    assert [BudgetConfig(total_units=t, demo_cost=c, sft_fraction=f).n_demos
            for t, c, f in [(100, 1, 0.29), (100, 1, 0.57), (200, 2, 0.58), (400, 1, 0.58)]] == [29, 57, 58, 232]


def test_keep_best_needs_validation():
    with pytest.raises(ConfigError, match="rl.keep_best: keeps the best validated model"):
        parse_config({"rl": {"keep_best": True, "eval_every": 0}}, ["rl"])
