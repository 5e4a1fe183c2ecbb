"""Per-token log-probs and entropy of a causal LM.

`token_logprobs`: the plain reference over padded sequences.
logprobs[b, t] = log p(input_ids[b, t] | input_ids[b, :t]); position 0 gets 0.
When constrained decoding produced the tokens, `allowed_mask` (B, T, V) bool
restricts the softmax at action positions to the ids that were allowed, so
training recomputes exactly the distribution that was sampled from.

What the trainers run: `pack` the sequences into prefix-tree rows (a 4D attention
mask and explicit position ids give every token exactly its own sequence's context),
`lm_logits_at` gathers the hidden states that predict the wanted tokens before the LM
head (N x V logits, not B x T x V), and `constrained_logprobs` takes the allowed ids
as index lists. Same numbers as the reference, to float rounding (tests/test_rl_batch.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def pad_batch(seqs: list[list[int]], pad: int | float, dtype=torch.long) -> torch.Tensor:
    T = max(len(s) for s in seqs)
    out = torch.full((len(seqs), T), pad, dtype=dtype)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=dtype)
    return out


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    allowed_mask: torch.Tensor | None = None,
    with_entropy: bool = False,
):
    """(logprobs (B, T), entropy (B, T) or None) of each token given its prefix."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1, :].float()  # (B, T-1, V)
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    if allowed_mask is not None:
        logits = logits.masked_fill(~allowed_mask[:, 1:, :], float("-inf"))
    logp_all = torch.log_softmax(logits, dim=-1)
    target = input_ids[:, 1:]
    logp = torch.gather(logp_all, -1, target.unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    logp = torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1)  # (B, T)
    entropy = None
    if with_entropy:
        p = logp_all.exp()
        ent = -(p * torch.where(p > 0, logp_all, torch.zeros_like(logp_all))).sum(-1)
        entropy = torch.cat([torch.zeros_like(ent[:, :1]), ent], dim=1)
    return logp, entropy


# --------------------------------------------------------------- packed rows
@dataclass
class Packed:
    """Token sequences packed into rows as prefix trees: a shared prefix is forwarded once.

    Every sequence is a path from a root of its row's forest. A node is one token; its parent
    is the token before it in every sequence through it, its position id its depth (the token's
    index in those sequences), and it attends to exactly its ancestors and itself (a 4D mask).
    So each token sees the context it has in its own plain sequence and gets the same hidden
    state (up to float rounding): log-probs and values match the unpacked forward.
    """

    input_ids: torch.Tensor  # (R, L)
    position_ids: torch.Tensor  # (R, L) depth in the row's forest
    parent: list[list[int]]  # per row, per node: index of the parent node, -1 at a root
    node_of: list[tuple[int, list[int]]]  # per sequence: (row, node of each token)

    @property
    def tokens(self) -> int:
        """Positions forwarded (padding included): what one pass over the rows costs."""
        return int(self.input_ids.numel())

    def attention_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """(R, 1, L, L) additive mask: 0 where node i may attend node j (j an ancestor of i, or i), else min."""
        R, L = self.input_ids.shape
        allowed = np.zeros((R, L, L), dtype=bool)
        for r, parents in enumerate(self.parent):
            for i, p in enumerate(parents):
                if p >= 0:
                    allowed[r, i] = allowed[r, p]
                allowed[r, i, i] = True
            allowed[r, len(parents):, :] = np.eye(L, dtype=bool)[len(parents):]  # padding sees itself only
        mask = torch.zeros((R, 1, L, L), dtype=dtype)
        return mask.masked_fill_(~torch.from_numpy(allowed)[:, None], torch.finfo(dtype).min)

    def model_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The mask to pass the model: when every row is one plain sequence (no branching; e.g. one
        episode per sequence with full history) the (R, L) padding mask, so attention keeps its
        causal fast path; otherwise the (R, 1, L, L) tree mask of `attention_mask`."""
        if all(p == list(range(-1, len(p) - 1)) for p in self.parent):
            mask = torch.zeros(self.input_ids.shape, dtype=torch.long)
            for r, p in enumerate(self.parent):
                mask[r, : len(p)] = 1
            return mask
        return self.attention_mask(dtype)

    def at(self, seq: list[int], pos: list[int]) -> torch.Tensor:
        """(N, 2) (row, node) of token `pos[k]` of sequence `seq[k]`."""
        return torch.tensor([[self.node_of[s][0], self.node_of[s][1][p]] for s, p in zip(seq, pos)],
                            dtype=torch.long).reshape(-1, 2)


def pack(seqs: list[list[int]], keys: list[list] | None = None, max_tokens: int = 0, pad: int = 0) -> Packed:
    """Pack sequences into rows of prefix trees of at most `max_tokens` nodes each (first fit).

    Two sequences share a node while their tokens and `keys` agree from the start (the key of a
    token: anything hashable that must match too, e.g. which episode's action it is; None when
    only the ids matter). Each sequence goes to the first row where its new nodes fit, else it
    opens a row (max_tokens <= 0: one row for all; a sequence longer than max_tokens gets a row
    of its own).
    """
    rows: list[tuple[list[int], list[int], list[int], dict]] = []  # (ids, depth, parent, trie)
    node_of = []
    for s, ids in enumerate(seqs):
        key = keys[s] if keys is not None else [None] * len(ids)
        target = None
        for r, (r_ids, _, _, trie) in enumerate(rows):
            new, node = 0, -1
            for t, k in zip(ids, key):  # the nodes this sequence would add to row r
                node = trie.get((node, t, k), -2) if node != -2 else -2
                new += node == -2
            if max_tokens <= 0 or len(r_ids) + new <= max_tokens:
                target = r
                break
        if target is None:
            rows.append(([], [], [], {}))
            target = len(rows) - 1
        r_ids, r_depth, r_parent, trie = rows[target]
        nodes, node = [], -1
        for depth, (t, k) in enumerate(zip(ids, key)):
            child = trie.get((node, t, k))
            if child is None:
                child = len(r_ids)
                trie[(node, t, k)] = child
                r_ids.append(t)
                r_depth.append(depth)
                r_parent.append(node)
            nodes.append(child)
            node = child
        node_of.append((target, nodes))
    input_ids = pad_batch([r[0] for r in rows], pad)
    position_ids = pad_batch([r[1] for r in rows], 0)
    return Packed(input_ids, position_ids, [r[2] for r in rows], node_of)


def lm_logits_at(model, packed: Packed, at: torch.Tensor) -> torch.Tensor:
    """(N, V) logits of a causal LM at the packed nodes `at` (N, 2): the hidden states are gathered
    before the LM head, so the head runs on N positions, not on R x L.

    The gather is a forward pre-hook on the output embedding (the LM head) for this one call, so
    the call still goes through `model` (a DeepSpeed engine's forward and backward hooks see it)."""
    head = getattr(model, "module", model).get_output_embeddings()
    dev = packed.input_ids.device

    def gather(_module, args):
        hidden = args[0]  # (R, L, H)
        return (hidden[at[:, 0].to(hidden.device), at[:, 1].to(hidden.device)].unsqueeze(0),)

    handle = head.register_forward_pre_hook(gather)
    try:
        dtype = next(getattr(model, "module", model).parameters()).dtype
        out = model(input_ids=packed.input_ids, attention_mask=packed.model_mask(dtype).to(dev),
                    position_ids=packed.position_ids, use_cache=False)
    finally:
        handle.remove()
    return out.logits[0]  # (N, V)


def constrained_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    allowed: list[list[int] | None] | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each target under softmax(z / T) restricted to its allowed ids, and the entropy.

        log p(y) = z_y / T - logsumexp_{v in allowed} z_v / T
        H        = logsumexp_{v in A} z_v / T - sum_{v in A} p_v z_v / T

    logits (N, V); targets (N,); allowed: per row a list of ids (index lists, never an (N, V)
    mask), or None for the whole vocabulary. The entropy is computed without a graph unless
    `entropy_grad` (when it is only logged)."""
    z = logits.float()
    targets = targets.to(z.device)  # indexed below by index tensors on z's device
    if temperature > 0 and temperature != 1.0:
        z = z / temperature
    N = z.shape[0]
    lp = torch.zeros(N, dtype=z.dtype, device=z.device)
    ent = torch.zeros(N, dtype=z.dtype, device=z.device) if with_entropy else None
    free = list(range(N)) if allowed is None else [i for i, a in enumerate(allowed) if a is None]
    if free:
        f = torch.tensor(free, dtype=torch.long, device=z.device)
        logp = torch.log_softmax(z[f], -1)
        lp = lp.index_put((f,), logp.gather(1, targets[f, None]).squeeze(1))
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                lq = logp if entropy_grad else logp.detach()
                ent = ent.index_put((f,), -(lq.exp() * lq).sum(-1))
    rows = [i for i, a in enumerate(allowed or []) if a is not None]
    if rows:
        M = sum(len(allowed[i]) for i in rows)  # given as output_size: no device-to-host sync on a GPU
        counts = torch.tensor([len(allowed[i]) for i in rows], device=z.device)
        row = torch.repeat_interleave(torch.tensor(rows, device=z.device), counts, output_size=M)  # (M,)
        ids = torch.tensor([v for i in rows for v in allowed[i]], dtype=torch.long, device=z.device)  # (M,)
        seg = torch.repeat_interleave(torch.arange(len(rows), device=z.device), counts, output_size=M)
        za = z[row, ids]  # (M,) allowed logits
        top = torch.full((len(rows),), float("-inf"), device=z.device).scatter_reduce(0, seg, za.detach(), "amax")
        lse = top + torch.zeros(len(rows), device=z.device).index_add(0, seg, (za - top[seg]).exp()).log()
        r = torch.tensor(rows, device=z.device)
        lp = lp.index_put((r,), z[r, targets[r]] - lse)
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                za_, lse_ = (za, lse) if entropy_grad else (za.detach(), lse.detach())
                p = (za_ - lse_[seg]).exp()
                ent = ent.index_put((r,), lse_ - torch.zeros_like(lse_).index_add(0, seg, p * za_))
    return lp, ent
