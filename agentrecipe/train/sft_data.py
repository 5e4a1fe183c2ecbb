"""Demonstrations: expert replays turned into tokenised multi-turn transcripts.

Each expert action is one assistant turn. A row holds `input_ids`, an
`action_mask` that is 1 exactly on assistant action tokens (eos included), the
`turn_ids` of those tokens, and the raw text for inspection.
"""

from __future__ import annotations

from agentrecipe.agent.prompt import PromptEncoder, training_sequences
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


def transcript_rows(encoder: PromptEncoder, game: GameSpec, observations: list[Observation], actions: list[str]) -> list[dict]:
    """Dataset rows of one demonstration (one row, or one per turn with a history window)."""
    action_ids = [encoder.encode_action(a) for a in actions]
    rows = []
    for ids, mask, turns in training_sequences(encoder, observations, action_ids):
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
            }
        )
    return rows
