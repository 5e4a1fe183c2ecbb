"""GiGPO anchor states: which turns of a step's episodes started from the same state.

GiGPO (Feng et al. 2025, arXiv:2505.10978) groups the turns of one game's
rollouts by the environment state they started from (an "anchor state") and
compares their returns within each such step group
(`agentrecipe.algos.advantages.gigpo_advantages`). Text environments expose
the state only as text, so the key of turn n is what the policy was shown of
the current state at that turn: the observation text and the admissible
commands of `episode.observations[n]` (the history window around it is not
part of the state). Two states that read alike are one anchor, as in the
paper's exact-match grouping.

A turn after an invalid one (a malformed reply, or a command the game refused)
starts from the state the invalid turn started from: the game did not move.
Its observation is only the refusal ("Nothing happens.", BabyAI's unknown-action
text), the same for every state, so keyed on it the turns after invalid
commands of unrelated states formed one step group; they take the earlier
turn's anchor instead.
"""

from __future__ import annotations

import torch

from agentrecipe.rollout.episode import Episode


def anchor_key(ep: Episode, turn: int) -> tuple[str, tuple[str, ...]]:
    obs = ep.observations[turn]
    return obs.text, tuple(obs.admissible_commands)


def anchor_ids(episodes: list[Episode], n_turns: int | None = None) -> torch.Tensor:
    """(E, N) long: one id per distinct anchor key over all `episodes`, -1 on padded turns.

    N is `n_turns` (pass `batch.ep_turn_mask.shape[1]` with the batch's episodes,
    `[episodes[i] for i in batch.kept]`), by default the most turns any episode
    played. Ids are shared across games; the step groups are (group id, anchor id) pairs."""
    ids: dict[tuple[str, tuple[str, ...]], int] = {}
    rows = []
    for ep in episodes:
        row: list[int] = []
        for n in range(min(ep.turns, len(ep.observations))):
            unmoved = n > 0 and n - 1 < len(ep.invalid) and ep.invalid[n - 1]
            row.append(row[n - 1] if unmoved else ids.setdefault(anchor_key(ep, n), len(ids)))
        rows.append(row)
    width = max((len(r) for r in rows), default=0) if n_turns is None else n_turns
    out = torch.full((len(episodes), width), -1, dtype=torch.long)
    for e, row in enumerate(rows):
        row = row[:width]
        out[e, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out
