"""RL learning test: every algorithm raises the success of an untrained tiny policy."""

import pytest
import torch

from agentrecipe.agent.prompt import PromptEncoder, user_text
from agentrecipe.config import AgentConfig, DeepSpeedConfig, ModelConfig, RewardConfig, RLConfig, RolloutConfig
from agentrecipe.envs import registry
from agentrecipe.envs.pool import EnvPool
from agentrecipe.models.registry import build_tiny
from agentrecipe.models.tokenizer import train_tokenizer
from agentrecipe.rollout.engine import RolloutSettings, run_episodes
from agentrecipe.rollout.hf_backend import HFBackend
from agentrecipe.train.engine import unwrap
from agentrecipe.train.rl import RLRun, rl_train
from tests import cue_env
from tests.saved_bytes import SavedBytes

torch.set_num_threads(1)
# Games whose signs point east, then west: a policy that goes east with probability p on both turns
# wins p (1 - p) <= 1/4 of its sampled episodes; one that learned to follow the signs wins them all.
SEEDS = [s for s in range(200) if cue_env.signs(s) == ["east", "west"]][:8]
GAMES = cue_env.build_games("cue", "train", SEEDS, "", {})


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    env = cue_env.make_env({})
    texts = []
    for g in GAMES:
        o = env.reset(g)
        texts += [user_text(o, True, True), user_text(o, True, False), "go east", "go west", "You fall into a pit."]
    tok = train_tokenizer(texts * 4, 300)
    model = build_tiny(ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, seed=0), tok)
    out = tmp_path_factory.mktemp("policy")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture
def cue_pool(monkeypatch):
    monkeypatch.setitem(registry.FAMILIES, "cue", "tests.cue_env")
    with EnvPool("cue", {}, n_workers=0) as pool:
        yield pool


def greedy_success(model, tokenizer, pool, agent: AgentConfig) -> float:
    enc = PromptEncoder(tokenizer, agent.show_admissible, agent.history)
    backend = HFBackend(model, tokenizer.pad_token_id, tokenizer.eos_token_id)
    eps = run_episodes(GAMES, backend, enc, pool, RolloutSettings(max_turns=cue_env.TURNS + 1, temperature=0.0))
    return sum(ep.won for ep in eps) / len(eps)


@pytest.mark.slow
@pytest.mark.parametrize("algo,reward,history", [
    ("grpo", "sparse", 2), ("rloo", "sparse", -1), ("reinforce_pp", "sparse", 2), ("ppo", "sparse", -1),
    ("gigpo", "sparse", 2),
])
def test_each_algorithm_learns_to_follow_the_signs(algo, reward, history, policy_dir, cue_pool, tmp_path):
    from agentrecipe.models.registry import load_model

    agent = AgentConfig(history=history, max_context=512)
    rl = RLConfig(algo=algo, lr=3e-3, critic_lr=3e-3, group_size=1 if algo == "ppo" else 4,
                  games_per_step=16 if algo == "ppo" else 4, minibatch_size=16, update_epochs=2 if algo == "ppo" else 1,
                  gamma=0.95 if algo == "gigpo" else 1.0, discount="turn" if algo == "gigpo" else "token",
                  lam=0.95, checkpoint_every=1000, seed=0, whiten_advantages=algo == "ppo",  # as params/rl/*.yaml
                  kl_coef=0.01 if algo == "reinforce_pp" else 0.0, kl_in_reward=algo == "reinforce_pp")
    run = RLRun(rl=rl, reward=RewardConfig(mode=reward), agent=agent, rollout=RolloutConfig(max_turns=3),
                deepspeed=DeepSpeedConfig(), dtype="float32", levels=["cue"], n_steps=25, checkpoint_dir=tmp_path / "ckpt",
                fingerprint=algo)
    history_log = []
    actor, _, _ = rl_train(policy_dir, GAMES, run, cue_pool,
                           lambda m, t: HFBackend(m, t.pad_token_id, t.eos_token_id),
                           log=lambda step, stats: history_log.append(stats), progress=False,
                           valid_games=GAMES if algo == "grpo" else None)
    success = [s["rollout/success"] for s in history_log]
    assert len(success) == 25
    validated = [i + 1 for i, s in enumerate(history_log) if "valid/success" in s]
    assert validated == ([5, 10, 15, 20, 25] if algo == "grpo" else [])  # rl.eval_every = 5 and the last step
    if algo == "grpo":  # greedy on held-out games (here the train games): the last one equals greedy_success
        assert history_log[-1]["valid/success"] == 1.0 and history_log[-1]["valid/failed_episodes"] == 0
    if algo != "ppo":
        assert all(0 <= s["rollout/zero_variance_groups"] <= 1 for s in history_log)
    if algo == "gigpo":  # every group's rollouts start from the same sign: turn 0 always hits its anchor
        assert all(s["gigpo/anchor_hit_rate"] > 0 and s["gigpo/step_group_size"] >= 2 for s in history_log)
    first, last = success[0], sum(success[-5:]) / 5  # step 1 rolls out the untrained policy
    assert first <= 0.5, f"{algo}: the untrained policy already wins {first:.2f}"
    assert last >= 0.75 and last >= first + 0.3, f"{algo}: sampled success {first:.2f} -> {last:.2f}"
    # and the trained policy wins greedily
    assert greedy_success(unwrap(actor), load_model(policy_dir)[1], cue_pool, agent) == 1.0


def test_keep_best_keeps_the_best_validated_model(policy_dir, cue_pool, tmp_path):
    from agentrecipe.models.registry import load_model
    from agentrecipe.train.checkpoint import BEST_DIR, read_best

    agent = AgentConfig(history=2, max_context=512)
    rl = RLConfig(algo="grpo", lr=3e-3, group_size=4, games_per_step=4, minibatch_size=16, checkpoint_every=1000,
                  eval_every=2, keep_best=True, seed=0)
    run = RLRun(rl=rl, reward=RewardConfig(), agent=agent, rollout=RolloutConfig(max_turns=3), deepspeed=DeepSpeedConfig(),
                dtype="float32",
                levels=["cue"], n_steps=8, checkpoint_dir=tmp_path / "ckpt", fingerprint="best")
    log = []
    rl_train(policy_dir, GAMES, run, cue_pool, lambda m, t: HFBackend(m, t.pad_token_id, t.eos_token_id),
             log=lambda step, stats: log.append(stats), progress=False, valid_games=GAMES)
    validated = [(i + 1, s["valid/success"], s["valid/score"]) for i, s in enumerate(log) if "valid/success" in s]
    assert [v[0] for v in validated] == [2, 4, 6, 8]
    top = max((v[1], v[2]) for v in validated)
    want = next(v for v in validated if (v[1], v[2]) == top)  # the earliest of the best
    best = read_best(tmp_path / "ckpt")
    assert best == {"step": want[0], "valid/success": want[1], "valid/score": want[2]}
    assert log[-1]["valid/best_step"] == want[0]
    # the kept weights are the validated ones: greedy success on the valid games is reproduced
    model, tok = load_model(tmp_path / "ckpt" / BEST_DIR)
    assert greedy_success(model, tok, cue_pool, agent) == want[1]


@pytest.mark.parametrize("skip", [True, False])
def test_a_minibatch_without_gradient_takes_no_optimizer_step(skip, policy_dir, cue_pool, tmp_path):
    """Steps 4-6 play one turn of two-turn games (turn schedule [3, 1]): every rollout gets sparse
    reward 0, every advantage is 0 and the policy loss has no gradient. Its optimizer steps are
    skipped and the weights stay where step 3 left them; taken (the option off), Adam's momentum
    from steps 1-3 still moves them."""
    agent = AgentConfig(history=2, max_context=512)
    rl = RLConfig(algo="grpo", lr=3e-3, group_size=4, games_per_step=4, minibatch_size=8, checkpoint_every=1000,
                  turn_schedule=[3, 1], turn_schedule_every=3, seed=0, skip_zero_gradient_steps=skip)
    run = RLRun(rl=rl, reward=RewardConfig(mode="sparse"), agent=agent, rollout=RolloutConfig(max_turns=3),
                deepspeed=DeepSpeedConfig(), dtype="float32", levels=["cue"], n_steps=6,
                checkpoint_dir=tmp_path / "ckpt", fingerprint=f"skip-{skip}")
    policy, log = [], []

    def make_backend(model, tok):  # the HF backend samples with the actor's own module
        policy.append((model, [p.detach().clone() for p in model.parameters()]))
        return HFBackend(model, tok.pad_token_id, tok.eos_token_id)

    def snapshot(step, stats):
        log.append((stats, [p.detach().clone() for p in policy[0][0].parameters()]))

    rl_train(policy_dir, GAMES, run, cue_pool, make_backend, log=snapshot, progress=False)
    moved = lambda a, b: any(not torch.equal(x, y) for x, y in zip(a, b))  # noqa: E731
    stats, weights = [s for s, _ in log], [w for _, w in log]
    assert [s["schedule/max_turns"] for s in stats] == [3, 3, 3, 1, 1, 1]
    assert any(s["rollout/zero_variance_groups"] < 1 for s in stats[:3]) and moved(policy[0][1], weights[2])
    assert all(s["rollout/success"] == 0 and s["rollout/zero_variance_groups"] == 1 for s in stats[3:])
    if skip:
        assert [s["losses/skipped_steps"] for s in stats[3:]] == [1.0, 1.0, 1.0]
        assert not any(moved(weights[2], w) for w in weights[3:])
    else:
        assert [s["losses/skipped_steps"] for s in stats] == [0.0] * 6
        assert moved(weights[2], weights[3]) and moved(weights[4], weights[5])


def test_target_kl_stops_a_steps_updates_once_a_minibatch_passes_it(policy_dir, cue_pool, tmp_path):
    """Two PPO epochs of several minibatches at a large lr: without target_kl every planned minibatch
    steps; with it, a step stops after the first minibatch whose approx_kl (before its own optimizer
    step) passes target_kl, and the policy moves less."""
    agent = AgentConfig(history=2, max_context=512)
    logs, weights = {}, {}
    for target in (None, 0.02):
        rl = RLConfig(algo="ppo", lr=3e-3, group_size=1, games_per_step=8, update_epochs=2, minibatch_size=4,
                      checkpoint_every=1000, seed=0, target_kl=target)
        run = RLRun(rl=rl, reward=RewardConfig(), agent=agent, rollout=RolloutConfig(max_turns=3),
                    deepspeed=DeepSpeedConfig(), dtype="float32", levels=["cue"], n_steps=1,
                    checkpoint_dir=tmp_path / str(target), fingerprint=f"target-kl-{target}")
        policy, log = [], []

        def make_backend(model, tok, policy=policy):
            policy.append((model, [p.detach().clone() for p in model.parameters()]))
            return HFBackend(model, tok.pad_token_id, tok.eos_token_id)

        rl_train(policy_dir, GAMES, run, cue_pool, make_backend, log=lambda step, stats, log=log: log.append(stats),
                 progress=False)
        (model, start), = policy
        logs[target] = log[0]
        weights[target] = sum(float((p.detach() - s).norm() ** 2) for p, s in zip(model.parameters(), start)) ** 0.5
    full, stopped = logs[None], logs[0.02]
    assert full["losses/early_stopped"] == 0.0 and full["losses/approx_kl"] > 0.02  # lr 3e-3 moves it far
    assert 0.0 < stopped["losses/early_stopped"] < 1.0  # the first minibatch always steps
    assert 0.0 < weights[0.02] < weights[None]


def test_target_kl_must_be_positive_or_null():
    from agentrecipe.config import ConfigError

    assert RLConfig(algo="ppo", target_kl=None).target_kl is None
    with pytest.raises(ConfigError, match="rl.target_kl"):
        RLConfig(algo="ppo", target_kl=0.0)


def test_has_gradient_needs_a_nonzero_advantage_at_an_action_token_or_a_kl_or_entropy_term():
    from agentrecipe.train.rl import has_gradient

    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    zero, off_action = torch.zeros(1, 4), torch.tensor([[2.0, 0.0, 0.0, -1.0]])
    grpo = RLConfig(algo="grpo")
    assert not has_gradient(zero, mask, grpo, with_ref=False)
    assert not has_gradient(off_action, mask, grpo, with_ref=False)  # advantages outside the action tokens
    assert has_gradient(torch.tensor([[0.0, 0.0, -0.5, 0.0]]), mask, grpo, with_ref=False)
    assert has_gradient(zero, mask, RLConfig(algo="grpo", entropy_coef=0.01), with_ref=False)
    kl_loss = RLConfig(algo="grpo", kl_coef=0.05, kl_in_reward=False)
    assert has_gradient(zero, mask, kl_loss, with_ref=True)
    assert not has_gradient(zero, mask, RLConfig(algo="grpo", kl_coef=0.05, kl_in_reward=True), with_ref=True)


class RecomputingBackend(HFBackend):
    """The HF backend, declared inexact (as vLLM is): RL recomputes pi_old's log-probs."""

    exact_logprobs = False


def test_old_logprobs_are_the_rollouts_when_the_policy_sampled_them(policy_dir, cue_pool, tmp_path):
    """The HF backend samples with the policy's own fp32 weights: its log-probs serve as pi_old and no
    pass recomputes them (about one policy pass per step instead of two); the update is the same one a
    recomputing run makes, to float rounding, and the mismatch stays logged (first minibatch)."""
    agent = AgentConfig(history=2, max_context=512)
    rl = RLConfig(algo="grpo", lr=3e-3, group_size=4, games_per_step=4, minibatch_size=8, checkpoint_every=1000, seed=0)
    logs = {}
    for name, backend in (("rollout", HFBackend), ("recompute", RecomputingBackend)):
        run = RLRun(rl=rl, reward=RewardConfig(), agent=agent, rollout=RolloutConfig(max_turns=3),
                    deepspeed=DeepSpeedConfig(), dtype="float32", levels=["cue"], n_steps=2,
                    checkpoint_dir=tmp_path / name, fingerprint=name)
        logs[name] = []
        rl_train(policy_dir, GAMES, run, cue_pool, lambda m, t, b=backend: b(m, t.pad_token_id, t.eos_token_id),
                 log=lambda step, stats, n=name: logs[n].append(stats), progress=False)
    for fast, slow in zip(logs["rollout"], logs["recompute"]):
        assert fast["rollout/success"] == slow["rollout/success"]  # the same episodes
        assert fast["losses/policy"] == pytest.approx(slow["losses/policy"], abs=1e-5)
        assert fast["rollout/logprob_mismatch"] < 1e-5 and slow["rollout/logprob_mismatch"] < 1e-5
        # several minibatches a step: recomputing forwards all but the first one twice
        assert fast["perf/policy_forwarded_per_action_token"] < 0.75 * slow["perf/policy_forwarded_per_action_token"]


def test_gradient_checkpointing_makes_the_same_ppo_updates(policy_dir, cue_pool, tmp_path, monkeypatch):
    """deepspeed.gradient_checkpointing through the trainer: the policy's and the critic's update passes
    recompute their layers in backward (autograd keeps far fewer bytes for them), and two PPO steps
    log the losses of a run without it."""
    from agentrecipe.train import rl as rl_mod

    kept = {False: SavedBytes(), True: SavedBytes()}  # what autograd keeps for the update passes, per run

    def counted(fn, run):
        def wrapper(*args, **kwargs):
            if not torch.is_grad_enabled():  # old log-probs, values: nothing kept
                return fn(*args, **kwargs)
            with kept[run]:
                return fn(*args, **kwargs)
        return wrapper

    agent = AgentConfig(history=2, max_context=512)
    rl = RLConfig(algo="ppo", lr=3e-3, group_size=4, games_per_step=4, minibatch_size=8, checkpoint_every=1000, seed=0)
    logs, passes = {}, (rl_mod.policy_pass, rl_mod.value_pass)
    for recompute in (False, True):
        monkeypatch.setattr(rl_mod, "policy_pass", counted(passes[0], recompute))
        monkeypatch.setattr(rl_mod, "value_pass", counted(passes[1], recompute))
        run = RLRun(rl=rl, reward=RewardConfig(), agent=agent, rollout=RolloutConfig(max_turns=3),
                    deepspeed=DeepSpeedConfig(gradient_checkpointing=recompute), dtype="float32", levels=["cue"],
                    n_steps=2, checkpoint_dir=tmp_path / str(recompute), fingerprint=str(recompute))
        logs[recompute] = []
        rl_train(policy_dir, GAMES, run, cue_pool, lambda m, t: HFBackend(m, t.pad_token_id, t.eos_token_id),
                 log=lambda step, stats, r=recompute: logs[r].append(stats), progress=False)
    assert kept[True].total < 0.5 * kept[False].total, (kept[False].total, kept[True].total)
    for plain, ckpt in zip(logs[False], logs[True], strict=True):
        assert plain["rollout/success"] == ckpt["rollout/success"]  # the same episodes: the same weights before
        for key in ("losses/policy", "losses/value"):
            assert plain[key] == pytest.approx(ckpt[key], abs=1e-5), key


def test_is_better_prefers_success_then_score_and_keeps_the_earlier_on_a_tie():
    from agentrecipe.train.checkpoint import is_better

    best = {"step": 4, "valid/success": 0.5, "valid/score": 0.6}
    assert is_better({"valid/success": 0.5, "valid/score": 0.7}, best)
    assert is_better({"valid/success": 0.6, "valid/score": 0.0}, best)
    assert not is_better({"valid/success": 0.5, "valid/score": 0.6}, best)
    assert not is_better({"valid/success": 0.4, "valid/score": 1.0}, best)
    assert is_better({"valid/success": 0.0, "valid/score": 0.0}, None)


def test_one_seed_gives_the_same_weights_twice_and_another_seed_other_weights(policy_dir, monkeypatch, tmp_path):
    """A sweep's `seed` axis stands for one run per seed: rerunning a seed on one machine (PPO, with
    its critic, environments in two worker processes) reproduces every weight bit for bit."""
    monkeypatch.setitem(registry.FAMILIES, "cue", "tests.cue_env")

    def weights(seed: int, name: str) -> list[torch.Tensor]:
        rl = RLConfig(algo="ppo", lr=3e-3, critic_lr=3e-3, group_size=1, games_per_step=8, minibatch_size=4,
                      update_epochs=2, whiten_advantages=True, checkpoint_every=1000, seed=seed)
        run = RLRun(rl=rl, reward=RewardConfig(mode="sparse"), agent=AgentConfig(history=2, max_context=512),
                    rollout=RolloutConfig(max_turns=3), deepspeed=DeepSpeedConfig(), dtype="float32", levels=["cue"],
                    n_steps=3, checkpoint_dir=tmp_path / name, fingerprint=name)
        with EnvPool("cue", {}, n_workers=2) as pool:
            actor, _, _ = rl_train(policy_dir, GAMES, run, pool, lambda m, t: HFBackend(m, t.pad_token_id, t.eos_token_id),
                                   log=lambda step, stats: None, progress=False)
        return [p.detach().clone() for p in unwrap(actor).parameters()]

    first, again, other = weights(0, "first"), weights(0, "again"), weights(1, "other")
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_ranks_play_distinct_games_in_a_step_and_one_rank_draws_as_before():
    """Before, each rank drew its games on its own: 8 ranks of 4 games out of 60 played 24-26
    distinct games of 32 in a step, though the docstring said different games per rank."""
    import random

    from agentrecipe.envs.base import GameSpec
    from agentrecipe.train.rl import draw_games

    games = [GameSpec(path=f"g{i}", level="l", env="fake", seed=i) for i in range(60)]
    for step in range(5):
        shares = [draw_games(games, 4, 0, step, r, 8)[0] for r in range(8)]
        assert len({g.path for share in shares for g in share}) == 32
        assert shares == [draw_games(games, 4, 0, step, r, 8)[0] for r in range(8)]  # a resumed run replays it
    one, rng = draw_games(games, 4, 0, 3, 0, 1)
    old = random.Random("0-3-0")  # one rank: the same games and the same further draws as before
    assert one == old.sample(games, 4) and rng.random() == old.random()
    few = [draw_games(games[:6], 4, 0, 3, r, 2)[0] for r in range(2)]  # fewer than 8: each rank its own 4
    assert all(len({g.path for g in share}) == 4 for share in few)
