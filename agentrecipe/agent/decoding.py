"""Admissible-command decoding: a prefix trie over the commands' token ids.

With `decoding=admissible`, each generated token is sampled from the policy's
distribution restricted to the tokens that continue some admissible command
(eos included at the end of each), renormalised:

    p_c(y_t | ...) = p(y_t | ...) / sum_{v in allowed_t} p(v | ...)

The log-probs we keep (and that training recomputes, given the same allowed
sets) are those of p_c, so RL stays on-policy.
"""

from __future__ import annotations


class TokenTrie:
    """Prefix tree of token-id sequences."""

    def __init__(self, sequences: list[list[int]]):
        if not sequences:
            raise ValueError("TokenTrie needs at least one sequence")
        self.root: dict[int, dict] = {}
        for seq in sequences:
            node = self.root
            for tok in seq:
                node = node.setdefault(tok, {})

    def allowed(self, prefix: list[int]) -> list[int]:
        """Token ids that may follow `prefix` (empty when prefix is a complete sequence or invalid)."""
        node = self.root
        for tok in prefix:
            node = node.get(tok)
            if node is None:
                return []
        return sorted(node)
