"""HF backend fast path: KV caches kept across turns, batched trie masks and sampling, ping-pong rollouts."""

import math

import pytest
import torch

from agentrecipe.agent.decoding import TokenTrie
from agentrecipe.agent.prompt import PromptEncoder, user_text
from agentrecipe.config import AgentConfig, ModelConfig
from agentrecipe.envs import registry
from agentrecipe.envs.base import GameSpec, Observation
from agentrecipe.envs.pool import EnvPool
from agentrecipe.models.registry import build_tiny
from agentrecipe.models.tokenizer import train_tokenizer
from agentrecipe.rollout.backend import SamplingParams
from agentrecipe.rollout.engine import RolloutSettings, run_episodes
from agentrecipe.rollout.hf_backend import HFBackend, TrieBatch, common_prefix, prefill_groups, sample_batch
from agentrecipe.train.validation import validation_stats

torch.set_num_threads(1)

# ------------------------------------------------------------- a game for these tests (module "tests.test_hf_cache")
# Game `seed` lasts 2 + seed % 3 turns whatever the agent does; each turn shows different text and
# commands of different token lengths, so rows of a batch end at different tokens and turns.
# Game 99's environment raises on its second step.
WORDS = ("red", "blue", "key", "door", "table", "lamp", "north", "south", "old", "box")


# Games whose one command parse_reply refuses: no letter (ScienceWorld gold plans hold "0"), over 100 characters.
ODD_COMMANDS = {96: "0", 97: "look " + "north " * 20}


def check_level(name: str) -> None:
    pass


def build_games(level: str, split: str, seeds: list[int], out_dir, options: dict) -> list[GameSpec]:
    return [GameSpec(path=f"rooms-{s}", level=level, env="rooms", split=split, seed=s) for s in seeds]


def room(seed: int, t: int) -> Observation:
    w = [WORDS[(seed * 7 + t * 3 + k) % len(WORDS)] for k in range(6)]
    text = f"Room {t} of game {seed}. You see a {w[0]} {w[1]} and a {w[2]}." + " It is dark." * ((seed + t) % 3)
    cmds = (f"take {w[0]}", f"open {w[1]} {w[2]}", f"go {w[3]}", f"put {w[4]} on {w[5]} {w[0]}")
    cmds = (ODD_COMMANDS[seed],) if seed in ODD_COMMANDS else cmds
    return Observation(text=text, objective="Open the box.", admissible_commands=cmds, score=0.0, max_score=1.0)


class RoomsEnv:
    def reset(self, game: GameSpec) -> Observation:
        self.seed, self.t = game.seed, 0
        return room(self.seed, 0)

    def step(self, action: str):
        self.t += 1
        if self.seed == 99 and self.t == 2:
            raise RuntimeError("boom")
        return room(self.seed, self.t), 0.0, self.t >= 2 + self.seed % 3, {"invalid": False}

    def close(self) -> None:
        pass


def make_env(options: dict) -> RoomsEnv:
    return RoomsEnv()


# ------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tok():
    texts = [user_text(room(s, t), True, True) for s in range(6) for t in range(5)]
    return train_tokenizer(texts * 2 + list(WORDS), 400)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0), tok).eval()


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setitem(registry.FAMILIES, "rooms", "tests.test_hf_cache")
    with EnvPool("rooms", {}, n_workers=0) as p:
        yield p


class Uncached:
    """The same backend, asked without keys: every call prefills every prompt from scratch."""

    def __init__(self, backend: HFBackend):
        self.backend = backend

    def generate(self, prompts, params, tries=None, keys=None):
        return self.backend.generate(prompts, params, tries)

    def release(self, keys=None):
        pass


GAMES = build_games("r", "test", list(range(6)), None, {})  # 2, 3, 4, 2, 3, 4 turns


# -------------------------------------------------------------------------------------------------- tests
def test_trie_tables_number_nodes_breadth_first():
    trie = TokenTrie([[1, 2, 9], [1, 3, 9], [4, 9]])
    # root 0 -> 1 (node 1), 4 (node 2); node 1 -> 2 (3), 3 (4); node 2 -> 9 (5); 3 -> 9 (6); 4 -> 9 (7)
    assert trie.tables() == ([0, 2, 4, 5, 6, 7, 7, 7, 7], [1, 4, 2, 3, 9, 9, 9], [1, 2, 3, 4, 5, 6, 7])
    assert [trie.node_allowed(n) for n in range(8)] == [[1, 4], [2, 3], [9], [9], [9], [], [], []]


def test_trie_batch_masks_and_advances_every_row_at_once():
    a, b = TokenTrie([[1, 2, 9], [1, 3, 9], [4, 9]]), TokenTrie([[5, 9]])
    batch = TrieBatch([a, None, b])
    state = batch.roots.clone()  # [0, -1, 8]: b's nodes follow a's 8
    assert state.tolist() == [0, -1, 8]
    mask, stuck = batch.allowed(state, 10)
    assert mask[0].nonzero().squeeze(1).tolist() == [1, 4] and bool(mask[1].all())
    assert mask[2].nonzero().squeeze(1).tolist() == [5] and not stuck.any()
    state = batch.advance(state, torch.tensor([1, 7, 5]))
    assert state.tolist() == [1, -1, 9]
    state = batch.advance(batch.advance(state, torch.tensor([3, 0, 9])), torch.tensor([9, 0, 0]))
    assert (state - batch.roots).tolist()[0] == 7 and batch.allowed(state, 10)[1].tolist() == [True, False, True]


def test_batched_sampling_renormalises_over_the_allowed_tokens():
    # logits log([1, 2, 3, 4]); allowed {1, 3}: p = 2/6, 4/6. Greedy takes 3 with log(4/6).
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0, 4.0]] * 2))
    allowed = torch.tensor([[False, True, False, True]] * 2)
    tok, lp = sample_batch(logits, allowed, torch.tensor([0.0, 1.0]), 1.0, torch.Generator().manual_seed(0))
    assert tok[0] == 3 and lp[0].item() == pytest.approx(math.log(4 / 6))
    assert tok[1] in (1, 3) and lp[1].item() == pytest.approx(math.log({1: 2 / 6, 3: 4 / 6}[int(tok[1])]))
    # T = 2 over {1, 3}: p proportional to 2^(1/2), 4^(1/2); a single allowed token has log-prob 0.
    tok, lp = sample_batch(logits[:1], allowed[:1], torch.tensor([2.0]), 1.0, torch.Generator().manual_seed(0))
    want = {1: 2 ** 0.5 / (2 ** 0.5 + 2), 3: 2 / (2 ** 0.5 + 2)}[int(tok)]
    assert lp.item() == pytest.approx(math.log(want))
    lp = sample_batch(logits[:1], torch.tensor([[False, False, False, True]]), torch.tensor([2.0]), 1.0, None)[1]
    assert lp.item() == 0.0
    # top-p 0.5 over p = [.1, .2, .3, .4]: keeps 4 (0.4 < 0.5) and 3 (0.4 + 0.3 reaches it): 3/7, 4/7.
    tok, lp = sample_batch(logits[:1], None, torch.tensor([1.0]), 0.5, torch.Generator().manual_seed(1))
    assert int(tok) in (2, 3) and lp.item() == pytest.approx(math.log({2: 3 / 7, 3: 4 / 7}[int(tok)]))


def test_common_prefix():
    t = torch.tensor
    assert common_prefix(t([1, 2, 3]), t([1, 2, 4, 5])) == 2 and common_prefix(t([1, 2]), t([1, 2, 3])) == 2
    assert common_prefix(t([], dtype=torch.long), t([1])) == 0 and common_prefix(t([3]), t([1])) == 0


@pytest.mark.parametrize("history", [-1, 1])
@pytest.mark.parametrize("decoding", ["admissible", "free"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cached_prefix_rollouts_match_uncached(history, decoding, temperature, tok, model, pool):
    enc = PromptEncoder(tok, True, history)
    settings = RolloutSettings(max_turns=4, decoding=decoding, max_context=2048, max_action_tokens=8,
                               temperature=temperature, seed=3)
    cached = HFBackend(model, tok.pad_token_id, tok.eos_token_id)
    plain = HFBackend(model, tok.pad_token_id, tok.eos_token_id)
    got = run_episodes(GAMES, cached, enc, pool, settings)
    want = run_episodes(GAMES, Uncached(plain), enc, pool, settings)
    # admissible: every reply is a command; free: the untrained model's replies are mostly invalid (no step)
    assert [ep.turns for ep in want] == ([2, 3, 4, 2, 3, 4] if decoding == "admissible" else [4] * 6)
    for g, w in zip(got, want):
        assert g.action_ids == w.action_ids and g.allowed == w.allowed
        for a, b in zip(g.logprobs, w.logprobs):
            assert a == pytest.approx(b, abs=1e-5)
    assert cached.stats["prompt_tokens"] == plain.stats["prompt_tokens"]
    assert not cached._rows, "run_episodes releases every kept cache"
    # what training recomputes from each turn's full sequence (rollout/logprob_mismatch) matches too
    for ep in got:
        for t in range(ep.turns):
            want_lp = _recomputed(model, enc.prompt(ep.observations[:t + 1], ep.action_ids[:t])[0], ep.action_ids[t],
                                  ep.allowed[t])
            assert max(abs(a - b) for a, b in zip(ep.logprobs[t], want_lp)) < 1e-5
    if history < 0:
        # Full history: after turn 1 a row prefills only what follows its kept tokens (prompt + reply,
        # less the last sampled token): that token plus the new observation segment.
        expected = 0
        for ep in got:
            prompts = [enc.prompt(ep.observations[:t + 1], ep.action_ids[:t])[0] for t in range(ep.turns)]
            expected += len(prompts[0]) + sum(len(p) - len(q) - len(a) + 1
                                              for q, a, p in zip(prompts, ep.action_ids, prompts[1:]))
        assert cached.stats["prefilled_tokens"] == expected
    else:
        assert cached.stats["prefilled_tokens"] < plain.stats["prefilled_tokens"]  # at least the shared head


def test_prefill_groups_cut_sorted_lengths_where_padding_costs_more_than_a_call():
    # lengths 10, 12, 100, 98 (rows 0..3). One group: 4 x 100 = 400 positions + 50 = 450. Two groups
    # {0, 1} and {2, 3}: 2 x 12 + 2 x 100 + 2 x 50 = 324, the least; a third group saves 2 or 2 and costs 50.
    assert prefill_groups([10, 12, 100, 98], call_overhead=50) == [[0, 1], [2, 3]]
    assert prefill_groups([10, 12, 100, 98], call_overhead=1000) == [[0, 1, 2, 3]]  # calls dearer than padding
    assert prefill_groups([5, 3, 4], call_overhead=0) == [[1], [2], [0]]  # free calls: no padding at all
    assert prefill_groups([7], call_overhead=0) == [[0]]


@pytest.mark.parametrize("history", [-1, 2])
def test_prefill_in_groups_matches_one_padded_prefill(history, tok, model, pool):
    """Rows prefilled in separate forwards and reassembled into one batch cache sample the same
    tokens with the same log-probs as one padded prefill (and keep the same caches for the next turn)."""
    enc = PromptEncoder(tok, True, history)
    settings = RolloutSettings(max_turns=4, decoding="admissible", max_context=2048, max_action_tokens=8,
                               temperature=1.0, seed=7)
    split = HFBackend(model, tok.pad_token_id, tok.eos_token_id, call_overhead=0)  # a group per distinct length
    whole = HFBackend(model, tok.pad_token_id, tok.eos_token_id, call_overhead=10**9)  # always one group
    got = run_episodes(GAMES, split, enc, pool, settings)
    want = run_episodes(GAMES, whole, enc, pool, settings)
    for g, w in zip(got, want):
        assert g.action_ids == w.action_ids and g.allowed == w.allowed
        for a, b in zip(g.logprobs, w.logprobs):
            assert a == pytest.approx(b, abs=1e-5)
    assert split.stats["prefilled_tokens"] == whole.stats["prefilled_tokens"]
    assert split.stats["prefill_positions"] == split.stats["prefilled_tokens"]  # no padding forwarded
    assert whole.stats["prefill_positions"] > whole.stats["prefilled_tokens"]


def test_ping_pong_rollouts_are_deterministic_and_on_policy(tok, model, pool):
    enc = PromptEncoder(tok, True, -1)
    settings = RolloutSettings(max_turns=4, decoding="admissible", max_context=2048, max_action_tokens=8,
                               temperature=1.0, seed=5, overlap_env=True)
    backend = HFBackend(model, tok.pad_token_id, tok.eos_token_id)
    games = GAMES + build_games("r", "test", [99], None, {})
    one, two = (run_episodes(games, backend, enc, pool, settings) for _ in range(2))
    assert [ep.action_ids for ep in one] == [ep.action_ids for ep in two]
    assert [ep.turns for ep in one] == [2, 3, 4, 2, 3, 4, 2] and not backend._rows
    assert [ep.failed for ep in one] == [False] * 6 + [True] and "boom" in one[6].error  # that episode only
    # the kept log-probs are the constrained ones a plain forward recomputes (what training does)
    for ep in one[:6]:
        for t in range(ep.turns):
            prompt = enc.prompt(ep.observations[:t + 1], ep.action_ids[:t])[0]
            assert _recomputed(model, prompt, ep.action_ids[t], ep.allowed[t]) == pytest.approx(ep.logprobs[t], abs=1e-5)


def test_per_row_temperatures_mix_greedy_and_sampled_rows(tok, model):
    enc = PromptEncoder(tok, True, -1)
    backend = HFBackend(model, tok.pad_token_id, tok.eos_token_id)
    prompts = [enc.prompt([room(s, 0)], [])[0] for s in range(4)]
    tries = [TokenTrie([enc.encode_action(c) for c in room(s, 0).admissible_commands]) for s in range(4)]
    mixed = backend.generate(prompts, SamplingParams([0.0, 1.0, 0.0, 1.0], max_new_tokens=12, seed=0), tries)
    greedy = backend.generate(prompts, SamplingParams(0.0, max_new_tokens=12), tries)
    assert mixed[0].ids == greedy[0].ids and mixed[2].ids == greedy[2].ids
    assert mixed[0].logprobs == pytest.approx(greedy[0].logprobs, abs=1e-6)
    with pytest.raises(ValueError, match="temperature"):
        backend.generate(prompts, SamplingParams([0.0, 1.0], max_new_tokens=4), tries)


def _recomputed(model, prompt: list[int], action: list[int], allowed: list[list[int]] | None) -> list[float]:
    """Log-probs of `action` after `prompt` from one plain forward (T = 1), renormalised over `allowed`."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + action])).logits[0, len(prompt) - 1:-1]
    if allowed is not None:
        mask = torch.zeros_like(logits, dtype=torch.bool)
        for j, ids in enumerate(allowed):
            mask[j, ids] = True
        logits = logits.masked_fill(~mask, float("-inf"))
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(action)[:, None]).squeeze(1).tolist()


def test_episodes_the_context_outgrows_are_cut_and_counted_apart(tok, model, pool):
    enc = PromptEncoder(tok, True, -1)  # full history: the prompt grows every turn
    backend = HFBackend(model, tok.pad_token_id, tok.eos_token_id)
    roomy = RolloutSettings(max_turns=3, decoding="admissible", max_context=2048, max_action_tokens=8, temperature=0.0)
    full = run_episodes(GAMES, backend, enc, pool, roomy)
    assert not any(ep.context_cut for ep in full) and any(ep.truncated for ep in full)  # cut by the turn limit only
    first = max(len(enc.prompt(ep.observations[:1], [])[0]) for ep in full)
    tight = RolloutSettings(max_turns=3, decoding="admissible", max_context=first + 40, max_action_tokens=8, temperature=0.0)
    cut = run_episodes(GAMES, backend, enc, pool, tight)
    assert any(ep.context_cut for ep in cut)
    for ep, ref in zip(cut, full):
        if ep.context_cut:
            assert ep.truncated and not ep.won and 1 <= ep.turns < ref.turns and ep.summary()["context_cut"]
    # RL's held-out curve counts them too (the same greedy episodes through validation_stats)
    agent = AgentConfig(history=-1, decoding="admissible", max_context=first + 40, max_action_tokens=8)
    stats = validation_stats(GAMES, backend, enc, pool, agent, max_turns=3)
    assert stats["valid/context_cut"] > 0
    assert stats["valid/context_cut"] == pytest.approx(sum(ep.context_cut for ep in cut) / len(cut))


def test_a_constrained_reply_is_its_admissible_command_as_written(tok, model, pool):
    """With admissible decoding the reply is one of the commands. Before, it went through parse_reply,
    which refused "0" and commands over 100 characters: the turn was recorded as an invalid reply
    (the env never got the command) although the model wrote the command exactly."""
    games = [GameSpec(path=f"rooms-{s}", level="odd", env="rooms", seed=s) for s in ODD_COMMANDS]
    settings = RolloutSettings(max_turns=2, decoding="admissible", max_context=2048, max_action_tokens=8,
                               temperature=1.0, seed=0)
    backend = HFBackend(model, tok.pad_token_id, tok.eos_token_id)
    for ep in run_episodes(games, backend, PromptEncoder(tok, True, 2), pool, settings):
        assert ep.action_texts == [ODD_COMMANDS[ep.game.seed]] * 2 and not any(ep.invalid), ep.action_texts
