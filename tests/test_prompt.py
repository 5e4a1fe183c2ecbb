"""Chat format, action mask, tokenizer round trip, reply parsing, constrained decoding."""

import pytest
import torch

from agentrecipe.agent.decoding import TokenTrie
from agentrecipe.agent.prompt import ChatFormat, PromptEncoder, parse_reply, training_sequences, user_text
from agentrecipe.agent.replay import corpus_texts, replay_expert
from agentrecipe.config import ModelConfig
from agentrecipe.envs.base import Observation
from agentrecipe.models.registry import build_tiny
from agentrecipe.models.tokenizer import train_tokenizer
from agentrecipe.rollout.backend import SamplingParams
from agentrecipe.rollout.hf_backend import HFBackend
from agentrecipe.rollout.vllm_trie import TRIE_KEY, allowed_sets, trie_args
from agentrecipe.train.logprobs import pad_batch, token_logprobs

torch.set_num_threads(1)


def obs(text, cmds=("go east", "go west", "look"), objective="Find the door."):
    return Observation(text=text, objective=objective, admissible_commands=tuple(cmds), score=0.0, max_score=1.0)


@pytest.fixture(scope="module")
def tokenizer():
    texts = [user_text(obs(f"You are in room {i}. A door is east."), True, True) for i in range(20)]
    return train_tokenizer(texts * 3 + ["go east", "go west", "look"], 400)


def test_tiny_tokenizer_round_trips_game_text(tokenizer, tw_games):
    from agentrecipe.envs.textworld_env import make_env

    env = make_env({})
    texts = corpus_texts(*replay_expert(env, tw_games["simple"]))
    env.close()
    for text in texts + ["Unseen wörds & symbols: \\ {} 123 -= Kitchen =-"]:
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_action_mask_covers_exactly_the_assistant_tokens(tokenizer):
    enc = PromptEncoder(tokenizer, show_admissible=True, history=-1)
    observations = [obs("Room A."), obs("Room B."), obs("Room C.")]
    actions = [enc.encode_action("go east"), enc.encode_action("look")]
    [(ids, mask, turns)] = training_sequences(enc, observations, actions)
    masked = [i for i, m in zip(ids, mask) if m]
    assert masked == actions[0] + actions[1]
    assert tokenizer.decode(masked) == "go east<|end|>look<|end|>"
    assert [t for t, m in zip(turns, mask) if m] == [0] * len(actions[0]) + [1] * len(actions[1])
    # The whole sequence is what the chat template renders for the same conversation.
    messages = [
        {"role": "system", "content": enc.fmt.head_pre.split("<|system|>")[1].split("<|end|>")[0]},
        {"role": "user", "content": user_text(observations[0], True, True)},
        {"role": "assistant", "content": "go east"},
        {"role": "user", "content": user_text(observations[1], True, False)},
        {"role": "assistant", "content": "look"},
    ]
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(messages, tokenize=False)


def test_a_reply_cut_by_the_token_limit_is_closed_with_eos_outside_the_action_mask(tokenizer):
    """A free reply stopped by agent.max_action_tokens has no eos: the next prompts still end that
    assistant turn as the template does (before, its text ran into the next user message), and the
    added eos is not trained on, as the policy did not sample it."""
    enc = PromptEncoder(tokenizer, show_admissible=True, history=-1)
    observations = [obs("Room A."), obs("Room B."), obs("Room C.")]
    cut = enc.encode_text("go ea")
    [(ids, mask, turns)] = training_sequences(enc, observations, [cut, enc.encode_action("look")])
    [(whole, whole_mask, whole_turns)] = training_sequences(enc, observations, [enc.encode_action("go ea"),
                                                                                 enc.encode_action("look")])
    eos = len(enc.prompt(observations[:1], [])[0]) + len(cut)  # the position of the first reply's eos
    assert ids == whole and whole[eos] == enc.eos_id
    assert mask[:eos] + mask[eos + 1:] == whole_mask[:eos] + whole_mask[eos + 1:] and (mask[eos], whole_mask[eos]) == (0, 1)
    assert turns[eos] == -1 and whole_turns[eos] == 0
    assert enc.prompt(observations[:2], [cut])[0] == enc.prompt(observations[:2], [enc.encode_action("go ea")])[0]


def test_history_window_gives_one_sequence_per_turn(tokenizer):
    enc = PromptEncoder(tokenizer, show_admissible=False, history=1)
    observations = [obs(f"Room {c}.") for c in "ABCD"]
    actions = [enc.encode_action(a) for a in ("go east", "go west", "look")]
    seqs = training_sequences(enc, observations, actions)
    assert len(seqs) == 3
    for t, (ids, mask, turns) in enumerate(seqs):
        assert [i for i, m in zip(ids, mask) if m] == actions[t]  # only this turn's action is trained
    text = tokenizer.decode(seqs[2][0])
    assert "Room B." in text and "Room C." in text and "Room A." not in text  # the last turn plus the current one


def test_chat_format_of_a_real_pretrained_template():
    """SmolLM2's ChatML template (from the bundled GGUF) gives the same layout."""
    from transformers import AutoTokenizer

    from agentrecipe.models.registry import smollm2_gguf

    try:
        folder, gguf = smollm2_gguf()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        pytest.skip(str(e))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    fmt = ChatFormat.from_tokenizer(tok)
    assert fmt.head_pre.startswith("<|im_start|>system\n") and fmt.head_pre.endswith("<|im_start|>user\n")
    assert fmt.user_post == "<|im_end|>\n<|im_start|>assistant\n"
    assert fmt.between == "\n<|im_start|>user\n"


@pytest.mark.parametrize("reply,action", [
    ("go east", "go east"), ("  Take Key.\nand more", "Take Key"), ("", None), ("   ", None), ("12 34 !!", None),
    ("x" * 300, None),
])
def test_reply_parsing(reply, action):
    assert parse_reply(reply) == action


def test_trie_allows_only_continuations():
    trie = TokenTrie([[1, 2, 9], [1, 3, 9], [4, 9]])
    assert trie.allowed([]) == [1, 4]
    assert trie.allowed([1]) == [2, 3]
    assert trie.allowed([1, 2]) == [9]
    assert trie.allowed([1, 2, 9]) == [] and trie.allowed([7]) == []


def test_allowed_sets_rebuild_what_constrained_decoding_sampled_from():
    """vLLM's trie processor returns ids only; training's allowed sets come from the trie after the fact."""
    trie = TokenTrie([[1, 2, 9], [1, 3, 9], [4, 9]])
    assert allowed_sets(trie, [1, 3, 9]) == [[1, 4], [2, 3], [9]]
    assert allowed_sets(trie, [4, 9]) == [[1, 4], [9]]
    assert trie_args(trie, 9) == {TRIE_KEY: {"commands": [[1, 2, 9], [1, 3, 9], [4, 9]], "eos": 9}}


def test_constrained_sampling_emits_admissible_commands_with_on_policy_logprobs(tokenizer):
    model = build_tiny(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tokenizer)
    enc = PromptEncoder(tokenizer, True, -1)
    commands = ["go east", "go west", "look"]
    prompt = enc.prompt([obs("Room A.")], [])[0]
    trie = TokenTrie([enc.encode_action(c) for c in commands])
    backend = HFBackend(model, tokenizer.pad_token_id, tokenizer.eos_token_id)
    gens = backend.generate([prompt] * 8, SamplingParams(temperature=1.0, max_new_tokens=10, seed=0), [trie] * 8)
    for g in gens:
        assert tokenizer.decode(g.ids[:-1]) in commands and g.ids[-1] == tokenizer.eos_token_id
    # Recomputing with the same allowed sets gives the sampled log-probs (the constrained distribution).
    g = gens[0]
    ids = torch.tensor([prompt + g.ids])
    allowed = torch.ones((1, ids.shape[1], len(tokenizer)), dtype=torch.bool)
    for j, a in enumerate(g.allowed):
        allowed[0, len(prompt) + j] = False
        allowed[0, len(prompt) + j, a] = True
    lp, _ = token_logprobs(model, ids, torch.ones_like(ids), 1.0, allowed)
    assert torch.allclose(lp[0, len(prompt):], torch.tensor(g.logprobs), atol=1e-5)
    # and the command probabilities of the constrained distribution sum to one
    total = 0.0
    for c in commands:
        seq = enc.encode_action(c)
        x = torch.tensor([prompt + seq])
        al = torch.ones((1, x.shape[1], len(tokenizer)), dtype=torch.bool)
        for j in range(len(seq)):
            al[0, len(prompt) + j] = False
            al[0, len(prompt) + j, trie.allowed(seq[:j])] = True
        total += float(token_logprobs(model, x, torch.ones_like(x), 1.0, al)[0][0, len(prompt):].sum().exp())
    assert total == pytest.approx(1.0, abs=1e-4)


def test_batched_left_padded_generation_matches_single(tokenizer):
    model = build_tiny(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tokenizer)
    enc = PromptEncoder(tokenizer, True, -1)
    p1 = enc.prompt([obs("Room A.")], [])[0]
    p2 = enc.prompt([obs("A much longer room description, with many words in it.")], [])[0]
    backend = HFBackend(model, tokenizer.pad_token_id, tokenizer.eos_token_id)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    both = backend.generate([p1, p2], greedy)
    alone = [backend.generate([p], greedy)[0] for p in (p1, p2)]
    for b, a in zip(both, alone):
        assert b.ids == a.ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    assert pad_batch([[1], [1, 2]], 0).tolist() == [[1, 0], [1, 2]]


@pytest.mark.parametrize("text,objective", [
    # TextWorld: the intro paragraph is the objective
    ("Get the key, then open the safe!\n\n-= Hall =-\nYou are in a hall.", "Get the key, then open the safe!"),
    # ALFWorld: the last line states the task after a label
    ("You are in the middle of a room.\n\nYour task is to: put a book in drawer.", "put a book in drawer."),
])
def test_the_first_prompt_states_the_objective_once(text, objective):
    out = user_text(obs(text, objective=objective), show_admissible=False, with_goal=True)
    assert out.startswith(f"Goal: {objective}\n\n") and out.count(objective) == 1
    assert "Your task is to" not in out and out.rstrip().endswith(("hall.", "room."))
