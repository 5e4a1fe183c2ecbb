"""SFT on demonstrations: the action loss falls and the policy replays the expert."""

import pytest
import torch

from agentrecipe.agent.decoding import TokenTrie
from agentrecipe.agent.prompt import PromptEncoder
from agentrecipe.agent.replay import corpus_texts, replay_expert
from agentrecipe.config import DeepSpeedConfig, ModelConfig, SFTConfig
from agentrecipe.envs.textworld_env import make_env
from agentrecipe.models.registry import build_tiny
from agentrecipe.models.tokenizer import train_tokenizer
from agentrecipe.rollout.backend import SamplingParams
from agentrecipe.rollout.hf_backend import HFBackend
from agentrecipe.train.engine import unwrap
from agentrecipe.train.sft import action_nll, collate, sft_train
from agentrecipe.train.sft_data import pick_demo_games, transcript_rows

torch.set_num_threads(1)


def expert_agreement(model, enc: PromptEncoder, observations, actions) -> float:
    """Share of the expert's turns where the greedy, admissible-constrained policy picks the expert's action."""
    backend = HFBackend(model, enc.tokenizer.pad_token_id, enc.eos_id)
    prompts, tries = [], []
    action_ids = [enc.encode_action(a) for a in actions]
    for t in range(len(actions)):
        prompts.append(enc.prompt(observations[: t + 1], action_ids[:t])[0])
        tries.append(TokenTrie([enc.encode_action(c) for c in observations[t].admissible_commands]))
    gens = backend.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=32), tries)
    return sum(g.ids == a for g, a in zip(gens, action_ids)) / len(actions)


def test_demo_games_round_robin_over_levels_and_refuse_too_many(tw_games):
    games = [g for g in tw_games.values()]
    picked = pick_demo_games(games, [g.level for g in games], 2)
    assert [g.level for g in picked] == [games[0].level, games[1].level]
    with pytest.raises(ValueError, match="raise env.n_train or lower budget.sft_fraction"):
        pick_demo_games(games, [games[0].level], 2)


@pytest.mark.slow
def test_sft_lowers_action_loss_and_replays_the_expert(tw_games):
    game = tw_games["simple"]
    env = make_env({})
    observations, actions = replay_expert(env, game)
    env.close()
    tok = train_tokenizer(corpus_texts(observations, actions) * 3, 512)
    enc = PromptEncoder(tok, show_admissible=True, history=2)
    rows = transcript_rows(enc, game, observations, actions)
    assert len(rows) == len(actions)  # a history window: one row per expert turn
    model = build_tiny(ModelConfig(), tok)
    batch = collate(rows, tok.pad_token_id)
    with torch.no_grad():
        loss_before = action_nll(model, batch).item()
    agree_before = expert_agreement(model, enc, observations, actions)

    engine = sft_train(model, tok.pad_token_id, rows, SFTConfig(lr=3e-3, epochs=40, batch_size=4, warmup_steps=5),
                       DeepSpeedConfig())
    trained = unwrap(engine)
    with torch.no_grad():
        loss_after = action_nll(trained, batch).item()
    agree_after = expert_agreement(trained, enc, observations, actions)
    assert loss_after < 0.25 * loss_before, (loss_before, loss_after)
    assert agree_after >= 0.8 and agree_after > agree_before, (agree_before, agree_after)


def test_packed_action_nll_equals_the_padded_reference():
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrecipe.train.logprobs import token_logprobs

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    head = [3, 4, 5, 6]  # one demonstration's turn rows share its head (a history window)
    rows = [{"input_ids": head + [7, 8], "action_mask": [0, 0, 0, 0, 1, 1]},
            {"input_ids": head + [7, 8, 9, 10, 11], "action_mask": [0, 0, 0, 0, 0, 0, 0, 1, 1]},
            {"input_ids": [12, 13, 14], "action_mask": [0, 1, 1]}]
    batch = collate(rows, 0)
    logp, _ = token_logprobs(model, batch["input_ids"], batch["attention_mask"])
    reference = -(logp * batch["action_mask"]).sum() / batch["action_mask"].sum()
    assert action_nll(model, batch).item() == pytest.approx(reference.item(), abs=1e-6)
