"""Advantage estimators against hand-computed numbers (arithmetic in comments)."""

import typing

import pytest
import torch

from agentrecipe.algos import (
    add_kl_penalty,
    at_turn_starts,
    broadcast_to_tokens,
    compute_advantages,
    gigpo_advantages,
    grpo_advantages,
    join_whitening,
    masked_gae,
    masked_whiten,
    reinforce_pp_advantages,
    returns_to_go,
    rloo_advantages,
    step_ends,
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


@pytest.mark.parametrize("value", [0.1, 1 / 3, 0.7, 0.95**3])
def test_group_baselines_give_exact_zero_to_equal_non_dyadic_returns(value):
    # 8 equal float32 returns: the float mean is not the value (0.7 -> deviations ~6e-8), which the
    # std division used to blow up to +-0.06 with an arbitrary sign; every group method must give 0,
    # so that a dense-reward group without signal is skipped like a sparse one (has_gradient).
    returns = torch.full((8,), value, dtype=torch.float32)
    groups = torch.zeros(8, dtype=torch.long)
    assert grpo_advantages(returns, groups).tolist() == [0.0] * 8
    assert rloo_advantages(returns, groups).tolist() == [0.0] * 8
    per_turn = torch.stack([returns, torch.linspace(0.0, 1.0, 8)], dim=1)  # turn 0 equal, turn 1 not
    adv = grpo_advantages(per_turn, groups, mask=torch.ones(8, 2, dtype=torch.bool))
    assert adv[:, 0].tolist() == [0.0] * 8 and adv[7, 1] > 0
    assert rloo_advantages(per_turn, groups, mask=torch.ones(8, 2, dtype=torch.bool))[:, 0].tolist() == [0.0] * 8
    gigpo = gigpo_advantages(returns, returns.unsqueeze(1), torch.ones(8, 1, dtype=torch.bool), groups,
                             torch.zeros(8, 1, dtype=torch.long), norm="std")
    assert gigpo.tolist() == [[0.0]] * 8
    # returns 1e-3 apart are not equal: the group still carries its signal. One return d above 7
    # others: deviation 7d/8, sample std d/sqrt(8) -> A = 7/sqrt(8) (less 0.3%: eps 1e-6 vs std 3.5e-4)
    returns[0] += 1e-3
    assert grpo_advantages(returns, groups)[0] == pytest.approx(7 / 8**0.5, rel=1e-2)
    assert rloo_advantages(returns, groups)[0] == pytest.approx(1e-3, rel=1e-3)


def test_equal_returns_is_relative_and_nan_stays_visible():
    # Unnormalised scores (SciWorld's run to 100): 29 and the next float32 above it (1.9e-6 apart,
    # the same total summed in another order) are equal; an absolute 1e-6 would make them +-0.71.
    big = torch.tensor([29.0, torch.nextafter(torch.tensor(29.0), torch.tensor(30.0)).item()])
    assert grpo_advantages(big, torch.tensor([0, 0])).tolist() == [0.0, 0.0]
    # a NaN return is not hidden as a zero-signal group
    assert torch.isnan(grpo_advantages(torch.tensor([float("nan"), 1.0, 1.0]), torch.tensor([0, 0, 0]))).all()


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


def test_every_configured_algo_has_an_estimator():
    algos = typing.get_args(typing.get_type_hints(RLConfig)["algo"])
    extra = {"ppo": dict(values=VALUES.repeat(2, 1)), "gigpo": dict(anchor_ids=torch.zeros(2, 3, dtype=torch.long))}
    for algo in algos:
        adv, _ = compute_advantages(algo, **_batch(), cfg=RLConfig(algo=algo), **extra.get(algo, {}))
        assert adv.shape == MASK.repeat(2, 1).shape
    with pytest.raises(ValueError, match="unknown rl.algo"):
        compute_advantages("a2c", **_batch(), cfg=RLConfig())


def test_compute_advantages_grpo_broadcasts_episode_advantage():
    # R = (1.5, 0): mean 0.75, sample std = sqrt(2 * 0.75^2 / 1) = 1.06066 -> A = +-0.70711
    adv, ret = compute_advantages("grpo", **_batch(), cfg=RLConfig(algo="grpo"))
    assert ret is None
    assert adv[0].tolist() == approx([0, 0, 0.70711, 0.70711, 0, 0, 0, 0.70711, 0.70711, 0])
    assert adv[1].tolist() == approx([0, 0, -0.70711, -0.70711, 0, 0, 0, -0.70711, -0.70711, 0])


def test_compute_advantages_rloo_turn_level():
    # discount turn, gamma 0.5: G(ep0) = (0.5 + 0.5*1, 1) = (1, 1), G(ep1) = (0, 0); RLOO per turn -> +-1
    cfg = RLConfig(algo="rloo", gamma=0.5, turn_level_returns=True, discount="turn")
    adv, _ = compute_advantages("rloo", **_batch(), cfg=cfg)
    assert adv[0].tolist() == [0, 0, 1, 1, 0, 0, 0, 1, 1, 0]
    assert adv[1].tolist() == [0, 0, -1, -1, 0, 0, 0, -1, -1, 0]
    # discount token: G_n is the token return-to-go at turn n's first action token (2 and 7):
    #   G_8 = 1, G_7 = 0.5 * 1 = 0.5, G_3 = 0.5 + 0.5 * 0.5 = 0.75, G_2 = 0.5 * 0.75 = 0.375
    #   -> G(ep0) = (0.375, 0.5), G(ep1) = (0, 0); RLOO -> +-0.375 on turn 0, +-0.5 on turn 1
    adv, _ = compute_advantages("rloo", **_batch(), cfg=RLConfig(algo="rloo", gamma=0.5, turn_level_returns=True))
    assert adv[0].tolist() == approx([0, 0, 0.375, 0.375, 0, 0, 0, 0.5, 0.5, 0])
    assert adv[1].tolist() == approx([0, 0, -0.375, -0.375, 0, 0, 0, -0.5, -0.5, 0])


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
    # kl 0.1 on ep0's 4 action tokens, 0 on ep1's; beta 0.5. The task return is baselined first,
    # the episode's KL is subtracted after:  R = (1.5, 0) -> RLOO A = +-1.5
    #   ep0: 1.5 - 0.5 * 4 * 0.1 = 1.3;  ep1: -1.5 - 0 = -1.5
    kl = torch.stack([torch.full((10,), 0.1), torch.zeros(10)])
    cfg = RLConfig(algo="rloo", kl_coef=0.5, kl_in_reward=True)
    adv, _ = compute_advantages("rloo", **_batch(), kl=kl, cfg=cfg)
    assert adv[0, [2, 3, 7, 8]].tolist() == approx([1.3] * 4)
    assert adv[1, [2, 3, 7, 8]].tolist() == approx([-1.5] * 4)
    # with the KL in the loss instead, the kl tensor is not used: A = +-1.5
    adv, _ = compute_advantages("rloo", **_batch(), kl=kl, cfg=RLConfig(algo="rloo", kl_coef=0.5))
    assert adv[0, [2, 3, 7, 8]].tolist() == approx([1.5] * 4)


# ------------------------------------------------- truncation (issue 12, defect 1)
def test_masked_gae_bootstraps_a_truncated_episode():
    # As test_masked_gae_skips_environment_tokens, but the episode was cut by the turn limit:
    # V after the last action token is V(s_H) = 0.5 instead of 0 (gamma 0.9, lam 0.8, gamma*lam 0.72).
    # t=8: delta = 1.0 + 0.9*0.5 - 0.4 = 1.05                 A = 1.05
    # t=7: delta = 0.06                                       A = 0.06 + 0.72*1.05    = 0.816
    # t=3: delta = 0.57                                       A = 0.57 + 0.72*0.816   = 1.15752
    # t=2: delta = 0.08                                       A = 0.08 + 0.72*1.15752 = 0.9134144
    r = token_rewards(TURN_REWARDS, TURN_MASK, MASK, TURN_IDS)
    adv, ret = masked_gae(r, VALUES, MASK, gamma=0.9, lam=0.8, bootstrap_values=torch.tensor([0.5]))
    assert adv[0].tolist() == approx([0, 0, 0.9134144, 1.15752, 0, 0, 0, 0.816, 1.05, 0])
    assert ret[0, 8].item() == approx(1.05 + 0.4)
    # a terminal episode passes 0: the result of no bootstrap
    assert torch.equal(masked_gae(r, VALUES, MASK, 0.9, 0.8, bootstrap_values=torch.zeros(1))[0],
                       masked_gae(r, VALUES, MASK, 0.9, 0.8)[0])


def test_compute_advantages_ppo_passes_bootstrap_values():
    b = _batch()
    values = VALUES.repeat(2, 1)
    boot = torch.tensor([0.5, 0.0])  # episode 0 truncated, episode 1 ended
    adv, _ = compute_advantages("ppo", **b, values=values, bootstrap_values=boot, cfg=RLConfig(algo="ppo", gamma=0.9, lam=0.8))
    # row 0 is the hand-computed truncated case above (same rewards 0.5, 1.0)
    assert adv[0].tolist() == approx([0, 0, 0.9134144, 1.15752, 0, 0, 0, 0.816, 1.05, 0])


# ------------------------------------------------- discount unit (issue 12, defect 8)
def test_step_ends_token_and_turn():
    assert step_ends(MASK, TURN_IDS, "token").tolist() == MASK.tolist()
    # turn: only the last action token of each turn (3 and 8)
    assert torch.nonzero(step_ends(MASK, TURN_IDS, "turn")[0]).flatten().tolist() == [3, 8]
    with pytest.raises(ValueError, match="rl.discount"):
        step_ends(MASK, TURN_IDS, "episode")


def test_masked_gae_per_turn_discount():
    # gamma 0.9, lam 0.8 applied only after the last token of a turn (3, 8); inside a turn g = l = 1.
    # t=8 (end):  delta = 1.0 + 0.9*0   - 0.4 = 0.6            A = 0.6
    # t=7:        delta = 0   + 1*0.4   - 0.3 = 0.1            A = 0.1 + 1*0.6       = 0.7
    # t=3 (end):  delta = 0.5 + 0.9*0.3 - 0.2 = 0.57           A = 0.57 + 0.72*0.7   = 1.074
    # t=2:        delta = 0   + 1*0.2   - 0.1 = 0.1            A = 0.1 + 1*1.074     = 1.174
    # check t=2 by the closed form r_0 + gamma V_7 + gamma lam A_7 - V_2 = 0.5 + 0.27 + 0.504 - 0.1 = 1.174
    r = token_rewards(TURN_REWARDS, TURN_MASK, MASK, TURN_IDS)
    adv, _ = masked_gae(r, VALUES, MASK, 0.9, 0.8, step_end=step_ends(MASK, TURN_IDS, "turn"))
    assert adv[0].tolist() == approx([0, 0, 1.174, 1.074, 0, 0, 0, 0.7, 0.6, 0])
    cfg = RLConfig(algo="ppo", gamma=0.9, lam=0.8, discount="turn")
    b = _batch()
    adv_c, _ = compute_advantages("ppo", **b, values=VALUES.repeat(2, 1), cfg=cfg)
    assert adv_c[0].tolist() == approx(adv[0].tolist())


def test_turn_returns_per_turn_discount_match_turn_level_returns():
    # Three turns with 1, 2 and 1 action tokens; gamma 0.9, rewards (0, 0.5, 1):
    # turn discount: G = (0.9*(0.5 + 0.9*1), 0.5 + 0.9*1, 1) = (1.26, 1.4, 1.0), as turn_level_returns
    mask = torch.tensor([[1, 0, 1, 1, 0, 1]], dtype=torch.bool)
    tids = torch.tensor([[0, -1, 1, 1, -1, 2]])
    tr = torch.tensor([[0.0, 0.5, 1.0]])
    tm = torch.ones(1, 3, dtype=torch.bool)
    r = token_rewards(tr, tm, mask, tids)
    G = at_turn_starts(returns_to_go(r, mask, 0.9, step_ends(mask, tids, "turn")), mask, tids, 3)
    assert G.tolist() == [approx([1.26, 1.4, 1.0])]
    assert G.tolist() == [approx(turn_level_returns(tr, tm, 0.9)[0].tolist())]
    # token discount: one gamma per action token from the turn's first token:
    #   turn 2 (token 5): 1;  turn 1 (tokens 2, 3): 0.9*(0.5 + 0.9*1) = 1.26;  turn 0 (token 0): 0.9*1.26 = 1.134
    G = at_turn_starts(returns_to_go(r, mask, 0.9), mask, tids, 3)
    assert G.tolist() == [approx([1.134, 1.26, 1.0])]


# ------------------------------------------------- KL after normalising (issue 12, defect 3)
def _all_fail_batch():
    """Two failed episodes (sparse reward: all 0) of one game, kl 0.1 and 0.2 per action token."""
    b = _batch()
    b["turn_rewards"] = torch.zeros(2, 3)
    return b, torch.stack([torch.full((10,), 0.1), torch.full((10,), 0.2)])


def test_reinforce_pp_kl_in_reward_keeps_beta_scale_on_an_all_fail_batch():
    # Task returns are all 0 -> whitened 0; then A_t = -beta * KL-to-go (gamma 1, token discount):
    #   ep0 tokens 2, 3, 7, 8: KL-to-go 0.4, 0.3, 0.2, 0.1 -> A = -0.004, -0.003, -0.002, -0.001
    #   ep1: 0.8, 0.6, 0.4, 0.2 -> A = -0.008, -0.006, -0.004, -0.002
    # (whitening the KL-shaped return instead gave unit-variance advantages: std 1, max |A| > 1.)
    b, kl = _all_fail_batch()
    cfg = RLConfig(algo="reinforce_pp", kl_coef=0.01, kl_in_reward=True, kl_estimator="k1")
    adv, _ = compute_advantages("reinforce_pp", **b, kl=kl, cfg=cfg)
    assert adv[0, [2, 3, 7, 8]].tolist() == approx([-0.004, -0.003, -0.002, -0.001])
    assert adv[1, [2, 3, 7, 8]].tolist() == approx([-0.008, -0.006, -0.004, -0.002])
    assert adv.abs().max().item() <= 0.01 * 0.8 + 1e-9


def test_group_methods_kl_in_reward_keep_beta_scale_on_an_all_fail_batch():
    # grpo: R = (0, 0) -> A^task = 0; minus beta * episode KL: 0.01 * 0.4 = 0.004, 0.01 * 0.8 = 0.008
    # (the group std of the KL-shaped returns used to turn them into +-0.70711)
    b, kl = _all_fail_batch()
    cfg = RLConfig(algo="grpo", kl_coef=0.01, kl_in_reward=True)
    adv, _ = compute_advantages("grpo", **b, kl=kl, cfg=cfg)
    assert adv[0, [2, 3, 7, 8]].tolist() == approx([-0.004] * 4)
    assert adv[1, [2, 3, 7, 8]].tolist() == approx([-0.008] * 4)
    # per turn (turn-level returns, and gigpo): the KL return-to-go from each turn's first token,
    #   ep0: turn 0 0.4, turn 1 0.2 -> -0.004, -0.002;  ep1: -0.008, -0.004
    for algo, extra in [("grpo", dict(turn_level_returns=True)), ("gigpo", {})]:
        cfg = RLConfig(algo=algo, kl_coef=0.01, kl_in_reward=True, **extra)
        adv, _ = compute_advantages(algo, **b, kl=kl, cfg=cfg, anchor_ids=torch.tensor([[0, 1, -1], [0, 1, -1]]))
        assert adv[0, [2, 3, 7, 8]].tolist() == approx([-0.004, -0.004, -0.002, -0.002]), algo
        assert adv[1, [2, 3, 7, 8]].tolist() == approx([-0.008, -0.008, -0.004, -0.004]), algo


# ------------------------------------------------- PPO whitening (issue 12, defect 9)
def test_ppo_whiten_advantages():
    # GAE of test_masked_gae_skips_environment_tokens on tokens 2, 3, 7, 8: 0.7454528, 0.92424, 0.492, 0.6
    # mean 0.6904232, population var 0.0263117, std 0.1622087
    # -> (A - mean) / std = 0.3392518, 1.4414564, -1.2232585, -0.5574497; value targets unchanged
    b = dict(turn_rewards=TURN_REWARDS, turn_mask=TURN_MASK, action_mask=MASK, turn_ids=TURN_IDS,
             group_ids=torch.tensor([0]))
    raw, raw_ret = compute_advantages("ppo", **b, values=VALUES, cfg=RLConfig(algo="ppo", gamma=0.9, lam=0.8))
    adv, ret = compute_advantages("ppo", **b, values=VALUES,
                                  cfg=RLConfig(algo="ppo", gamma=0.9, lam=0.8, whiten_advantages=True))
    assert raw[0, [2, 3, 7, 8]].tolist() == approx([0.7454528, 0.92424, 0.492, 0.6])
    assert adv[0].tolist() == approx([0, 0, 0.3392518, 1.4414564, 0, 0, 0, -1.2232585, -0.5574497, 0])
    assert torch.equal(ret, raw_ret)


def test_whitening_a_constant_gives_exact_zeros():
    # 8 returns of 0.7 (not dyadic): their float32 mean is off by ~6e-8, which (x - mean) / (std + 1e-6)
    # blew up to advantages of about +-0.06 with an arbitrary sign; a constant carries no signal.
    assert torch.equal(masked_whiten(torch.full((8,), 0.7), torch.ones(8)), torch.zeros(8))
    # off the mask stays 0 whatever it holds
    mask = torch.tensor([1.0] * 8 + [0.0] * 3)
    x = torch.where(mask.bool(), torch.tensor(0.7), torch.tensor(5.0))
    assert torch.equal(masked_whiten(x, mask), torch.zeros(11))
    # REINFORCE++ on a batch where every episode earned the same non-dyadic return (dense reward 0.7)
    rewards = torch.zeros(2, 10)
    rewards[:, 8] = 0.7
    assert torch.equal(reinforce_pp_advantages(rewards, MASK.expand(2, -1), gamma=1.0), torch.zeros(2, 10))
    # anything but a constant is still whitened to mean 0, std 1
    y = masked_whiten(torch.arange(8.0), torch.ones(8))
    assert y.mean().item() == approx(0.0) and y.std(unbiased=False).item() == approx(1.0)


class ThreadRanks:
    """`reduce` for threads standing in for the ranks of a launch: each call waits for every rank's
    statistics, then returns their sum or max (all_reduce)."""

    def __init__(self, n: int):
        import threading

        self.barrier, self.slots = threading.Barrier(n, timeout=30), [None] * n

    def reduce_of(self, rank: int):
        def reduce(t, op):
            self.slots[rank] = t.clone()
            self.barrier.wait()
            stacked = torch.stack(self.slots)
            out = stacked.sum(0) if op == "sum" else stacked.max(0).values
            self.barrier.wait()  # every rank has read before the next call writes
            return out

        return reduce


def on_ranks(calls):
    """Run one callable per rank (each given its reduce) at once; their results in rank order."""
    from concurrent.futures import ThreadPoolExecutor

    ranks = ThreadRanks(len(calls))
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(call, ranks.reduce_of(r)) for r, call in enumerate(calls)]]


def test_whitening_under_a_launcher_runs_over_every_ranks_batch():
    """REINFORCE++'s only baseline is the batch mean: whitened per rank, returns [1, 1 | 1, 0] gave
    rank 0's two wins advantage 0 (its own mean); over both ranks they get what one process gives."""
    rewards = torch.zeros(4, 10)
    rewards[:, 8] = torch.tensor([1.0, 1.0, 1.0, 0.0])
    rewards[1, 3] = 0.5  # not one value per sequence
    mask = MASK.expand(4, -1)
    alone = reinforce_pp_advantages(rewards, mask, gamma=0.9)
    shards = on_ranks([lambda reduce, r=r: masked_whiten(returns_to_go(rewards[r:r + 2], mask[r:r + 2], 0.9),
                                                          mask[r:r + 2], reduce=reduce) for r in (0, 2)])
    assert torch.cat(shards).tolist() == [approx(row) for row in alone.tolist()]
    assert shards[0][0, 8] > 0  # per rank it was 0
    # a rank without a batch joins the same collectives (join_whitening) and changes nothing
    cfg = RLConfig(algo="reinforce_pp")
    whole, nothing = on_ranks([lambda reduce: masked_whiten(returns_to_go(rewards, mask, 0.9), mask, reduce=reduce),
                               lambda reduce: join_whitening("reinforce_pp", cfg, reduce)])
    assert whole.tolist() == [approx(row) for row in alone.tolist()] and nothing is None
    # equal returns on every rank together still give exact zeros; equal on each rank alone do not
    const = on_ranks([lambda reduce: masked_whiten(torch.full((3,), 0.7), torch.ones(3), reduce=reduce)] * 2)
    assert all(torch.equal(c, torch.zeros(3)) for c in const)
    apart = on_ranks([lambda reduce, v=v: masked_whiten(torch.full((3,), v), torch.ones(3), reduce=reduce)
                      for v in (0.7, 0.2)])
    assert [a.tolist() for a in apart] == [approx([1.0] * 3), approx([-1.0] * 3)]


@pytest.mark.parametrize("algo", ["ppo", "reinforce_pp"])
def test_the_trainers_advantages_under_a_launcher_are_one_process_advantages(algo):
    """compute_advantages with `reduce` on two ranks, one sequence each, gives what one process gives
    for both (ppo whitened as params/rl/ppo.yaml sets it)."""
    cfg = RLConfig(algo=algo, gamma=0.9, lam=0.8, whiten_advantages=algo == "ppo")
    turn_rewards = torch.tensor([[0.5, 1.0, 7.0], [0.0, 0.2, 0.0]])
    both = dict(turn_rewards=turn_rewards, turn_mask=TURN_MASK.expand(2, -1), action_mask=MASK.expand(2, -1),
                turn_ids=TURN_IDS.expand(2, -1), group_ids=torch.tensor([0, 1]), cfg=cfg,
                values=VALUES.expand(2, -1) if algo == "ppo" else None)
    alone, _ = compute_advantages(algo, **both)

    def rank(r):
        one = {k: v[r:r + 1] if isinstance(v, torch.Tensor) else v for k, v in both.items()}
        return lambda reduce: compute_advantages(algo, **one, reduce=reduce)[0]

    assert torch.cat(on_ranks([rank(0), rank(1)])).tolist() == [approx(row) for row in alone.tolist()]
