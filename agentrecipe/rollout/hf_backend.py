"""Hugging Face transformers generation backend: KV cache kept across turns, batched constrained sampling.

    backend = HFBackend(model, pad_id, eos_id)
    gens = backend.generate(prompts, params, tries, keys=episode_ids)   # every turn
    backend.release()                                                  # when the episodes end

Cache reuse across calls. With `keys`, each row's keys and values (of the tokens it fed: the
prompt and its reply, less the last sampled token) are kept under its key after the call. The
next call with that key reuses the longest common prefix of those tokens and the new prompt and
prefills only the rest: with full history (agent.history = -1) a turn's prompt extends the last
prompt and reply, so only the last reply's eos and the new observation segment are prefilled;
with a history window at least the shared head (system prompt and goal) is reused. Cached keys
and values are the ones an uncached prefill computes at the same positions (explicit position
ids, padding masked), so ids and log-probs match uncached generation up to float rounding.
Calls without keys keep nothing. Models whose cache is not a plain `DynamicLayer` per layer
(sliding-window or recurrent layers) ignore keys.

One call's layout (row i reuses c_i cached tokens and prefills its s_i remaining prompt tokens):

    [pad (C - c_i) | cached c_i] [pad (S - s_i) | rest s_i] [decoded ...]    C = max c_i, S = max s_i

Pads are masked. Rows whose s_i differ widely are prefilled in separate forwards (`prefill_groups`:
each group padded to its own longest row; with a history window a turn's prompt is mostly new
tokens, and one padded block ran 1.6x the prefilled tokens in evaluation), and their caches are
then reassembled into one left-padded batch cache for decoding. A row that samples eos leaves the
batch at once (its valid columns are copied out and kept, then the batch cache keeps the live rows
with `batch_select_indices`), so decoding runs on live rows only. Kept memory: one compact copy per
live episode.

Sampling is batched: every step builds one (b, V) allowed mask from the rows' tries
(`TrieBatch`, tensor indexing over the tries' node tables) and samples all rows with one
`torch.multinomial` call on one generator seeded by `params.seed`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agentrecipe.agent.decoding import TokenTrie
from agentrecipe.rollout.backend import Generation, SamplingParams, row_temperatures


def sample_batch(logits: torch.Tensor, allowed: torch.Tensor | None, temperature: torch.Tensor, top_p: float,
                 generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of (b, V) `logits`; return (tokens (b,), their log-probs (b,)).

    Tokens outside `allowed` (b, V) get probability 0 and the rest are renormalised:
    log p(y) = log_softmax(z / T)[y], with z = logits (-inf outside allowed) and T the row's
    temperature. A row with T = 0 is greedy: argmax, log-prob at T = 1. top-p (sampled rows)
    keeps the smallest set of most likely tokens whose probability reaches p, renormalised.
    """
    z = logits.float()
    if allowed is not None:
        z = z.masked_fill(~allowed, float("-inf"))
    greedy = temperature == 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature).to(z.dtype)
    logp = torch.log_softmax(z / t[:, None], -1)
    if top_p < 1.0:
        sorted_logp, order = torch.sort(logp, -1, descending=True)
        p = sorted_logp.exp()
        keep = (p.cumsum(-1) - p < top_p) | greedy[:, None]
        logp = torch.log_softmax(torch.full_like(logp, float("-inf")).scatter(
            -1, order, sorted_logp.masked_fill(~keep, float("-inf"))), -1)
    tok = logp.argmax(-1)
    if not bool(greedy.all()):
        sampled = (~greedy).nonzero().squeeze(1)
        tok[sampled] = torch.multinomial(logp[sampled].exp(), 1, generator=generator).squeeze(1)
    return tok, logp.gather(1, tok[:, None]).squeeze(1)


class TrieBatch:
    """The tries of a batch's rows as one node table; a row's state is a node id (-1: unconstrained)."""

    def __init__(self, tries: list[TokenTrie | None]):
        starts, tokens, children, roots = [], [], [], []
        nodes = edges = 0
        for trie in tries:
            if trie is None:
                roots.append(-1)
                continue
            start, tok, child = trie.tables()
            roots.append(nodes)
            starts += [s + edges for s in start[:-1]]
            tokens += tok
            children += [c + nodes for c in child]
            nodes, edges = nodes + len(start) - 1, edges + len(tok)
        starts.append(edges)
        self.start = torch.tensor(starts, dtype=torch.long)  # (N + 1,)
        self.token = torch.tensor(tokens, dtype=torch.long)  # (E,)
        self.child = torch.tensor(children, dtype=torch.long)  # (E,)
        self.roots = torch.tensor(roots, dtype=torch.long)  # (B,) each row's root node

    def edges(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, edge) index pairs of every edge leaving each constrained row's node."""
        rows = (state >= 0).nonzero().squeeze(1)
        node = state[rows]
        first, counts = self.start[node], self.start[node + 1] - self.start[node]
        row_of = torch.repeat_interleave(rows, counts)
        within = torch.arange(int(counts.sum())) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        return row_of, torch.repeat_interleave(first, counts) + within

    def allowed(self, state: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
        """((b, V) bool allowed mask, (b,) bool rows at a node with no way on); free rows allow all."""
        row_of, edge = self.edges(state)
        mask = (state < 0)[:, None].expand(-1, vocab).clone()
        mask[row_of, self.token[edge]] = True
        stuck = torch.zeros_like(state, dtype=torch.bool)
        con = state >= 0
        stuck[con] = self.start[state[con] + 1] == self.start[state[con]]
        return mask, stuck

    def advance(self, state: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """Each constrained row's node after taking `tok`."""
        row_of, edge = self.edges(state)
        hit = self.token[edge] == tok[row_of]
        out = state.clone()
        out[row_of[hit]] = self.child[edge[hit]]
        return out


@dataclass
class RowCache:
    """One row's kept keys and values: the n tokens it fed, (heads, n, head_dim) per layer."""

    tokens: torch.Tensor
    kv: list[tuple[torch.Tensor, torch.Tensor]]


PREFILL_CALL_OVERHEAD = 256
"""A prefill forward's fixed cost in padded positions (tiny model on 2 CPU cores: a few ms, about
what 256 more positions cost); it decides when splitting a batch's prefill pays."""


def prefill_groups(lengths: list[int], call_overhead: int = PREFILL_CALL_OVERHEAD) -> list[list[int]]:
    """Rows (indices into `lengths`) split into groups prefilled by separate forwards.

    A group's forward runs len(group) x max length positions (shorter rows are padded). Sorted by
    length, the rows are cut into the runs that minimise positions + call_overhead per group
    (dynamic programming over the cut points); each group lists its rows in their batch order.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = len(order)
    best, cut = [0] + [None] * n, [0] * (n + 1)  # best[j]: cost of the j shortest rows
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        best[j], cut[j] = min((best[i] + (j - i) * longest + call_overhead, i) for i in range(j))
    groups, j = [], n
    while j > 0:
        groups.append(sorted(order[cut[j]:j]))
        j = cut[j]
    return groups[::-1]


def _compact(cache: DynamicCache, attn: torch.Tensor, col_ids: torch.Tensor, b: int) -> RowCache:
    """Batch row b's cache: a copy of its valid columns (a view would pin the whole batch cache)."""
    cols = attn[b].nonzero().squeeze(1)
    on_dev = cols.to(cache.layers[0].keys.device)
    kv = [(layer.keys[b].index_select(1, on_dev), layer.values[b].index_select(1, on_dev)) for layer in cache.layers]
    return RowCache(col_ids[b, cols], kv)


def _plain_layers(model) -> bool:
    """True when every layer's cache is a plain DynamicLayer (rows can be cut and reassembled)."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D id tensors."""
    n = min(len(a), len(b))
    diff = (a[:n] != b[:n]).nonzero()
    return n if len(diff) == 0 else int(diff[0])


class HFBackend:
    """Batched generation with the policy itself (see the module docstring)."""

    def __init__(self, model, pad_id: int, eos_id: int, call_overhead: int = PREFILL_CALL_OVERHEAD):
        self.model = getattr(model, "module", model)
        self.pad_id = pad_id
        self.eos_id = eos_id
        self._rows: dict = {}
        self.reuses_cache = _plain_layers(self.model)
        """False for models whose cache layers are not plain DynamicLayers (then keys are ignored)."""
        self.call_overhead = call_overhead
        """What one more prefill forward costs, in padded positions (see `prefill_groups`)."""
        self.stats = {"prompt_tokens": 0, "prefilled_tokens": 0, "prefill_positions": 0}
        """Prompt tokens asked for, those actually prefilled (the rest came from kept caches), and the
        positions the prefill forwards ran (prefilled tokens plus padding)."""

    @property
    def exact_logprobs(self) -> bool:
        """The policy itself samples: at fp32 its log-probs are what the trainer computes (to float
        rounding), so RL takes them as pi_old; at bf16 / fp16 the kernels differ more, and RL recomputes."""
        return next(self.model.parameters()).dtype == torch.float32

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def update_weights(self, model) -> None:
        """The policy itself generates: follow the (possibly new) module; kept caches are stale."""
        self.model = getattr(model, "module", model)
        self.reuses_cache = _plain_layers(self.model)
        self.release()

    def release(self, keys=None) -> None:
        """Drop the kept caches of `keys` (all when None)."""
        if keys is None:
            self._rows.clear()
        for k in keys or ():
            self._rows.pop(k, None)

    def _reuse(self, prompts: list[torch.Tensor], keys) -> list[tuple[int, RowCache | None]]:
        """Per row: (tokens reused from its kept cache, the cache); always leaves one token to prefill."""
        out = []
        for i, p in enumerate(prompts):
            row = self._rows.pop(keys[i], None) if keys is not None else None
            out.append((0, None) if row is None else (min(common_prefix(row.tokens, p), len(p) - 1), row))
        return out

    def _store(self, keys, rows: torch.Tensor, cache: DynamicCache, attn: torch.Tensor, col_ids: torch.Tensor,
               which) -> None:
        """Keep the caches of batch rows `which` under their prompts' keys."""
        for b in which:
            self._rows[keys[int(rows[b])]] = _compact(cache, attn, col_ids, b)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, tries: list[TokenTrie | None] | None = None,
        keys: list | None = None,
    ) -> list[Generation]:
        """Generate a reply per prompt; `keys` (one hashable per prompt) keep and reuse caches across calls."""
        if not prompts:
            return []
        B, dev = len(prompts), self.device
        if keys is not None and (len(keys) != B or len(set(keys)) != B):
            raise ValueError("keys: one distinct key per prompt")
        if keys is not None and not self.reuses_cache:
            keys = None
        tries = tries or [None] * B
        gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        was_training = self.model.training
        self.model.eval()

        prompt_ids = [torch.tensor(p, dtype=torch.long) for p in prompts]
        reuse = self._reuse(prompt_ids, keys)
        logits, cache, attn, col_ids = self._prefill(prompt_ids, reuse, dev)
        self.stats["prompt_tokens"] += sum(map(len, prompts))
        self.stats["prefilled_tokens"] += sum(len(p) - c for p, (c, _) in zip(prompts, reuse))

        temp = torch.tensor(row_temperatures(params, B), dtype=torch.float32)
        trie = TrieBatch(tries)
        state = trie.roots.clone()  # (b,) trie node per live row
        rows = torch.arange(B)  # batch row -> prompt index
        out_ids = torch.full((B, params.max_new_tokens), self.pad_id, dtype=torch.long)
        out_lp = torch.zeros((B, params.max_new_tokens))
        out_node = torch.full((B, params.max_new_tokens), -1, dtype=torch.long)
        length = torch.zeros(B, dtype=torch.long)
        finished = torch.zeros(B, dtype=torch.bool)
        step_pos = torch.tensor([[len(p)] for p in prompts], dtype=torch.long)  # (b, 1) next position
        for k in range(params.max_new_tokens):
            if k > 0:  # the prefill gave step 0's logits
                res = self.model(input_ids=tok[:, None].to(dev), attention_mask=attn.to(dev),
                                 position_ids=step_pos.to(dev), past_key_values=cache, use_cache=True, logits_to_keep=1)
                cache = res.past_key_values
                logits = res.logits[:, -1, :].float().cpu()  # (b, V)
                step_pos = step_pos + 1
            allowed, stuck = trie.allowed(state, logits.shape[-1])
            allowed[stuck] = True  # a row with no way on ends here unfinished; its sample is dropped
            tok, lp = sample_batch(logits, allowed, temp, params.top_p, gen)
            going = ~stuck
            r = rows[going]
            out_ids[r, k], out_lp[r, k] = tok[going], lp[going]
            out_node[r, k] = (state - trie.roots[rows])[going]
            length[r] = k + 1
            eos = going & (tok == self.eos_id)
            finished[rows[eos]] = True
            done = stuck | eos
            if k == params.max_new_tokens - 1:
                break
            if done.any():  # rows that end leave the batch
                if keys is not None:
                    self._store(keys, rows, cache, attn, col_ids, done.nonzero().squeeze(1).tolist())
                keep = (~done).nonzero().squeeze(1)
                rows = rows[keep]
                if len(keep) == 0:
                    break
                cache.batch_select_indices(keep.to(dev))
                attn, col_ids, step_pos = attn[keep], col_ids[keep], step_pos[keep]
                tok, state, temp = tok[keep], state[keep], temp[keep]
            state = trie.advance(state, tok)
            attn = torch.cat([attn, torch.ones((len(rows), 1), dtype=torch.long)], dim=1)
            col_ids = torch.cat([col_ids, tok[:, None]], dim=1)
        if keys is not None and params.max_new_tokens > 0 and len(rows):
            self._store(keys, rows, cache, attn, col_ids, range(len(rows)))
        if was_training:
            self.model.train()
        return self._outputs(tries, out_ids, out_lp, out_node, length, finished)

    def _prefill(self, prompt_ids: list[torch.Tensor], reuse: list[tuple[int, RowCache | None]], dev):
        """Forward every prompt's uncached tokens: (step-0 logits (B, V), batch cache, attention mask, column ids).

        Rows are prefilled in groups of similar length (`prefill_groups`), each padded to its own
        longest row; with several groups, the rows' caches are then reassembled, left-padded, into
        one batch cache for decoding."""
        s = [len(p) - c for p, (c, _) in zip(prompt_ids, reuse)]
        groups = prefill_groups(s, self.call_overhead)
        self.stats["prefill_positions"] += sum(len(g) * max(s[i] for i in g) for g in groups)
        if len(groups) == 1:
            return self._prefill_block(prompt_ids, reuse, dev)
        logits, kept = None, [None] * len(prompt_ids)
        for g in groups:
            lg, cache, attn, col_ids = self._prefill_block([prompt_ids[i] for i in g], [reuse[i] for i in g], dev)
            if logits is None:
                logits = lg.new_empty((len(prompt_ids), lg.shape[-1]))
            logits[g] = lg
            for b, i in enumerate(g):
                kept[i] = _compact(cache, attn, col_ids, b)
        P = max(len(p) for p in prompt_ids)
        attn = torch.zeros((len(prompt_ids), P), dtype=torch.long)
        col_ids = torch.full((len(prompt_ids), P), self.pad_id, dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            attn[i, P - len(p):] = 1
            col_ids[i, P - len(p):] = p
        return logits, self._assemble([(len(p), row) for p, row in zip(prompt_ids, kept)], P, dev), attn, col_ids

    def _prefill_block(self, prompt_ids: list[torch.Tensor], reuse: list[tuple[int, RowCache | None]], dev):
        """One prefill forward over these rows in the layout of the module docstring."""
        B = len(prompt_ids)
        C = max(c for c, _ in reuse)
        S = max(len(p) - c for p, (c, _) in zip(prompt_ids, reuse))
        ids = torch.full((B, S), self.pad_id, dtype=torch.long)  # prefill block
        pos = torch.zeros((B, S), dtype=torch.long)
        attn = torch.zeros((B, C + S), dtype=torch.long)
        col_ids = torch.full((B, C + S), self.pad_id, dtype=torch.long)  # the token of every cache column
        for i, (p, (c, row)) in enumerate(zip(prompt_ids, reuse)):
            s = len(p) - c
            ids[i, S - s:] = p[c:]
            pos[i, S - s:] = torch.arange(c, len(p))
            attn[i, C - c:C] = 1
            attn[i, C + S - s:] = 1
            col_ids[i, C - c:C] = p[:c]
        col_ids[:, C:] = ids
        cache = self._assemble(reuse, C, dev) if C > 0 else DynamicCache(config=self.model.config)
        res = self.model(input_ids=ids.to(dev), attention_mask=attn.to(dev), position_ids=pos.to(dev),
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        return res.logits[:, -1, :].float().cpu(), res.past_key_values, attn, col_ids

    def _assemble(self, reuse: list[tuple[int, RowCache | None]], C: int, dev) -> DynamicCache:
        """A batch cache of C = max c_i columns: each row's first c_i cached tokens, right-aligned
        (left pads are zeros: masked, but finite)."""
        ref = next(row for c, row in reuse if c > 0).kv
        layers = []
        for l, (k0, _) in enumerate(ref):
            none = k0.new_zeros((0, k0.shape[0], k0.shape[2]))  # a row with nothing cached
            kv = []
            for j in (0, 1):  # keys, values: (heads, n, d) per row -> (B, heads, C, d)
                seqs = [row.kv[l][j][:, :c].transpose(0, 1) if c > 0 else none for c, row in reuse]
                kv.append(pad_sequence(seqs, batch_first=True, padding_side="left").transpose(1, 2).contiguous().to(dev))
            layers.append(tuple(kv))
        return DynamicCache(ddp_cache_data=layers)

    def _outputs(self, tries, out_ids, out_lp, out_node, length, finished) -> list[Generation]:
        ids, lps, nodes, n = out_ids.tolist(), out_lp.tolist(), out_node.tolist(), length.tolist()
        out = []
        for i, trie in enumerate(tries):
            allowed = None if trie is None else [trie.node_allowed(v) for v in nodes[i][:n[i]]]
            out.append(Generation(ids=ids[i][:n[i]], logprobs=lps[i][:n[i]], allowed=allowed,
                                  finished=bool(finished[i])))
        return out
