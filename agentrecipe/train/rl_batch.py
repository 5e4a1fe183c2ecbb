"""From played episodes to the tensors of one RL step.

Training sequences: `training_sequences` gives one sequence per episode
(history = -1) or one per turn (a history window). Credit is assigned per
episode on its *action-token layout*: the episode's action tokens in order,
which is exactly the token sequence with environment tokens skipped. The
advantage estimators run on that layout; results are scattered back to the
sequences' action positions.

Forward passes never run on the padded (S, T) sequences: `RLBatch.packed(sel)`
packs the chosen sequences into prefix-tree rows (`logprobs.pack`), so a prefix
that several sequences share (the system prompt and goal of every turn of an
episode, a GRPO group's first observation, the growing window of the first
turns) is forwarded once, padding is not forwarded, and only the positions that
predict an action token reach the LM head (or the value head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrecipe.agent.prompt import PromptEncoder, training_sequences
from agentrecipe.rollout.episode import Episode
from agentrecipe.train.logprobs import Packed, pack, pad_batch


@dataclass
class PackedActions:
    """A packed forward's inputs for some sequences and where its outputs go."""

    packed: Packed
    at: torch.Tensor  # (N, 2) (row, node) of the token BEFORE each action token (its logits predict it)
    targets: torch.Tensor  # (N,) the action tokens
    allowed: list[list[int] | None] | None  # (N,) ids constrained decoding allowed, or None (free)
    rows: torch.Tensor  # (N,) index into the selection
    cols: torch.Tensor  # (N,) position in the sequence

    def scatter(self, x: torch.Tensor | None, n: int, T: int) -> torch.Tensor | None:
        """(N,) -> (n, T), zeros off the action tokens (keeps the graph)."""
        if x is None:
            return None
        out = torch.zeros((n, T), dtype=x.dtype, device=x.device)
        return out.index_put((self.rows.to(x.device), self.cols.to(x.device)), x)


@dataclass
class RLBatch:
    input_ids: torch.Tensor  # (S, T) sequences
    attention_mask: torch.Tensor  # (S, T)
    action_mask: torch.Tensor  # (S, T) float, 1 on generated tokens
    allowed: list[dict[int, list[int]]] | None  # per sequence: position -> ids decoding allowed (constrained only)
    vocab_size: int
    seq_episode: list[int]  # episode index of each sequence
    seq_keys: list[list]  # per sequence, per token: packing key (None, or (episode, turn) on action tokens)
    share: torch.Tensor  # (S, T) 1 / (action tokens of the token's episode) on action tokens (loss aggregation)
    # per-episode action layout
    ep_turn_rewards: torch.Tensor  # (E, N)
    ep_turn_mask: torch.Tensor  # (E, N)
    ep_turn_ids: torch.Tensor  # (E, A) turn of each action token
    ep_action_mask: torch.Tensor  # (E, A)
    group_ids: torch.Tensor  # (E,)
    rollout_logprobs: torch.Tensor  # (S, T) log-probs as sampled (0 off the action mask)
    kept: list[int]  # index into the step's episodes of each batch episode (row e is episodes[kept[e]])
    truncated: torch.Tensor  # (E,) bool: ended by the turn or context limit, not by the game
    next_prompts: list[list[int] | None]  # (E,) the prompt after the last action (turn-limit cuts), else None
    max_row_tokens: int = 0
    """Packed rows hold at most this many tokens (default: the longest sequence, so packing
    never lengthens the attention span of a row beyond that of a plain padded batch)."""

    @property
    def lengths(self) -> list[int]:
        return self.attention_mask.sum(-1).tolist()

    def packed(self, sel: list[int]) -> PackedActions:
        """Pack sequences `sel` (in this order) and list their action tokens' predicting nodes."""
        lengths = self.lengths
        seqs = [self.input_ids[s, : lengths[s]].tolist() for s in sel]
        packed = pack(seqs, [self.seq_keys[s] for s in sel], self.max_row_tokens or self.input_ids.shape[1])
        packed.input_ids = packed.input_ids.to(self.input_ids.device)
        packed.position_ids = packed.position_ids.to(self.input_ids.device)
        mask = self.action_mask.cpu()
        rows, cols, seq, pos = [], [], [], []
        for k, s in enumerate(sel):
            p = mask[s].nonzero().squeeze(1).tolist()
            rows += [k] * len(p)
            cols += p
            seq += [k] * len(p)
            pos += [q - 1 for q in p]  # an action token is never at position 0 (a prompt precedes it)
        allowed = None if self.allowed is None else [self.allowed[sel[r]].get(c) for r, c in zip(rows, cols)]
        targets = torch.tensor([seqs[r][c] for r, c in zip(rows, cols)], dtype=torch.long)
        return PackedActions(packed, packed.at(seq, pos), targets, allowed,
                             torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long))

    def packed_next(self, episodes: list[int]) -> tuple[Packed, torch.Tensor]:
        """Packed next prompts of `episodes` and the (row, node) of each one's last token: the value
        there is V of the state after the episode's last action (its bootstrap value)."""
        seqs = [self.next_prompts[e] for e in episodes]
        packed = pack(seqs, None, max(map(len, seqs), default=0))
        packed.input_ids = packed.input_ids.to(self.input_ids.device)
        packed.position_ids = packed.position_ids.to(self.input_ids.device)
        return packed, packed.at(list(range(len(seqs))), [len(s) - 1 for s in seqs])

    def allowed_mask(self, sel: list[int]) -> torch.Tensor | None:
        """(len(sel), T, V) bool mask of the allowed ids, for the dense reference `token_logprobs`
        (tests and benchmarks; training uses the index lists)."""
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
    keep = [i for i, ep in enumerate(episodes) if ep.action_ids and not ep.failed]
    if not keep:
        return None
    seqs, seq_ep, seq_lp, seq_allowed, seq_keys = [], [], [], [], []
    rewards, ep_turns, next_prompts = [], [], []
    for e, i in enumerate(keep):
        ep = episodes[i]
        rewards.append(episode_rewards[i])
        ep_turns.append([t for t, a in enumerate(ep.action_ids) for _ in a])
        cache: dict = {}
        for ids, mask, turns in training_sequences(encoder, ep.observations, ep.action_ids, cache, context_turns=True):
            seqs.append((ids, mask))
            seq_ep.append(e)
            seq_keys.append([None if t < 0 else (e, t) for t in turns])
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
        # a context cut ends at value 0 whatever rl.bootstrap_truncated says: its next prompt does not
        # fit agent.max_context (a state the policy never acts in, possibly past the model's positions)
        truncated = ep.truncated and not ep.context_cut and len(ep.observations) == len(ep.action_ids) + 1
        next_prompts.append(encoder.prompt(ep.observations, ep.action_ids, cache)[0] if truncated else None)
    n_actions = [len(t) for t in ep_turns]
    input_ids = pad_batch([s[0] for s in seqs], encoder.tokenizer.pad_token_id)
    action_mask = pad_batch([s[1] for s in seqs], 0, dtype=torch.float32)
    share = action_mask / torch.tensor([float(n_actions[e]) for e in seq_ep])[:, None]
    return RLBatch(
        input_ids=input_ids.to(device),
        attention_mask=pad_batch([[1] * len(s[0]) for s in seqs], 0).to(device),
        action_mask=action_mask.to(device),
        allowed=seq_allowed if constrained else None,
        vocab_size=vocab_size,
        seq_episode=seq_ep,
        seq_keys=seq_keys,
        share=share.to(device),
        ep_turn_rewards=pad_batch(rewards, 0.0, dtype=torch.float32),
        ep_turn_mask=pad_batch([[1.0] * len(r) for r in rewards], 0.0, dtype=torch.float32),
        ep_turn_ids=pad_batch(ep_turns, -1),
        ep_action_mask=pad_batch([[1.0] * len(t) for t in ep_turns], 0.0, dtype=torch.float32),
        group_ids=torch.tensor([group_of[i] for i in keep]),
        rollout_logprobs=pad_batch(seq_lp, 0.0, dtype=torch.float32).to(device),
        kept=keep,
        truncated=torch.tensor([episodes[i].truncated for i in keep], dtype=torch.bool),
        next_prompts=next_prompts,
    )
