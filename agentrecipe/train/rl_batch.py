"""From played episodes to the tensors of one RL step.

Training sequences: `training_sequences` gives one sequence per episode
(history = -1) or one per turn (a history window). Credit is assigned per
episode on its *action-token layout*: the episode's action tokens in order,
which is exactly the token sequence with environment tokens skipped. The
advantage estimators run on that layout; results are scattered back to the
sequences' action positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrecipe.agent.prompt import PromptEncoder, training_sequences
from agentrecipe.rollout.episode import Episode
from agentrecipe.train.logprobs import pad_batch


@dataclass
class RLBatch:
    input_ids: torch.Tensor  # (S, T) sequences
    attention_mask: torch.Tensor  # (S, T)
    action_mask: torch.Tensor  # (S, T) float, 1 on generated tokens
    allowed: list[dict[int, list[int]]] | None  # per sequence: position -> ids decoding allowed (constrained only)
    vocab_size: int
    seq_episode: list[int]  # episode index of each sequence
    # per-episode action layout
    ep_turn_rewards: torch.Tensor  # (E, N)
    ep_turn_mask: torch.Tensor  # (E, N)
    ep_turn_ids: torch.Tensor  # (E, A) turn of each action token
    ep_action_mask: torch.Tensor  # (E, A)
    group_ids: torch.Tensor  # (E,)
    rollout_logprobs: torch.Tensor  # (S, T) log-probs as sampled (0 off the action mask)

    def allowed_mask(self, sel: list[int]) -> torch.Tensor | None:
        """(len(sel), T, V) bool mask of the allowed ids for some sequences, built per minibatch
        (the whole batch's mask would be S x T x V)."""
        if self.allowed is None:
            return None
        mask = torch.ones((len(sel), self.input_ids.shape[1], self.vocab_size), dtype=torch.bool)
        for row, s in enumerate(sel):
            for pos, ids in self.allowed[s].items():
                mask[row, pos] = False
                mask[row, pos, ids] = True
        return mask.to(self.input_ids.device)

    def to_layout(self, x: torch.Tensor) -> torch.Tensor:
        """(S, T) per-token values -> (E, A) on each episode's action layout (on the CPU)."""
        x, action_mask = x.detach().cpu(), self.action_mask.cpu()
        out = torch.zeros(self.ep_action_mask.shape, dtype=x.dtype)
        fill = [0] * out.shape[0]
        for s, e in enumerate(self.seq_episode):
            vals = x[s][action_mask[s].bool()]
            out[e, fill[e] : fill[e] + len(vals)] = vals
            fill[e] += len(vals)
        return out

    def from_layout(self, y: torch.Tensor) -> torch.Tensor:
        """(E, A) -> (S, T), zeros off the action mask (on the sequences' device)."""
        action_mask = self.action_mask.cpu()
        out = torch.zeros(action_mask.shape, dtype=y.dtype)
        taken = [0] * y.shape[0]
        for s, e in enumerate(self.seq_episode):
            pos = action_mask[s].bool()
            n = int(pos.sum())
            out[s, pos] = y[e, taken[e] : taken[e] + n]
            taken[e] += n
        return out.to(self.action_mask.device)


def build_batch(
    episodes: list[Episode],
    episode_rewards: list[list[float]],
    group_of: list[int],
    encoder: PromptEncoder,
    vocab_size: int,
    constrained: bool,
    device: torch.device | str = "cpu",
) -> RLBatch | None:
    """Tensors for the episodes that have at least one action and did not fail (None if none).

    Sequence tensors go to `device`; the per-episode layout stays on the CPU."""
    keep = [i for i, ep in enumerate(episodes) if ep.actions and not ep.failed]
    if not keep:
        return None
    seqs, seq_ep, seq_lp, seq_allowed = [], [], [], []
    rewards, ep_turns = [], []
    for e, i in enumerate(keep):
        ep = episodes[i]
        rewards.append(episode_rewards[i])
        ep_turns.append([t for t, a in enumerate(ep.actions) for _ in a])
        for ids, mask, turns in training_sequences(encoder, ep.observations, ep.actions):
            seqs.append((ids, mask))
            seq_ep.append(e)
            lp = [0.0] * len(ids)
            allowed: dict[int, list[int]] = {}
            start: dict[int, int] = {}
            for pos, t in enumerate(turns):
                if mask[pos]:
                    j = pos - start.setdefault(t, pos)  # token index within turn t's action
                    lp[pos] = ep.logprobs[t][j]
                    if ep.allowed[t] is not None:
                        allowed[pos] = ep.allowed[t][j]
            seq_lp.append(lp)
            seq_allowed.append(allowed)
    input_ids = pad_batch([s[0] for s in seqs], encoder.tokenizer.pad_token_id)
    return RLBatch(
        input_ids=input_ids.to(device),
        attention_mask=pad_batch([[1] * len(s[0]) for s in seqs], 0).to(device),
        action_mask=pad_batch([s[1] for s in seqs], 0, dtype=torch.float32).to(device),
        allowed=seq_allowed if constrained else None,
        vocab_size=vocab_size,
        seq_episode=seq_ep,
        ep_turn_rewards=pad_batch(rewards, 0.0, dtype=torch.float32),
        ep_turn_mask=pad_batch([[1.0] * len(r) for r in rewards], 0.0, dtype=torch.float32),
        ep_turn_ids=pad_batch(ep_turns, -1),
        ep_action_mask=pad_batch([[1.0] * len(t) for t in ep_turns], 0.0, dtype=torch.float32),
        group_ids=torch.tensor([group_of[i] for i in keep]),
        rollout_logprobs=pad_batch(seq_lp, 0.0, dtype=torch.float32).to(device),
    )
