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

    lrs = []
    engine = sft_train(model, tok.pad_token_id, rows, SFTConfig(lr=3e-3, epochs=40, batch_size=4, warmup_steps=5),
                       DeepSpeedConfig(), log=lambda step, m: lrs.append(m["train/lr"]))
    # train/lr is the rate each step applied (before, the next step's: 2/5 first, 0 last)
    assert lrs[:2] == pytest.approx([3e-3 / 5, 2 * 3e-3 / 5]) and lrs[-1] > 0
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


class _RoomsEnv:
    """Eight rooms in a row, each with a long description: prompts grow with full history."""

    PLAN = ("go north", "take lamp", "open box", "go south", "take key", "unlock door", "go east", "look")

    def reset(self, game):
        self.t = 0
        return self._obs()

    def _obs(self, won=False):
        from agentrecipe.envs.base import Observation

        return Observation(text=f"You are in room {self.t}. A long description of room {self.t} follows here.",
                           objective="Find the key and leave.", admissible_commands=self.PLAN[self.t:self.t + 3] or ("look",),
                           score=float(won), max_score=1.0, won=won)

    def step(self, action):
        self.t += 1
        won = self.t >= len(self.PLAN)
        return self._obs(won), float(won), won, {}

    def close(self):
        pass


class _RoomsPool:
    def reset(self, games):
        self.envs = [_RoomsEnv() for _ in games]
        return [e.reset(g) for e, g in zip(self.envs, games)]

    def step(self, actions):
        from agentrecipe.envs.pool import StepResult

        return [None if a is None else StepResult(*e.step(a)) for e, a in zip(self.envs, actions)]


class _ExpertBackend:
    """Replies the expert's next action and records every prompt the rollout sends."""

    exact_logprobs = True

    def __init__(self, enc):
        self.enc, self.prompts = enc, []

    def generate(self, prompts, params, tries=None, keys=None):
        from agentrecipe.rollout.backend import Generation

        ids = self.enc.encode_action(_RoomsEnv.PLAN[len(self.prompts)])
        self.prompts += prompts
        return [Generation(ids, [0.0] * len(ids))]

    def release(self, keys=None):
        pass


@pytest.mark.parametrize("history", [-1, 2])
@pytest.mark.parametrize("max_context", [4096, 300])
def test_sft_prompts_are_the_rollouts_and_stop_where_its_context_does(history, max_context):
    """Before, demonstrations ignored agent.max_context: with a full history SFT trained on prompts
    (and positions) the policy never gets, since the rollout ends the episode there."""
    from agentrecipe.config import AgentConfig
    from agentrecipe.envs.base import GameSpec
    from agentrecipe.rollout.engine import RolloutSettings, run_episodes

    game = GameSpec(path="g", level="L", env="rooms", seed=0, expert_plan=_RoomsEnv.PLAN)
    observations, actions = replay_expert(_RoomsEnv(), game)
    tok = train_tokenizer(corpus_texts(observations, actions) * 3, 400)
    enc = PromptEncoder(tok, show_admissible=True, history=history)
    agent = AgentConfig(history=history, max_context=max_context, max_action_tokens=8, decoding="admissible")
    rows = transcript_rows(enc, game, observations, actions, agent)
    backend = _ExpertBackend(enc)
    settings = RolloutSettings(max_turns=20, decoding="admissible", max_context=max_context, max_action_tokens=8,
                               temperature=0.0)
    episode = run_episodes([game], backend, enc, _RoomsPool(), settings)[0]
    if history < 0:  # one row: turn t's prompt is everything before its first action token
        row = rows[0]
        starts = [i for i, t in enumerate(row["turn_ids"]) if t >= 0 and (i == 0 or row["turn_ids"][i - 1] != t)]
        sft_prompts = [row["input_ids"][:i] for i in starts]
    else:
        sft_prompts = [r["input_ids"][:r["action_mask"].index(1)] for r in rows]
    assert sft_prompts == backend.prompts
    assert episode.context_cut == (rows[0]["turns_cut"] > 0) == (history < 0 and max_context == 300)
    assert rows[0]["turns_cut"] == len(actions) - len(backend.prompts)


def test_sft_stops_a_demonstration_at_a_reply_free_decoding_cannot_finish():
    """With free decoding a reply longer than agent.max_action_tokens (eos included) is cut off at
    rollout, unfinished: SFT trained on it (and on the turns after it, whose history holds it)."""
    from agentrecipe.config import AgentConfig
    from agentrecipe.envs.base import GameSpec
    from agentrecipe.train.sft_data import kept_turns

    game = GameSpec(path="g", level="L", env="rooms", seed=0, expert_plan=_RoomsEnv.PLAN)
    observations, actions = replay_expert(_RoomsEnv(), game)
    enc = PromptEncoder(train_tokenizer(corpus_texts(observations, actions) * 3, 400), show_admissible=True, history=2)
    lengths = [len(enc.encode_action(a)) for a in actions]
    limit = sorted(set(lengths))[-2]  # the longest replies do not fit, the others do
    first_long = next(t for t, n in enumerate(lengths) if n > limit)
    assert 0 < first_long < len(actions) - 1
    for decoding, kept in [("free", first_long), ("admissible", len(actions))]:
        agent = AgentConfig(history=2, max_context=4096, max_action_tokens=limit, decoding=decoding)
        rows = transcript_rows(enc, game, observations, actions, agent)
        assert len(rows) == kept and rows[0]["turns_cut"] == len(actions) - kept, decoding  # a row a turn
        assert kept_turns(enc, observations, [enc.encode_action(a) for a in actions], agent) == \
            (kept, "reply" if decoding == "free" else "")
    agent = AgentConfig(history=2, max_context=4096, max_action_tokens=max(lengths), decoding="free")
    assert len(transcript_rows(enc, game, observations, actions, agent)) == len(actions)
