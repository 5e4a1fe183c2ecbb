"""Generation backends: batched next-action generation for live episodes.

A backend takes B prompts (token ids) and returns, for each, the token ids it
sampled and their log-probs, exactly as generated. Optional per-prompt
constraints (a TokenTrie) restrict sampling to admissible commands. Optional
per-prompt `keys` (e.g. episode indices) say which prompts continue which
earlier ones, so a backend may keep each key's KV cache between calls (the HF
backend does; vLLM's prefix cache finds shared prefixes by itself and ignores
keys); `release(keys)` drops what was kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from agentrecipe.agent.decoding import TokenTrie


@dataclass
class Generation:
    ids: list[int]
    logprobs: list[float]
    allowed: list[list[int]] | None = None
    """Per generated token, the ids it was allowed to be (constrained decoding), else None."""
    finished: bool = True
    """False when max_new_tokens ran out before eos."""


@dataclass
class SamplingParams:
    temperature: float | list[float] = 1.0
    """One for every prompt, or one per prompt; 0 = greedy."""
    top_p: float = 1.0
    max_new_tokens: int = 24
    seed: int | None = None
    extra: dict = field(default_factory=dict)


def row_temperatures(params: SamplingParams, n: int) -> list[float]:
    """The temperature of each of `n` prompts."""
    if isinstance(params.temperature, (int, float)):
        return [float(params.temperature)] * n
    if len(params.temperature) != n:
        raise ValueError(f"SamplingParams.temperature: {len(params.temperature)} values for {n} prompts")
    return [float(t) for t in params.temperature]


class GenerationBackend(Protocol):
    exact_logprobs: bool
    """True when the returned log-probs are the trained policy's own (same weights and precision):
    RL then uses them as pi_old instead of recomputing them (HF at fp32; not vLLM)."""

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, tries: list[TokenTrie | None] | None = None,
        keys: list | None = None,
    ) -> list[Generation]: ...

    def release(self, keys=None) -> None:
        """Forget what was kept for `keys` (every key when None)."""

    def update_weights(self, model) -> None: ...
