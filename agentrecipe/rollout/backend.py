"""Generation backends: batched next-action generation for live episodes.

A backend takes B prompts (token ids) and returns, for each, the token ids it
sampled and their log-probs, exactly as generated. Optional per-prompt
constraints (a TokenTrie) restrict sampling to admissible commands.
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
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 24
    seed: int | None = None
    extra: dict = field(default_factory=dict)


class GenerationBackend(Protocol):
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, tries: list[TokenTrie | None] | None = None
    ) -> list[Generation]: ...

    def update_weights(self, model) -> None: ...
