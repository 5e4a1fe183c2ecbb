"""Multi-turn rollouts and generation backends."""

from __future__ import annotations


def make_backend(name: str, model, tokenizer, max_context: int | None = None):
    """The generation backend named by `rollout.backend` for this policy model; `max_context`
    (agent.max_context, the longest prompt plus reply a rollout sends) sizes vLLM's max_model_len."""
    if name == "hf":
        from agentrecipe.rollout.hf_backend import HFBackend

        return HFBackend(model, tokenizer.pad_token_id, tokenizer.eos_token_id)
    if name == "vllm":
        from agentrecipe.rollout.vllm_backend import VLLMBackend

        return VLLMBackend.from_model(model, tokenizer, max_context)
    raise ValueError(f"unknown rollout.backend {name!r}; known: hf, vllm")
