"""Admissible-command decoding: a prefix trie over the commands' token ids.

With `decoding=admissible`, each generated token is sampled from the policy's
distribution restricted to the tokens that continue some admissible command
(eos included at the end of each), renormalised:

    p_c(y_t | ...) = p(y_t | ...) / sum_{v in allowed_t} p(v | ...)

The log-probs we keep (and that training recomputes, given the same allowed
sets) are those of p_c, so RL stays on-policy.

For batched sampling a trie is also a table of numbered nodes (root = 0): the
edges of node n are `edge_token[start[n]:start[n + 1]]` (sorted ids) leading
to `edge_child[...]`, so a batch of tries advances with tensor indexing alone
(see `agentrecipe.rollout.hf_backend.TrieBatch`).
"""

from __future__ import annotations


class TokenTrie:
    """Prefix tree of token-id sequences."""

    def __init__(self, sequences: list[list[int]]):
        if not sequences:
            raise ValueError("TokenTrie needs at least one sequence")
        self.sequences = [list(seq) for seq in sequences]
        self.root: dict[int, dict] = {}
        for seq in sequences:
            node = self.root
            for tok in seq:
                node = node.setdefault(tok, {})
        self._tables: tuple[list[int], list[int], list[int]] | None = None

    def allowed(self, prefix: list[int]) -> list[int]:
        """Token ids that may follow `prefix` (empty when prefix is a complete sequence or invalid)."""
        node = self.root
        for tok in prefix:
            node = node.get(tok)
            if node is None:
                return []
        return sorted(node)

    def tables(self) -> tuple[list[int], list[int], list[int]]:
        """(start, edge_token, edge_child): node n's allowed ids are edge_token[start[n]:start[n+1]], sorted.

        Nodes are numbered breadth-first from the root (0); len(start) = nodes + 1.
        """
        if self._tables is None:
            start, edge_token, edge_child = [], [], []
            queue = [self.root]
            for node in queue:  # the queue grows while we walk it: breadth-first numbering
                start.append(len(edge_token))
                for tok in sorted(node):
                    edge_token.append(tok)
                    edge_child.append(len(queue))
                    queue.append(node[tok])
            start.append(len(edge_token))
            self._tables = (start, edge_token, edge_child)
        return self._tables

    def node_allowed(self, node: int) -> list[int]:
        """Sorted ids allowed at table node `node` (what `allowed(prefix)` gives for the prefix leading there)."""
        start, edge_token, _ = self.tables()
        return edge_token[start[node]:start[node + 1]]
