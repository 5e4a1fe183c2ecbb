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
    ],
)
def test_late_errors_are_config_errors(overrides, key, words):
    raw = compose(ROOT / "params", overrides)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
        parse_config(raw, None, " ".join(overrides))
    assert words in str(e.value)


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
