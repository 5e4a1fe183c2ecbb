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
        # the HF backend ran past the tiny model's positions silently; vLLM refused the first long prompt mid-run
        (["agent.max_context=4096"], "agent.max_context", "exceeds the tiny model's model.max_position 2048"),
        # accepted before, each a silently wrong or a late-failing run (a review's list)
        (["budget.sft_fraction=0.01"], "budget.sft_fraction", "buys no demonstration"),  # a '1% SFT' point ran pure RL
        (["experiment=micro", "budget.total_units=43", "budget.sft_fraction=0.95"], "budget.sft_fraction",
         "less than one step"),  # 4 demonstrations, 3 RL episodes: no RL step at all
        (["env.n_test=0"], "env.n_test", "must be >= 1"),  # build, SFT and RL ran; evaluate crashed
        (["env.n_valid=0", "rl.keep_best=true"], "env.n_valid", "rl.keep_best"),  # no validation, last model exported
        (["eval.episodes=50"], "eval.episodes", "env.n_test builds 20"),  # 20 games played, not 50
        (["eval.temperature=-1"], "eval.temperature", "must be >= 0"),  # pass@k silently equal to greedy success
        (["rl.curriculum=[[]]"], "rl.curriculum", "at least one level"),  # an empty phase sampled every level
        (["experiment=micro", "rl.turn_schedule=[4,6,8]", "rl.turn_schedule_every=10"], "rl.turn_schedule_every",
         "last of the 3 phases starts at step 20"),  # caught only once the RL stage started
        (["model.name=foo"], "model.name", "must be one of"),  # a traceback in prepare_model, after the env build
        (["deepspeed.offload_optimizer=true"], "deepspeed.offload_optimizer", "zero_stage >= 1"),  # nothing offloaded
        (["rl.max_grad_norm=-1"], "rl.max_grad_norm", "must be >= 0"),  # clipping silently off
        (["rl.entropy_coef=-0.01"], "rl.entropy_coef", "must be >= 0"),
        (["+env.alfworld.expert=planner"], "env.alfworld", "env.name is textworld"),  # ignored
        (["env=alfworld", "env.alfworld.expert=plannr"], "env.alfworld.expert", "not one of"),  # build traceback
        (["env=alfworld", "env.alfworld.floorplans.train=sen"], "env.alfworld.floorplans.train", "use seen, unseen"),
        (["env=alfworld", "env.alfworld.max_tries=0"], "env.alfworld.max_tries", "positive integer"),
        (["env=swe", "env.swe.timeout=true"], "env.swe.timeout", "seconds > 0"),  # a bool passed as 1 s
    ],
)
def test_late_errors_are_config_errors(overrides, key, words):
    raw = compose(ROOT / "params", overrides)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
        parse_config(raw, None, " ".join(overrides))
    assert words in str(e.value)


def test_pure_sft_needs_no_valid_games():
    parse_config(compose(ROOT / "params", ["budget.sft_fraction=1", "env.n_valid=0"]), None)  # no RL step validates
    parse_config(compose(ROOT / "params", ["rl.eval_every=0", "env.n_valid=0"]), None)


def test_a_pretrained_model_is_not_held_to_the_tiny_models_positions():
    parse_config(compose(ROOT / "params", ["model=smollm2-135m", "agent.max_context=4096"]), None)


def test_greedy_rollouts_are_fine_when_no_rl_step_runs():
    # Pure SFT (every unit on demonstrations): RL never samples, so temperature 0 is no error.
    raw = compose(ROOT / "params", ["experiment=micro", "budget.sft_fraction=1", "rollout.temperature=0"])
    parse_config(raw, None)


def test_a_partial_params_file_is_checked_on_its_own():
    parse_config({"env": {"levels": ["w1-o2-q1"], "n_train": 1}}, None)  # default budget needs 10 demos: not asked


def test_vllm_refuses_a_context_beyond_the_models_positions_before_its_engine_starts():
    """A pretrained model's positions are known only once it is loaded: the vLLM backend checks
    agent.max_context against them before starting its engine (vllm itself is not needed to refuse)."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrecipe.rollout import make_backend

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=512))
    tokenizer = SimpleNamespace(eos_token_id=1, pad_token_id=0)
    with pytest.raises(ValueError, match="agent.max_context 1024 exceeds the model's max_position_embeddings 512"):
        make_backend("vllm", model, tokenizer, max_context=1024)


def test_the_rl_stage_refuses_a_turn_limit_below_every_expert_plan(tmp_path, monkeypatch, capsys):
    """Before any step (and before the model loads). Before, rollout.max_turns=2 on games whose plans
    take 3-4 steps ran every RL step without one optimizer step (nothing was ever won) and exited 0."""
    import sys

    import yaml

    from agentrecipe.envs.base import GameSpec
    from agentrecipe.envs.manifest import write_manifest
    from stages import rl

    envs = tmp_path / "envs"
    envs.mkdir()
    write_manifest([GameSpec(str(envs / f"g{i}.z8"), "w1-o2-q1", split="train", seed=i, expert_plan=("a",) * (3 + i % 2))
                    for i in range(4)], envs / "manifest.jsonl")
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(compose(ROOT / "params", ["experiment=micro", "rollout.max_turns=2", "reward=dense"])))
    monkeypatch.setattr(sys, "argv", ["rl", "--params", str(params), "--envs", str(envs), "--model", str(tmp_path / "sft"),
                                      "--out", str(tmp_path / "rl"), "--checkpoints", str(tmp_path / "ckpt"),
                                      "--metrics", str(tmp_path / "metrics")])
    with pytest.raises(SystemExit, match=r"rollout.max_turns=2 is below the expert's plan length on every game of "
                                         r"w1-o2-q1 \(plans 3-4 steps\).*at least 3"):
        rl.main()
    # and dense reward where it equals sparse is said (the custom games score only at the win)
    assert "dense reward equals sparse" in capsys.readouterr().out
