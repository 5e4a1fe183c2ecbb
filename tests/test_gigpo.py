"""GiGPO step-level credit, anchor states, zero-variance groups and DAPO dynamic sampling
against hand-computed numbers (arithmetic in comments)."""

from pathlib import Path

import pytest
import torch

from agentrecipe.algos import compute_advantages, gigpo_advantages, step_group_stats, zero_variance_fraction
from agentrecipe.config import ConfigError, RLConfig, parse_config
from agentrecipe.envs.base import GameSpec, Observation
from agentrecipe.params import compose
from agentrecipe.rollout.episode import Episode
from agentrecipe.train.anchors import anchor_ids
from agentrecipe.train.dynamic_sampling import dynamic_sampling
from tests.test_rl import GAMES, cue_pool, policy_dir  # noqa: F401  (fixtures)

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


def approx(x, **kw):
    return pytest.approx(x, abs=1e-4, **kw)


# Group A (id 3): three episodes of one game, two turns each, sparse reward on a win.
#   ep0: s0 -> s1 -> won   rewards (0, 1)   anchors (0, 1)
#   ep1: s0 -> s2 -> lost  rewards (0, 0)   anchors (0, 2)
#   ep2: s0 -> s1 -> lost  rewards (0, 0)   anchors (0, 1)
# Group B (id 9): one episode, one turn, won: rewards (1, pad), anchors (0, pad) -- the same
#   anchor id as group A's s0, but step groups never cross games.
# Per-turn returns with gamma 0.5 once per turn: ep0 (0.5, 1), ep1 (0, 0), ep2 (0, 0), ep3 (1, -).
R = torch.tensor([1.0, 0.0, 0.0, 1.0])
G = torch.tensor([[0.5, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
TURN_MASK = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 0]], dtype=torch.bool)
GROUPS = torch.tensor([3, 3, 3, 9])
ANCHORS = torch.tensor([[0, 1], [0, 2], [0, 1], [0, -1]])


def test_gigpo_advantages_std_norm_and_weights():
    # Episode term, group A: R = {1, 0, 0}, mean 1/3, deviations 2/3, -1/3, -1/3,
    #   sample var (4/9 + 1/9 + 1/9) / 2 = 1/3, std 0.57735 -> A^E = 1.1547, -0.57735, -0.57735
    #   group B has one episode -> A^E = 0
    # Step term: (A, s0) = turns (0,0), (1,0), (2,0), G = {0.5, 0, 0}: mean 1/6, dev 1/3, -1/6, -1/6,
    #   sample var (1/9 + 2/36) / 2 = 1/12, std 0.288675 -> 1.1547, -0.57735, -0.57735
    #   (A, s1) = turns (0,1), (2,1), G = {1, 0}: dev +-0.5, sample var 0.5, std 0.70711 -> +-0.70711
    #   (A, s2) = turn (1,1) alone -> 0;  (B, s0) alone -> 0
    # w_E = 1, w_S = 2:
    #   ep0: 1.1547 + 2*1.1547 = 3.4641;       1.1547 + 2*0.70711 = 2.56892
    #   ep1: -0.57735 + 2*(-0.57735) = -1.73205; -0.57735 + 0 = -0.57735
    #   ep2: -1.73205;                         -0.57735 + 2*(-0.70711) = -1.99157
    #   ep3: 0; padded turn 0
    adv = gigpo_advantages(R, G, TURN_MASK, GROUPS, ANCHORS, episode_weight=1.0, step_weight=2.0, norm="std", eps=1e-12)
    assert adv.tolist() == [approx([3.4641, 2.56892]), approx([-1.73205, -0.57735]),
                            approx([-1.73205, -1.99157]), approx([0.0, 0.0])]


def test_gigpo_advantages_mean_norm():
    # norm none (F_norm = 1): A^E = R - mean = 2/3, -1/3, -1/3, 0;
    #   step: (A, s0) 0.5 - 1/6 = 1/3, -1/6, -1/6;  (A, s1) +-0.5;  singletons 0
    #   ep0: 2/3 + 1/3 = 1, 2/3 + 0.5 = 7/6;  ep1: -1/3 - 1/6 = -0.5, -1/3;  ep2: -0.5, -1/3 - 0.5 = -5/6
    adv = gigpo_advantages(R, G, TURN_MASK, GROUPS, ANCHORS)  # norm="none" is the default
    assert adv.tolist() == [approx([1.0, 7 / 6]), approx([-0.5, -1 / 3]), approx([-0.5, -5 / 6]), approx([0.0, 0.0])]
    with pytest.raises(ValueError, match="must match"):
        gigpo_advantages(R, G, TURN_MASK, GROUPS, ANCHORS[:, :1])


def test_step_group_stats_and_zero_variance_fraction():
    # 7 real turns; step groups (A,s0) 3 turns, (A,s1) 2, (A,s2) 1, (B,s0) 1
    #   hit rate: 5 of 7 turns share their step group;  mean size 7 / 4 = 1.75
    s = step_group_stats(GROUPS, ANCHORS, TURN_MASK)
    assert s == {"gigpo/anchor_hit_rate": approx(5 / 7), "gigpo/step_group_size": approx(1.75)}
    # group A's returns differ, group B (one episode) has no signal -> 1 of 2 groups
    assert zero_variance_fraction(R, GROUPS) == 0.5
    assert zero_variance_fraction(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1])) == 1.0


def test_compute_advantages_gigpo_on_token_layout():
    # One group, two episodes with the MASK layout of test_advantages: actions at 2,3 (turn 0) and 7,8 (turn 1).
    # ep0 rewards (0, 1), ep1 (0, 0); both start from s0, then ep0 -> s1, ep1 -> s2.
    # gamma 0.5, discount turn: G(ep0) = (0.5, 1), G(ep1) = (0, 0); R = (1, 0)
    # norm none (the default): A^E = R - mean = +-0.5
    # step (s0): G {0.5, 0}, mean 0.25 -> +-0.25; (s1), (s2) single -> 0
    # ep0: 0.5 + 0.25 = 0.75 on turn 0, 0.5 on turn 1; ep1: -0.75, -0.5
    # norm std: A^E = +-0.5 / 0.70711 = +-0.70711, step (s0) +-0.70711 -> ep0 1.41421, 0.70711
    mask = torch.tensor([[0, 0, 1, 1, 0, 0, 0, 1, 1, 0]], dtype=torch.bool).repeat(2, 1)
    tids = torch.tensor([[-1, -1, 0, 0, -1, -1, -1, 1, 1, -1]]).repeat(2, 1)
    b = dict(turn_rewards=torch.tensor([[0.0, 1.0], [0.0, 0.0]]), turn_mask=torch.ones(2, 2, dtype=torch.bool),
             action_mask=mask, turn_ids=tids, group_ids=torch.tensor([0, 0]))
    cfg = RLConfig(algo="gigpo", gamma=0.5, discount="turn")
    adv, ret = compute_advantages("gigpo", **b, cfg=cfg, anchor_ids=torch.tensor([[0, 1], [0, 2]]))
    assert ret is None
    assert adv[0].tolist() == approx([0, 0, 0.75, 0.75, 0, 0, 0, 0.5, 0.5, 0])
    assert adv[1].tolist() == approx([0, 0, -0.75, -0.75, 0, 0, 0, -0.5, -0.5, 0])
    cfg = RLConfig(algo="gigpo", gamma=0.5, discount="turn", gigpo_norm="std")
    adv, _ = compute_advantages("gigpo", **b, cfg=cfg, anchor_ids=torch.tensor([[0, 1], [0, 2]]))
    a, c = 1.41421, 0.70711
    assert adv[0].tolist() == approx([0, 0, a, a, 0, 0, 0, c, c, 0])
    with pytest.raises(ValueError, match="anchor_ids"):
        compute_advantages("gigpo", **b, cfg=cfg)


# ------------------------------------------------------------------ anchors
def _obs(text, commands=("go east", "go west")):
    return Observation(text=text, objective="Follow the signs.", admissible_commands=commands, score=0.0, max_score=2.0)


def _episode(texts, n_turns, won=False, failed=False, game=None):
    ep = Episode(game=game or GameSpec(path="g", level="cue", env="cue", split="train", seed=0, max_score=2.0))
    ep.observations = [_obs(t) for t in texts]
    ep.action_ids = [[1]] * n_turns
    ep.score_deltas = [0.0] * (n_turns - 1) + [1.0 if won else 0.0]
    ep.won, ep.failed = won, failed
    return ep


def test_anchor_ids_from_observation_text_and_commands():
    eps = [
        _episode(["A sign points east.", "A sign points west.", "You made it!"], 2),
        _episode(["A sign points east.", "You fall into a pit."], 1),
        _episode(["A sign points east.", "A sign points west."], 2),  # truncated after 2 turns
    ]
    eps[2].observations[1] = _obs("A sign points west.", ("go east",))  # same text, other commands: another state
    # keys in order of first sight: (east, both) 0, (west, both) 1, (west, east only) 2; the final
    # observation after the last turn is no turn's anchor; padded turns -1
    assert anchor_ids(eps).tolist() == [[0, 1], [0, -1], [0, 2]]


def test_a_turn_after_an_invalid_command_keeps_the_anchor_of_the_state_it_did_not_leave():
    """Two rollouts in different states both send an invalid command and read the same refusal:
    before, the two next turns shared one anchor (unrelated states in one step group) and the turn
    that really started from state B had another id than B's first visit."""
    near = _episode(["A sign points east.", "A sign points west.", "Nothing happens.", "You made it!"], 3)
    far = _episode(["A sign points east.", "A sign points north.", "Nothing happens.", "A sign points west."], 3)
    near.invalid, far.invalid = [False, True, False], [False, True, False]
    # keys: east 0, west 1, north 2; turn 2 of each starts where its turn 1 did
    assert anchor_ids([near, far]).tolist() == [[0, 1, 1], [0, 2, 2]]
    near.invalid = [False, False, False]  # a valid command that reads "Nothing happens." is a state of its own
    assert anchor_ids([near, far]).tolist() == [[0, 1, 2], [0, 3, 3]]  # ids in order of first sight


# --------------------------------------------------------- dynamic sampling
def test_dynamic_sampling_replaces_zero_variance_groups_until_the_batch_is_full():
    games = [GameSpec(path=f"g{i}", level="cue", env="cue", split="train", seed=i, max_score=1.0) for i in range(6)]
    # game seeds 0, 2, 4 are all-win (no signal), odd ones half-win
    def play(gs, round_):
        return [_episode(["s", "t"], 1, won=(g.seed % 2 == 0) or k % 2 == 0, game=g) for k, g in enumerate(gs)]

    draws = iter([games[2:4], games[4:6]])
    out = dynamic_sampling(play, games[:2], lambda k: next(draws)[:k], group_size=2, max_extra_games=8,
                           episode_return=lambda ep: float(ep.won))
    # round 0: g0 dropped, g1 kept; round 1 (2 new games): g2 dropped, g3 kept -> 2 informative groups
    assert [ep.game.seed for ep in out.episodes] == [1, 1, 3, 3]
    assert out.group_of == [0, 0, 1, 1]
    assert out.stats == {"dapo/dropped_groups": 2.0, "dapo/extra_games": 2.0, "dapo/topped_up_groups": 0.0}
    # every episode played, dropped groups included, for the step's rollout/* metrics
    assert [ep.game.seed for ep in out.played] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert out.played_group_of == [0, 0, 1, 1, 2, 2, 3, 3]


def test_dynamic_sampling_cap_tops_up_with_zero_variance_groups():
    games = [GameSpec(path=f"g{i}", level="cue", env="cue", split="train", seed=2 * i, max_score=1.0) for i in range(4)]
    play = lambda gs, round_: [_episode(["s"], 1, won=True, game=g) for g in gs]  # noqa: E731  never any signal
    rounds = []
    draw = lambda k: (rounds.append(k), games[2 : 2 + k])[1]  # noqa: E731
    out = dynamic_sampling(play, games[:2], draw, group_size=3, max_extra_games=1, episode_return=lambda ep: 1.0)
    # cap 1: one extra round of 1 game; nothing informative -> the first two zero-variance groups are kept
    assert rounds == [1]
    assert [ep.game.seed for ep in out.episodes] == [0, 0, 0, 2, 2, 2] and out.group_of == [0, 0, 0, 1, 1, 1]
    assert out.stats == {"dapo/dropped_groups": 1.0, "dapo/extra_games": 1.0, "dapo/topped_up_groups": 2.0}


# ------------------------------------------------------------------ config
def test_rl_gigpo_params_compose_and_validate():
    rl = parse_config(compose(ROOT / "params", ["rl=gigpo"]))["rl"]
    assert (rl.algo, rl.discount, rl.gamma, rl.gigpo_norm) == ("gigpo", "turn", 0.95, "none")
    assert parse_config(compose(ROOT / "params", ["rl=ppo"]))["rl"].whiten_advantages is True


@pytest.mark.parametrize("kwargs,key", [
    (dict(algo="gigpo", group_size=1), "rl.group_size"),
    (dict(algo="gigpo", turn_level_returns=True), "rl.turn_level_returns"),
    (dict(algo="grpo", whiten_advantages=True), "rl.whiten_advantages"),
    (dict(algo="ppo", group_size=1, dynamic_sampling=True), "rl.dynamic_sampling"),
    # Dynamic sampling drops groups of equal episode returns; these estimators learn from them.
    (dict(algo="gigpo", gamma=0.95, discount="turn", dynamic_sampling=True), "rl.dynamic_sampling"),
    (dict(algo="grpo", turn_level_returns=True, dynamic_sampling=True), "rl.dynamic_sampling"),
    (dict(algo="reinforce_pp", dynamic_sampling=True), "rl.dynamic_sampling"),
    # ... and with a KL penalty in the reward, equal task returns still leave per-episode advantages
    (dict(algo="grpo", dynamic_sampling=True, kl_in_reward=True, kl_coef=0.1, kl_estimator="k1"), "rl.dynamic_sampling"),
    (dict(kl_coef=-0.05), "rl.kl_coef"),
    (dict(kl_coef=0.01, kl_estimator="k1", kl_in_reward=False), "rl.kl_estimator"),  # zero expected gradient
    (dict(algo="ppo", group_size=1, critic_lr=0.0), "rl.critic_lr"),
    (dict(algo="ppo", group_size=1, vf_coef=-0.5), "rl.critic_lr"),
    (dict(algo="grpo", bootstrap_truncated=True), "rl.bootstrap_truncated"),
    (dict(algo="rloo", gamma=0.5), "rl.gamma"),  # R = sum of rewards: gamma would do nothing
])
def test_rl_config_refuses_meaningless_combinations(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        RLConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(algo="grpo", dynamic_sampling=True), dict(algo="rloo", dynamic_sampling=True),
    dict(algo="rloo", dynamic_sampling=True, kl_coef=0.1, kl_estimator="k3", kl_in_reward=False),  # KL in the loss
    dict(algo="reinforce_pp", kl_coef=0.01, kl_estimator="k1", kl_in_reward=True),
    dict(kl_coef=0.01, kl_estimator="k3", kl_in_reward=False),
    dict(algo="grpo", gamma=0.9, turn_level_returns=True), dict(algo="ppo", group_size=1, bootstrap_truncated=True),
])
def test_rl_config_accepts_the_meaningful_neighbours(kwargs):
    RLConfig(**kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["gigpo", "grpo"])
def test_rl_train_logs_gigpo_and_dynamic_sampling_stats(algo, policy_dir, cue_pool, tmp_path):  # noqa: F811
    from agentrecipe.config import AgentConfig, DeepSpeedConfig, RewardConfig, RolloutConfig
    from agentrecipe.rollout.hf_backend import HFBackend
    from agentrecipe.train.rl import RLRun, rl_train

    knobs = dict(gamma=0.95, discount="turn") if algo == "gigpo" else dict(dynamic_sampling=True, dynamic_sampling_max_games=2)
    rl = RLConfig(algo=algo, lr=3e-3, group_size=4, games_per_step=2, minibatch_size=16, checkpoint_every=1000, seed=0,
                  **knobs)
    run = RLRun(rl=rl, reward=RewardConfig(mode="sparse"), agent=AgentConfig(history=2, max_context=512),
                rollout=RolloutConfig(max_turns=3), deepspeed=DeepSpeedConfig(), dtype="float32", levels=["cue"], n_steps=2,
                checkpoint_dir=tmp_path / "ckpt", fingerprint=algo)
    log = []
    rl_train(policy_dir, GAMES, run, cue_pool, lambda m, t: HFBackend(m, t.pad_token_id, t.eos_token_id),
             log=lambda step, stats: log.append(stats), progress=False)
    assert len(log) == 2
    for s in log:
        assert 0 <= s["rollout/zero_variance_groups"] <= 1
        if algo == "gigpo":
            assert 0 < s["gigpo/anchor_hit_rate"] <= 1 and s["gigpo/step_group_size"] >= 1
            assert s["rollout/episodes"] == 8
            continue
        assert 0 <= s["dapo/extra_games"] <= 2 and s["dapo/dropped_groups"] >= 0
        assert s["dapo/topped_up_groups"] <= 2
        # rollout/* covers every episode played, the dropped groups' too
        assert s["rollout/episodes"] == 4 * (2 + s["dapo/extra_games"])
