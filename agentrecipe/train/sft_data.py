"""Demonstrations: expert replays turned into tokenised multi-turn transcripts.

Each expert action is one assistant turn. A row holds `input_ids`, an
`action_mask` that is 1 exactly on assistant action tokens (eos included), the
`turn_ids` of those tokens, and the raw text for inspection.
"""

from __future__ import annotations

from agentrecipe.agent.prompt import PromptEncoder, fits_context, training_sequences
from agentrecipe.config import AgentConfig
from agentrecipe.envs.base import GameSpec, Observation


def pick_demo_games(train_games: list[GameSpec], levels: list[str], n: int) -> list[GameSpec]:
    """First n train games, round-robin over levels in seed order (deterministic)."""
    by_level = {lvl: sorted((g for g in train_games if g.level == lvl), key=lambda g: g.seed) for lvl in levels}
    available = sum(len(v) for v in by_level.values())
    if n > available:
        raise ValueError(
            f"budget asks for {n} demonstrations but only {available} train games exist: "
            "raise env.n_train or lower budget.sft_fraction"
        )
    picked: list[GameSpec] = []
    i = 0
    while len(picked) < n:
        for lvl in levels:
            if i < len(by_level[lvl]) and len(picked) < n:
                picked.append(by_level[lvl][i])
        i += 1
    return picked


def turns_in_context(encoder: PromptEncoder, observations: list[Observation], action_ids: list[list[int]],
                     agent: AgentConfig) -> int:
    """How many of a demonstration's turns the policy gets to play: the rollout ends an episode at
    the first turn whose prompt and reply room outgrow agent.max_context (`fits_context`)."""
    cache: dict = {}  # the encoder's own cache, as the rollout keeps: each turn tokenises its new part only
    for t in range(len(action_ids)):
        ids, _, _ = encoder.prompt(observations[: t + 1], action_ids[:t], cache)
        longest = None
        if agent.decoding == "admissible":
            longest = max(len(encoder.encode_action(c)) for c in observations[t].admissible_commands or ("look",))
        if not fits_context(len(ids), agent.max_action_tokens, longest, agent.max_context):
            return t
    return len(action_ids)


def replies_in_reach(action_ids: list[list[int]], agent: AgentConfig) -> int:
    """How many of a demonstration's first turns have a reply the policy can write whole: with free
    decoding a reply (eos included) longer than agent.max_action_tokens is cut off at rollout and
    never finishes (an invalid turn); constrained decoding makes room for the longest admissible command."""
    if agent.decoding != "free":
        return len(action_ids)
    return next((t for t, ids in enumerate(action_ids) if len(ids) > agent.max_action_tokens), len(action_ids))


def kept_turns(encoder: PromptEncoder, observations: list[Observation], action_ids: list[list[int]],
               agent: AgentConfig) -> tuple[int, str]:
    """How many of a demonstration's first turns SFT trains on, and which limit cut the rest ("context":
    agent.max_context, see `turns_in_context`; "reply": agent.max_action_tokens, see `replies_in_reach`;
    "" when none did)."""
    in_context = turns_in_context(encoder, observations, action_ids, agent)
    in_reach = replies_in_reach(action_ids, agent)
    kept = min(in_context, in_reach)
    return kept, "" if kept == len(action_ids) else "reply" if in_reach < in_context else "context"


def transcript_rows(encoder: PromptEncoder, game: GameSpec, observations: list[Observation], actions: list[str],
                    agent: AgentConfig | None = None) -> list[dict]:
    """Dataset rows of one demonstration (one row, or one per turn with a history window).

    With `agent`, only the turns the policy would play within agent.max_context are kept, up to the
    first reply it could not write within agent.max_action_tokens (free decoding): SFT on a prompt the
    rollout never sends (or past the context RL and evaluation use), or on a reply the rollout cuts
    off, trains on what the policy never sees or does (`kept_turns`). `rows[i]["turns_cut"]` counts
    the turns left out."""
    action_ids = [encoder.encode_action(a) for a in actions]
    kept = len(action_ids) if agent is None else kept_turns(encoder, observations, action_ids, agent)[0]
    rows = []
    for ids, mask, turns in training_sequences(encoder, observations, action_ids[:kept]):
        rows.append(
            {
                "game": game.path,
                "level": game.level,
                "seed": game.seed,
                "input_ids": ids,
                "action_mask": mask,
                "turn_ids": turns,
                "text": encoder.tokenizer.decode(ids),
                "actions": list(actions),
                "turns_cut": len(action_ids) - kept,
            }
        )
    return rows
