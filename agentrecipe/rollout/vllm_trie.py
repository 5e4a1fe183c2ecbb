"""Admissible-command decoding inside vLLM: a logits processor that walks each request's token trie.

The engine loads `TrieLogitsProcessor` at start (`logits_processors=[TRIE_PROCESSOR]`, see
vllm_backend.engine_kwargs). A request asks for it by carrying its commands' token ids
(eos-terminated, as `agent.decoding.TokenTrie` is built) in
`SamplingParams.extra_args[TRIE_KEY]` (`trie_args`); before every decode step the processor sets every
logit outside `TokenTrie.allowed(output so far)` to -inf. So one `LLM.generate` per turn
decodes each constrained request to the end of its command, instead of one engine call per
branching token.

Semantics are those of HFBackend's constrained decoding: vLLM applies this processor before
temperature, top-p and the log-softmax of `logprobs_mode="processed_logprobs"`, so the
returned log-prob is that of p_c(y_t) = p(y_t) / sum_{v in allowed_t} p(v); a node with one
child gives log-prob exactly 0 (log softmax over one finite logit). Greedy decoding is the
argmax over the allowed set (the processor is not argmax-invariant, so vLLM applies it to
greedy requests too). A prefix the trie does not know (or a finished command) leaves only
`eos`, which ends the request.

The per-token allowed sets that training needs are not sent back: `allowed_sets` rebuilds
them from the trie and the generated ids.
"""

from __future__ import annotations

import functools

import torch

from agentrecipe.agent.decoding import TokenTrie

TRIE_KEY = "agentrecipe_trie"
TRIE_PROCESSOR = "agentrecipe.rollout.vllm_trie:TrieLogitsProcessor"


def trie_args(trie: TokenTrie, eos_id: int) -> dict:
    """`SamplingParams.extra_args` that make the processor constrain a request to `trie`."""
    return {TRIE_KEY: {"commands": trie.sequences, "eos": eos_id}}


def allowed_sets(trie: TokenTrie, ids: list[int]) -> list[list[int]]:
    """The allowed ids before each generated token: what constrained decoding sampled from."""
    return [trie.allowed(ids[:j]) for j in range(len(ids))]


@functools.cache
def _processor_class():
    """TrieLogitsProcessor, built on first use: vLLM is imported only where it is installed."""
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

    class TrieLogitsProcessor(AdapterLogitsProcessor):
        """Per request with `extra_args[TRIE_KEY]`: logits outside the trie's allowed set -> -inf."""

        def is_argmax_invariant(self) -> bool:
            return False  # it changes greedy choices: vLLM must apply it to greedy requests too

        def new_req_logits_processor(self, params):
            spec = (params.extra_args or {}).get(TRIE_KEY)
            if not spec:
                return None
            trie, eos = TokenTrie(spec["commands"]), spec["eos"]

            def mask(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
                allowed = trie.allowed(output_ids) or [eos]
                keep = torch.full_like(logits, float("-inf"))
                idx = torch.tensor(allowed, device=logits.device)
                keep[idx] = logits[idx]
                return keep

            return mask

    return TrieLogitsProcessor


def __getattr__(name: str):
    # `TRIE_PROCESSOR` names this attribute: vLLM resolves it in the engine process.
    if name == "TrieLogitsProcessor":
        return _processor_class()
    raise AttributeError(name)
