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
    rows = [[ids.setdefault(anchor_key(ep, n), len(ids)) for n in range(min(ep.turns, len(ep.observations)))]
            for ep in episodes]
    width = max((len(r) for r in rows), default=0) if n_turns is None else n_turns
    out = torch.full((len(episodes), width), -1, dtype=torch.long)
    for e, row in enumerate(rows):
        row = row[:width]
        out[e, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out
