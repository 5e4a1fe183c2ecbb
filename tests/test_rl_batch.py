"""The trainer's batch and passes: packed prefix-tree forwards give the plain per-sequence
log-probs, entropies and values; truncated episodes carry their bootstrap state; loss weights
per episode; multi-rank padding with zero-weight minibatches."""

import copy
import random

import pytest
import torch

from agentrecipe.agent.prompt import PromptEncoder, user_text
from agentrecipe.algos.losses import aggregate
from agentrecipe.config import ConfigError, ModelConfig, RolloutConfig
from agentrecipe.envs import registry
from agentrecipe.envs.pool import EnvPool
from agentrecipe.models.registry import build_tiny
from agentrecipe.models.tokenizer import train_tokenizer
from agentrecipe.rollout.engine import RolloutSettings, run_episodes
from agentrecipe.rollout.hf_backend import HFBackend
from agentrecipe.train import rl as rl_mod
from agentrecipe.train.critic import ValueModel
from agentrecipe.train.engine import enable_gradient_checkpointing, train_without_dropout
from agentrecipe.train.logprobs import constrained_logprobs, token_logprobs
from agentrecipe.train.rl import bootstrap_pass, policy_pass, truncation_values, value_pass
from agentrecipe.train.rl_batch import build_batch
from tests import walk_env
from tests.saved_bytes import SavedBytes

torch.set_num_threads(1)
GAMES = walk_env.build_games("walk", "train", list(range(8)), "", {})  # 1, 2, 3, 4, 1, 2, 3, 4 turns to win


@pytest.fixture(scope="module")
def tokenizer():
    env = walk_env.make_env({})
    texts = list(walk_env.COMMANDS)
    for g in GAMES:
        o = env.reset(g)
        for _ in range(4):
            texts += [user_text(o, True, True), user_text(o, True, False)]
            o = env.step("look")[0]
    return train_tokenizer(texts * 3, 300)


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0), tokenizer)


@pytest.fixture
def walk_pool(monkeypatch):
    monkeypatch.setitem(registry.FAMILIES, "walk", "tests.walk_env")
    with EnvPool("walk", {}, n_workers=0) as pool:
        yield pool


def play(model, tokenizer, pool, history: int, decoding: str, max_turns: int = 3):
    enc = PromptEncoder(tokenizer, True, history)
    backend = HFBackend(model, tokenizer.pad_token_id, tokenizer.eos_token_id)
    settings = RolloutSettings(max_turns=max_turns, decoding=decoding, max_action_tokens=6, temperature=1.0, seed=3)
    episodes = run_episodes(GAMES, backend, enc, pool, settings)
    rewards = [[0.0] * ep.turns for ep in episodes]
    batch = build_batch(episodes, rewards, list(range(len(episodes))), enc, len(tokenizer), decoding == "admissible")
    return enc, episodes, batch


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_constrained_logprobs_on_a_gpu_match_the_cpu():
    """The packed pass builds its targets on the CPU and the logits live on the GPU: every index
    must meet its tensor on one device (it did not, and every RL policy pass on a GPU failed, with
    free or admissible decoding)."""
    torch.manual_seed(0)
    logits, targets = torch.randn(4, 50), torch.tensor([3, 7, 8, 1])
    allowed = [[3, 4], None, [7, 8, 9], [1]]
    cpu = constrained_logprobs(logits, targets, allowed, 0.7, with_entropy=True, entropy_grad=False)
    gpu = constrained_logprobs(logits.cuda(), targets, allowed, 0.7, with_entropy=True, entropy_grad=False)
    for a, b in zip(cpu, gpu):
        assert b.is_cuda and torch.allclose(a, b.cpu(), atol=1e-5)


@pytest.mark.parametrize("history,decoding", [(2, "admissible"), (0, "free"), (-1, "admissible")])
def test_packed_passes_match_plain_sequences(model, tokenizer, walk_pool, history, decoding):
    enc, episodes, batch = play(model, tokenizer, walk_pool, history, decoding, max_turns=4)
    S, T = batch.input_ids.shape
    idx = list(range(S))
    mask = batch.action_mask
    with torch.no_grad():
        plain_lp, plain_ent = token_logprobs(model, batch.input_ids, batch.attention_mask, 1.0,
                                             batch.allowed_mask(idx), with_entropy=True)
        lp, ent, forwarded = policy_pass(model, batch, idx, 1.0, with_entropy=True)
    assert torch.allclose(lp, plain_lp * mask, atol=1e-5)
    assert torch.allclose(ent, plain_ent * mask, atol=1e-5)
    # the trainer's recomputed log-probs are the sampled ones (rollout/logprob_mismatch < 1e-5)
    assert float(((lp - batch.rollout_logprobs).abs() * mask).max()) < 1e-5
    assert forwarded <= S * T  # rows never longer than the longest sequence: never more than a padded batch
    if history == 2:  # one sequence per turn: the shared heads and growing windows are forwarded once
        assert forwarded < int(batch.attention_mask.sum()) / 1.5
    # a sub-selection in another order lands on the same rows
    sel = idx[::-2]
    with torch.no_grad():
        assert torch.allclose(policy_pass(model, batch, sel, 1.0)[0], plain_lp[sel] * mask[sel], atol=1e-5)
    # one sequence alone is a plain row: the padding-mask path (no tree mask) gives the same numbers
    assert batch.packed([S - 1]).packed.model_mask(torch.float32).dim() == 2
    with torch.no_grad():
        assert torch.allclose(policy_pass(model, batch, [S - 1], 1.0)[0], plain_lp[[S - 1]] * mask[[S - 1]], atol=1e-5)
    # the critic's values before each action token
    critic = ValueModel(model.model, model.config.hidden_size)
    torch.nn.init.normal_(critic.head.weight)
    with torch.no_grad():
        values, _ = value_pass(critic, batch, idx)
        assert torch.allclose(values, critic(batch.input_ids, batch.attention_mask) * mask, atol=1e-5)


def _saved_bytes_and_grads(actor, critic, batch) -> tuple[int, list[torch.Tensor]]:
    """Bytes autograd keeps for the backward of one policy + value loss, and the gradients."""
    idx = list(range(batch.input_ids.shape[0]))
    with SavedBytes() as saved:
        lp, _, _ = policy_pass(actor, batch, idx, 1.0)
        values, _ = value_pass(critic, batch, idx)
    (lp.sum() + values.square().sum()).backward()
    return saved.total, [p.grad for m in (actor, critic) for p in m.parameters()]


def test_gradient_checkpointing_keeps_the_gradients_and_keeps_fewer_activations(model, tokenizer, walk_pool):
    """deepspeed.gradient_checkpointing: the packed policy and value passes (tree masks, explicit
    positions) give the same gradients with each layer recomputed in backward, and autograd keeps
    less for it; a model without the feature is refused, naming the key."""
    _, _, batch = play(model, tokenizer, walk_pool, 2, "admissible", max_turns=4)
    runs = []
    for recompute in (False, True):
        actor = copy.deepcopy(model).train()
        critic = ValueModel(copy.deepcopy(model.model), model.config.hidden_size).train()
        torch.nn.init.normal_(critic.head.weight, generator=torch.Generator().manual_seed(0))  # the body gets a gradient
        if recompute:
            enable_gradient_checkpointing(actor)
            enable_gradient_checkpointing(critic)
        runs.append(_saved_bytes_and_grads(actor, critic, batch))
    (plain_bytes, plain_grads), (ckpt_bytes, ckpt_grads) = runs
    assert ckpt_bytes < 0.7 * plain_bytes, (plain_bytes, ckpt_bytes)
    assert all(a is not None and torch.allclose(a, b, atol=1e-6) for a, b in zip(plain_grads, ckpt_grads))
    with pytest.raises(ConfigError, match="deepspeed.gradient_checkpointing"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))


def test_training_mode_without_dropout_computes_what_eval_mode_does():
    """The RL trainer's passes run in training mode under gradient checkpointing: a model with
    attention and hidden dropout then gives the eval-mode logits (rollout, old and new log-probs agree)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    ids = torch.randint(0, 40, (2, 12))
    for model in (LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.5)),
                  GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.5,
                                             embd_pdrop=0.5, attn_pdrop=0.5))):
        with torch.no_grad():
            want = model.eval()(ids).logits
            assert not torch.allclose(model.train()(ids).logits, want)  # dropout on
            assert torch.allclose(train_without_dropout(model)(ids).logits, want, atol=1e-6) and model.training


def test_truncated_episodes_carry_the_state_after_their_last_action(model, tokenizer, walk_pool):
    enc, episodes, batch = play(model, tokenizer, walk_pool, 2, "admissible", max_turns=3)
    # seeds 3 and 7 need 4 turns: truncated by the limit of 3; the others end by winning
    assert batch.kept == list(range(8))
    assert batch.truncated.tolist() == [False, False, False, True] * 2
    for e, ep in enumerate(episodes):
        assert batch.next_prompts[e] == (enc.prompt(ep.observations, ep.action_ids)[0] if e % 4 == 3 else None)
    critic = ValueModel(model.model, model.config.hidden_size)
    torch.nn.init.normal_(critic.head.weight)
    with torch.no_grad():
        v = bootstrap_pass(critic, batch)
        for e in range(8):
            if e % 4 == 3:  # V(s_H): the value before the next action's first token
                x = torch.tensor([batch.next_prompts[e] + [0]])
                assert float(v[e]) == pytest.approx(float(critic(x, torch.ones_like(x))[0, -1]), abs=1e-5)
            else:
                assert float(v[e]) == 0.0
    # cut by the context limit instead (as the engine marks one whose next prompt does not fit
    # agent.max_context): no bootstrap prompt, value 0 (before, the critic read that too-long prompt)
    episodes[3].context_cut = True
    cut = build_batch(episodes, [[0.0] * ep.turns for ep in episodes], list(range(8)), enc, len(tokenizer), True)
    assert cut.next_prompts[3] is None and cut.next_prompts[7] == batch.next_prompts[7]


def test_truncated_episodes_end_at_value_zero_when_bootstrap_is_off(model, tokenizer, walk_pool):
    _, _, batch = play(model, tokenizer, walk_pool, 2, "admissible", max_turns=3)
    critic = ValueModel(model.model, model.config.hidden_size)
    torch.nn.init.normal_(critic.head.weight)
    calls = []
    critic.register_forward_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        assert truncation_values(critic, batch, bootstrap=False) is None
        assert calls == []  # no critic forward at all
        on = truncation_values(critic, batch, bootstrap=True)
    assert len(calls) == 1 and torch.equal(on, bootstrap_pass(critic, batch))
    assert on[3] != 0 and on[0] == 0


def test_episode_shares_weigh_every_episode_alike(model, tokenizer, walk_pool):
    enc, episodes, batch = play(model, tokenizer, walk_pool, 2, "admissible", max_turns=4)
    # each episode's action tokens share 1 between them, over all its per-turn sequences
    per_episode = torch.zeros(8).index_add(0, torch.tensor(batch.seq_episode), batch.share.sum(-1))
    assert torch.allclose(per_episode, torch.ones(8))
    assert [sum(1 for e in batch.seq_episode if e == k) for k in range(8)] == [1, 2, 3, 4] * 2
    # seq-mean-token-mean: a loss of 1 on every token of the 4-turn episodes and 0 elsewhere
    # gives 2 episodes of 8 = 0.25 (weighing sequences instead would give 8 of 20 = 0.4)
    loss = torch.tensor([[1.0 if batch.seq_episode[s] % 4 == 3 else 0.0] for s in range(len(batch.seq_episode))])
    loss = loss.expand_as(batch.share)
    assert float(aggregate(loss, batch.action_mask, "seq-mean-token-mean", batch.share)) == pytest.approx(0.25)


def test_entropy_builds_no_graph_when_it_is_only_logged(model, tokenizer, walk_pool):
    enc, episodes, batch = play(model, tokenizer, walk_pool, -1, "admissible")
    lp, ent, _ = policy_pass(model, batch, [0, 1], 1.0, with_entropy=True, entropy_grad=False)
    assert lp.requires_grad and not ent.requires_grad
    lp, ent, _ = policy_pass(model, batch, [0, 1], 1.0, with_entropy=True, entropy_grad=True)
    assert ent.requires_grad


def test_minibatches_pad_with_empty_ones_not_with_sequence_zero(monkeypatch):
    monkeypatch.setattr(rl_mod.dist, "all_max", lambda n, device=None: 4)  # another rank needs 4 minibatches
    mbs = rl_mod._minibatches(3, 2, random.Random(0), "cpu")
    assert len(mbs) == 4 and sorted(i for m in mbs for i in m) == [0, 1, 2] and [] in mbs


def test_rl_refuses_nucleus_sampling():
    with pytest.raises(ConfigError, match="rollout.top_p"):
        RolloutConfig(top_p=0.9)


def test_rollout_stats_count_failed_episodes_apart():
    from agentrecipe.envs.base import GameSpec
    from agentrecipe.rollout.episode import Episode
    from agentrecipe.train.rl import rollout_stats

    game = GameSpec(path="g", level="l", env="e", split="train", seed=0, max_score=2.0)
    won = Episode(game=game, action_ids=[[1], [2]], score_deltas=[1.0, 1.0], invalid=[False, True], won=True)
    lost = Episode(game=game, action_ids=[[1]], score_deltas=[0.0], invalid=[False], truncated=True, context_cut=True)
    failed = Episode(game=game, action_ids=[[1]], score_deltas=[0.0], invalid=[False], failed=True)
    stats = rollout_stats([won, lost, failed], [[0.0, 1.0], [0.0], [5.0]], [0, 0, 1], group_size=2)
    assert stats == {"rollout/success": 0.5, "rollout/return": 0.5, "rollout/score": 0.5, "rollout/turns": 1.5,
                     "rollout/invalid_rate": 1 / 3, "rollout/truncated": 0.5, "rollout/context_cut": 0.5,
                     "rollout/failed_episodes": 1.0, "rollout/episodes": 3.0,
                     "rollout/zero_variance_groups": 0.0}
