"""The multi-turn rollout loop: B episodes in lock-step.

Each turn: build every live episode's prompt from cached token pieces, generate
all next actions in one batched backend call, step all environments through
the pool, record observations. Episodes end when the game ends, at the turn
limit, or when the prompt would outgrow the context. A crashed or hung
environment fails its episode only (recorded, counted, never raised).
"""

from __future__ import annotations

from dataclasses import dataclass

from tqdm import tqdm

from agentrecipe.agent.decoding import TokenTrie
from agentrecipe.agent.prompt import INVALID_REPLY, PromptEncoder, parse_reply
from agentrecipe.envs.base import GameSpec
from agentrecipe.rollout.backend import GenerationBackend, SamplingParams
from agentrecipe.rollout.episode import Episode, end_episodes, start_episodes


@dataclass
class RolloutSettings:
    max_turns: int = 20
    decoding: str = "admissible"
    """`free` or `admissible` (constrained to the admissible commands)."""
    max_context: int = 1024
    max_action_tokens: int = 24
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None

    @classmethod
    def from_agent(cls, agent, max_turns: int, temperature: float, top_p: float = 1.0,
                   seed: int | None = None) -> "RolloutSettings":
        """Settings for a policy configured by an AgentConfig (decoding, context and reply limits)."""
        return cls(max_turns, agent.decoding, agent.max_context, agent.max_action_tokens, temperature, top_p, seed)


def run_episodes(
    games: list[GameSpec],
    backend: GenerationBackend,
    encoder: PromptEncoder,
    pool,
    settings: RolloutSettings,
    progress: bool = False,
) -> list[Episode]:
    """Play one episode per game (a game may repeat, e.g. a GRPO group) and return them in order."""
    episodes = start_episodes(games, pool)
    caches: list[dict] = [{} for _ in games]
    bar = tqdm(total=settings.max_turns, desc="turns", leave=False, disable=not progress)
    for turn in range(settings.max_turns):
        live = [i for i, ep in enumerate(episodes) if not ep.done]
        if not live:
            break
        prompts, tries, batch = [], [], []
        for i in live:
            ep = episodes[i]
            ids, _, _ = encoder.prompt(ep.observations, ep.actions, caches[i])
            trie = _admissible_trie(encoder, ep, caches[i]) if settings.decoding == "admissible" else None
            reply_room = max(settings.max_action_tokens, caches[i]["longest"]) if trie else settings.max_action_tokens
            if len(ids) + reply_room > settings.max_context:
                ep.done, ep.truncated = True, True
                continue
            prompts.append(ids)
            tries.append(trie)
            batch.append(i)
        if not batch:
            break
        max_new = settings.max_action_tokens
        if settings.decoding == "admissible":  # a command must fit whole
            max_new = max([max_new] + [caches[i]["longest"] for i in batch])
        seed = None if settings.seed is None else settings.seed * 100_003 + turn
        params = SamplingParams(settings.temperature, settings.top_p, max_new, seed)
        gens = backend.generate(prompts, params, tries if settings.decoding == "admissible" else None)

        actions: list[str | None] = [None] * len(games)
        for i, gen in zip(batch, gens):
            ep = episodes[i]
            ep.actions.append(gen.ids)
            ep.logprobs.append(gen.logprobs)
            ep.allowed.append(gen.allowed)
            text = encoder.tokenizer.decode([t for t in gen.ids if t != encoder.eos_id], skip_special_tokens=True)
            action = parse_reply(text) if gen.finished else None
            ep.action_texts.append(action)
            actions[i] = action
        results = pool.step(actions)
        for i in batch:
            ep, res = episodes[i], results[i]
            if actions[i] is None:
                ep.record_invalid_reply(INVALID_REPLY)
            else:
                ep.record(actions[i], res)
        bar.update(1)
    bar.close()
    return end_episodes(episodes)


def _admissible_trie(encoder: PromptEncoder, ep: Episode, cache: dict) -> TokenTrie:
    """Trie over the current observation's admissible commands (eos-terminated token ids)."""
    obs = ep.observations[-1]
    commands = obs.admissible_commands or ("look",)
    seqs = [encoder.encode_action(c) for c in commands]
    cache["longest"] = max(len(s) for s in seqs)
    return TokenTrie(seqs)
