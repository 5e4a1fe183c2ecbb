"""Advantage estimators against hand-computed numbers (arithmetic in comments)."""

import typing

import pytest
import torch

from agentrecipe.algos import (
    ADVANTAGE_FNS,
    add_kl_penalty,
    broadcast_to_tokens,
    compute_advantages,
    grpo_advantages,
    masked_gae,
    reinforce_pp_advantages,
    rloo_advantages,
    token_rewards,
    turn_level_returns,
    turn_sums,
)
from agentrecipe.config import RLConfig

torch.set_num_threads(1)


def approx(x, **kw):
    return pytest.approx(x, abs=1e-5, **kw)


# One multi-turn sequence, T = 10:
#   pos:   0  1 | 2  3 | 4  5  6 | 7  8 | 9
#   role:  prompt| act0 | obs     | act1 | pad
MASK = torch.tensor([[0, 0, 1, 1, 0, 0, 0, 1, 1, 0]], dtype=torch.bool)
TURN_IDS = torch.tensor([[-1, -1, 0, 0, -1, -1, -1, 1, 1, -1]])
TURN_REWARDS = torch.tensor([[0.5, 1.0, 7.0]])  # 3rd turn is padding (turn_mask 0)
TURN_MASK = torch.tensor([[1, 1, 0]], dtype=torch.bool)
# Values at non-action positions are garbage (9.0): they must never be used.
VALUES = torch.tensor([[9.0, 9.0, 0.1, 0.2, 9.0, 9.0, 9.0, 0.3, 0.4, 9.0]])


def test_token_rewards_on_last_action_token_of_each_turn():
    r = token_rewards(TURN_REWARDS, TURN_MASK, MASK, TURN_IDS)
    # turn 0 ends at pos 3, turn 1 at pos 8; the padded turn (7.0) is dropped.
    assert r.tolist() == [[0, 0, 0, 0.5, 0, 0, 0, 0, 1.0, 0]]


def test_token_rewards_batched_and_missing_turn_raises():
    mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1]], dtype=torch.bool)
    tids = torch.tensor([[0, 0, -1, 1], [-1, 0, 1, 1]])
    tr = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    r = token_rewards(tr, torch.ones(2, 2, dtype=torch.bool), mask, tids)
    assert r.tolist() == [[0, 1.0, 0, 2.0], [0, 3.0, 0, 4.0]]
    with pytest.raises(ValueError, match="turn 1 of sequence 0"):
        token_rewards(tr, torch.ones(2, 2, dtype=torch.bool), mask, torch.tensor([[0, 0, -1, 0], [-1, 0, 1, 1]]))


def test_masked_gae_skips_environment_tokens():
    r = token_rewards(TURN_REWARDS, TURN_MASK, MASK, TURN_IDS)
    adv, ret = masked_gae(r, VALUES, MASK, gamma=0.9, lam=0.8)
    # gamma * lam = 0.72; walk the action tokens backwards: 8, 7, 3, 2.
    # t=8 (last): delta = 1.0 + 0.9*0   - 0.4 = 0.6            A = 0.6
    # t=7:        delta = 0   + 0.9*0.4 - 0.3 = 0.06           A = 0.06 + 0.72*0.6     = 0.492
    # t=3: next action token is 7 (obs 4..6 skipped)
    #             delta = 0.5 + 0.9*0.3 - 0.2 = 0.57           A = 0.57 + 0.72*0.492   = 0.92424
    # t=2:        delta = 0   + 0.9*0.2 - 0.1 = 0.08           A = 0.08 + 0.72*0.92424 = 0.7454528
    expected_adv = [0, 0, 0.7454528, 0.92424, 0, 0, 0, 0.492, 0.6, 0]
    # R = A + V on action tokens: 0.8454528, 1.12424, 0.792, 1.0
    expected_ret = [0, 0, 0.8454528, 1.12424, 0, 0, 0, 0.792, 1.0, 0]
    assert adv[0].tolist() == approx(expected_adv)
    assert ret[0].tolist() == approx(expected_ret)


def test_masked_gae_rows_independent_and_lam1_is_mc_return():
    # Row 1 is row 0 shifted right by one; with V = 0, lam = 1, gamma = 0.5:
    # A = returns-to-go over action tokens: t8: 1, t7: 0.5, t3: 0.5 + 0.5*0.5 = 0.75, t2: 0.375
    mask = torch.cat([MASK, MASK.roll(1, dims=1)])
    r0 = token_rewards(TURN_REWARDS, TURN_MASK, MASK, TURN_IDS)
    r = torch.cat([r0, r0.roll(1, dims=1)])
    adv, ret = masked_gae(r, torch.zeros_like(r), mask, gamma=0.5, lam=1.0)
    expected = [0, 0, 0.375, 0.75, 0, 0, 0, 0.5, 1.0, 0]
    assert adv[0].tolist() == approx(expected)
    assert adv[1].tolist() == approx([0] + expected[:-1])
    assert torch.equal(adv, ret)
    assert not adv.requires_grad


def test_grpo_advantages():
    # group 0 = {1, 0, 0, 0}: mean 0.25, deviations 0.75, -0.25 x3,
    #   sample var = (0.5625 + 3*0.0625) / 3 = 0.25, std 0.5 -> A = 1.5, -0.5, -0.5, -0.5
    # group 7 = {2, 2}: std 0 -> A = 0 / eps = 0
    returns = torch.tensor([1.0, 2.0, 0.0, 0.0, 2.0, 0.0])
    groups = torch.tensor([0, 7, 0, 0, 7, 0])
    adv = grpo_advantages(returns, groups, eps=0.0 + 1e-12)
    assert adv.tolist() == approx([1.5, 0.0, -0.5, -0.5, 0.0, -0.5])
    # a group of one gets 0
    assert grpo_advantages(torch.tensor([3.0]), torch.tensor([0])).tolist() == [0.0]


def test_rloo_advantages():
    # group 0 = {1, 0, 0, 0}: A_0 = 1 - (0+0+0)/3 = 1, A_j = 0 - (1+0+0)/3 = -1/3
    #   (= 4/3 * (R - 0.25): 4/3*0.75 = 1, 4/3*(-0.25) = -1/3)
    # group 5 = {3, 1}: A = 3 - 1 = 2, 1 - 3 = -2
    returns = torch.tensor([1.0, 3.0, 0.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0, 5, 0, 0, 5, 0])
    adv = rloo_advantages(returns, groups)
    assert adv.tolist() == approx([1.0, 2.0, -1 / 3, -1 / 3, -2.0, -1 / 3])
    assert rloo_advantages(torch.tensor([3.0]), torch.tensor([0])).tolist() == [0.0]


def test_reinforce_pp_global_normalisation():
    # gamma = 0.5; row 0: actions at 1 and 3 (pos 2 is an observation, skipped)
    #   G_3 = 1;  G_1 = 2.5 + 0.5 * G_3 = 3          (NOT via pos 2: that would give 2.75)
    # row 1: actions at 1 and 2
    #   G_2 = 3;  G_1 = -0.5 + 0.5 * 3 = 1
    # all masked G = {3, 1, 1, 3}: mean 2, population var = (1+1+1+1)/4 = 1, std 1
    # A = (G - 2) / 1
    mask = torch.tensor([[0, 1, 0, 1], [0, 1, 1, 0]], dtype=torch.bool)
    r = torch.tensor([[0.0, 2.5, 0.0, 1.0], [0.0, -0.5, 3.0, 0.0]])
    adv = reinforce_pp_advantages(r, mask, gamma=0.5, eps=0.0)
    assert adv.tolist() == [approx([0, 1, 0, -1]), approx([0, -1, 1, 0])]


def test_turn_level_returns_and_broadcast():
    # gamma 0.9, rewards (0, 0.5, 1, [7 padded]):
    #   G_2 = 1;  G_1 = 0.5 + 0.9*1 = 1.4;  G_0 = 0 + 0.9*1.4 = 1.26;  padded -> 0
    G = turn_level_returns(torch.tensor([[0.0, 0.5, 1.0, 7.0]]), torch.tensor([[1, 1, 1, 0]]), gamma=0.9)
    assert G.tolist() == [approx([1.26, 1.4, 1.0, 0.0])]
    x = broadcast_to_tokens(torch.tensor([[10.0, 20.0, 30.0]]), TURN_IDS, MASK)
    assert x.tolist() == [[0, 0, 10, 10, 0, 0, 0, 20, 20, 0]]
    s = turn_sums(torch.arange(10.0).unsqueeze(0), TURN_IDS, MASK, n_turns=3)
    assert s.tolist() == [[2 + 3, 7 + 8, 0]]


def test_group_baselines_per_turn_index():
    # One group of 3 episodes, 2 turns; episode 2 ended after turn 0.
    G = torch.tensor([[1.0, 1.0], [0.0, 0.0], [2.0, 99.0]])
    m = torch.tensor([[1, 1], [1, 1], [1, 0]], dtype=torch.bool)
    g = torch.tensor([4, 4, 4])
    # GRPO turn 0: {1, 0, 2} mean 1, sample var (0+1+1)/2 = 1 -> A = 0, -1, 1
    #      turn 1: {1, 0} (episode 2 has no turn 1) mean 0.5, sample var (0.25+0.25)/1 = 0.5
    #              -> A = +-0.5/sqrt(0.5) = +-0.70711
    a = grpo_advantages(G, g, eps=1e-12, mask=m)
    assert a.tolist() == [approx([0.0, 0.70711]), approx([-1.0, -0.70711]), approx([1.0, 0.0])]
    # RLOO turn 0: 1 - (0+2)/2 = 0;  0 - (1+2)/2 = -1.5;  2 - (1+0)/2 = 1.5
    #      turn 1: 1 - 0 = 1;  0 - 1 = -1;  masked -> 0
    a = rloo_advantages(G, g, mask=m)
    assert a.tolist() == [approx([0.0, 1.0]), approx([-1.5, -1.0]), approx([1.5, 0.0])]


# ------------------------------------------------------------- entry point
def _batch():
    """Two episodes of one game with the MASK layout; rewards (0.5, 1) and (0, 0)."""
    mask = MASK.repeat(2, 1)
    return dict(
        turn_rewards=torch.tensor([[0.5, 1.0, 0.0], [0.0, 0.0, 0.0]]),
        turn_mask=TURN_MASK.repeat(2, 1),
        action_mask=mask,
        turn_ids=TURN_IDS.repeat(2, 1),
        group_ids=torch.tensor([0, 0]),
    )


def test_registry_covers_every_configured_algo():
    algos = typing.get_args(typing.get_type_hints(RLConfig)["algo"])
    assert set(ADVANTAGE_FNS) == set(algos)
    with pytest.raises(ValueError, match="unknown rl.algo"):
        compute_advantages("a2c", **_batch(), cfg=RLConfig())


def test_compute_advantages_grpo_broadcasts_episode_advantage():
    # R = (1.5, 0): mean 0.75, sample std = sqrt(2 * 0.75^2 / 1) = 1.06066 -> A = +-0.70711
    adv, ret = compute_advantages("grpo", **_batch(), cfg=RLConfig(algo="grpo"))
    assert ret is None
    assert adv[0].tolist() == approx([0, 0, 0.70711, 0.70711, 0, 0, 0, 0.70711, 0.70711, 0])
    assert adv[1].tolist() == approx([0, 0, -0.70711, -0.70711, 0, 0, 0, -0.70711, -0.70711, 0])


def test_compute_advantages_rloo_turn_level():
    # gamma 0.5: G(ep0) = (0.5 + 0.5*1, 1) = (1, 1), G(ep1) = (0, 0); RLOO per turn -> +-1 each turn
    cfg = RLConfig(algo="rloo", gamma=0.5, turn_level_returns=True)
    adv, _ = compute_advantages("rloo", **_batch(), cfg=cfg)
    assert adv[0].tolist() == [0, 0, 1, 1, 0, 0, 0, 1, 1, 0]
    assert adv[1].tolist() == [0, 0, -1, -1, 0, 0, 0, -1, -1, 0]


def test_compute_advantages_ppo_is_masked_gae_with_kl_in_reward():
    b = _batch()
    values = VALUES.repeat(2, 1)
    kl = torch.full((2, 10), 0.1)
    cfg = RLConfig(algo="ppo", gamma=0.9, lam=0.8, kl_coef=0.5, kl_in_reward=True)
    adv, ret = compute_advantages("ppo", **b, values=values, kl=kl, cfg=cfg)
    # each action token's reward drops by 0.5 * 0.1 = 0.05
    r = token_rewards(b["turn_rewards"], b["turn_mask"], b["action_mask"], b["turn_ids"])
    r = add_kl_penalty(r, kl, b["action_mask"], 0.5)
    assert r[0, 3].item() == approx(0.45) and r[0, 4].item() == 0.0
    exp_adv, exp_ret = masked_gae(r, values, b["action_mask"], 0.9, 0.8)
    assert torch.allclose(adv, exp_adv) and torch.allclose(ret, exp_ret)
    with pytest.raises(ValueError, match="critic values"):
        compute_advantages("ppo", **b, cfg=cfg)
    with pytest.raises(ValueError, match="needs the per-token kl"):
        compute_advantages("ppo", **b, values=values, cfg=cfg)


def test_compute_advantages_reinforce_pp():
    # gamma 1: row 0 returns-to-go on action tokens 2,3,7,8 = 1.5, 1.5, 1, 1; row 1 all 0
    # masked G = {1.5,1.5,1,1, 0,0,0,0}: mean 0.625,
    # population var = (2*0.875^2 + 2*0.375^2 + 4*0.625^2)/8 = (1.53125+0.28125+1.5625)/8 = 0.421875
    # std = 0.649519 -> A = 1.34715, 0.57735, -0.96225
    adv, ret = compute_advantages("reinforce_pp", **_batch(), cfg=RLConfig(algo="reinforce_pp", gamma=1.0))
    assert ret is None
    a, b_, c = 0.875 / 0.649519, 0.375 / 0.649519, -0.625 / 0.649519
    assert adv[0].tolist() == approx([0, 0, a, a, 0, 0, 0, b_, b_, 0])
    assert adv[1].tolist() == approx([0, 0, c, c, 0, 0, 0, c, c, 0])


def test_compute_advantages_rloo_kl_in_reward_sums_kl_per_episode():
    # kl 0.1 on ep0's 4 action tokens, 0 on ep1's; beta 0.5:
    #   R0 = 0.5 + 1.0 - 0.5 * 4 * 0.1 = 1.3;  R1 = 0  ->  RLOO A = +1.3, -1.3
    kl = torch.stack([torch.full((10,), 0.1), torch.zeros(10)])
    cfg = RLConfig(algo="rloo", kl_coef=0.5, kl_in_reward=True)
    adv, _ = compute_advantages("rloo", **_batch(), kl=kl, cfg=cfg)
    assert adv[0, [2, 3, 7, 8]].tolist() == approx([1.3] * 4)
    assert adv[1, [2, 3, 7, 8]].tolist() == approx([-1.3] * 4)
    # with the KL in the loss instead, the kl tensor is not used: A = +-1.5
    adv, _ = compute_advantages("rloo", **_batch(), kl=kl, cfg=RLConfig(algo="rloo", kl_coef=0.5))
    assert adv[0, [2, 3, 7, 8]].tolist() == approx([1.5] * 4)
