"""Loss terms against hand-computed numbers, and the zero-gradient guarantee off the action mask."""

import math

import pytest
import torch

from agentrecipe.algos import (
    aggregate,
    entropy_from_logits,
    explained_variance,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    policy_loss,
    value_loss,
)

torch.set_num_threads(1)


def approx(x):
    return pytest.approx(x, abs=1e-5)


def test_aggregate_modes_and_nan_off_mask():
    loss = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [9.0, float("nan"), float("inf"), 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])  # row 2: no action token at all
    # token-mean: (1+2+3+4)/4 = 2.5
    assert aggregate(loss, mask, "token-mean").item() == approx(2.5)
    # seq-mean-token-mean: row means 6/3 = 2 and 4/1 = 4; empty row skipped -> 3
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == approx(3.0)
    # seq-mean-token-sum: row sums 6 and 4 -> 5
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == approx(5.0)
    with pytest.raises(ValueError, match="unknown loss_agg"):
        aggregate(loss, mask, "sum")
    assert masked_mean(loss, torch.zeros_like(mask)).item() == 0.0


def _ppo_case():
    # ratios rho = exp(new - old) with old = 0; eps = 0.2; the 5th token is padding (huge ratio, nan adv)
    rho = torch.tensor([1.5, 0.9, 0.5, 1.5, 1.0])
    new = torch.log(rho)
    new[4] = 100.0
    adv = torch.tensor([1.0, 2.0, -1.0, -1.0, float("nan")])
    mask = torch.tensor([1, 1, 1, 1, 0], dtype=torch.bool)
    return new.unsqueeze(0).requires_grad_(), torch.zeros(1, 5), adv.unsqueeze(0), mask.unsqueeze(0)


def test_policy_loss_clipped_and_unclipped():
    new, old, adv, mask = _ppo_case()
    loss, stats = policy_loss(new, old, adv, mask, clip_eps=0.2)
    # l = max(-A rho, -A clip(rho, 0.8, 1.2)):
    # t0 rho 1.5, A +1: max(-1.5, -1.2) = -1.2   clip ACTIVE   (grad 0)
    # t1 rho 0.9, A +2: max(-1.8, -1.8) = -1.8   inside range  (grad -A rho = -1.8)
    # t2 rho 0.5, A -1: max( 0.5,  0.8) =  0.8   clip ACTIVE   (grad 0)
    # t3 rho 1.5, A -1: max( 1.5,  1.2) =  1.5   clip would be optimistic, not used (grad -A rho = 1.5)
    # token-mean = (-1.2 - 1.8 + 0.8 + 1.5) / 4 = -0.7 / 4 = -0.175
    assert loss.item() == approx(-0.175)
    assert stats["clipfrac"].item() == approx(0.5)  # t0 and t2
    # approx_kl = mean((rho-1) - log rho):
    #   t0, t3: 0.5 - 0.405465 = 0.094535; t1: -0.1 + 0.105361 = 0.005361; t2: -0.5 + 0.693147 = 0.193147
    #   (0.094535*2 + 0.005361 + 0.193147) / 4 = 0.0968945
    assert stats["approx_kl"].item() == approx(0.0968945)
    loss.backward()
    # d l_t / d log rho_t = -A rho when unclipped, /4 for the token mean: t1 -1.8/4, t3 1.5/4
    assert new.grad[0].tolist() == approx([0.0, -0.45, 0.0, 0.375, 0.0])


def test_policy_loss_on_policy_equals_minus_mean_advantage():
    # rho = 1 everywhere: no clipping, loss = -mean(A) = -(1 + 2 - 1 - 1)/4 = -0.25
    _, old, adv, mask = _ppo_case()
    loss, stats = policy_loss(old.clone(), old, adv, mask, clip_eps=0.2, loss_agg="seq-mean-token-sum")
    # seq-mean-token-sum of one row: -(1 + 2 - 1 - 1) = -1
    assert loss.item() == approx(-1.0)
    assert stats["clipfrac"].item() == 0.0 and stats["approx_kl"].item() == approx(0.0)


def test_value_loss_clipping():
    old = torch.tensor([[1.0, 1.0, 1.0, 5.0]])
    new = torch.tensor([[1.5, 1.1, 0.5, float("nan")]], requires_grad=True)
    ret = torch.tensor([[2.0, 0.0, 1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = value_loss(new, old, ret, mask, value_clip=0.2)
    # t0: unclipped (1.5-2)^2 = 0.25; clipped V = 1.2: (1.2-2)^2 = 0.64 -> max 0.64 -> 0.32 (clip wins, grad 0)
    # t1: 1.1 within +-0.2: (1.1-0)^2 = 1.21 both -> 0.605
    # t2: unclipped (0.5-1)^2 = 0.25; clipped V = 0.8: (0.8-1)^2 = 0.04 -> max 0.25 -> 0.125
    # mean = (0.32 + 0.605 + 0.125) / 3 = 0.35
    assert loss.item() == approx(0.35)
    assert stats["vf_clipfrac"].item() == approx(1 / 3)
    loss.backward()
    # grads: t0 0; t1 (1.1-0)/3 = 0.366667; t2 (0.5-1)/3 = -0.166667; t3 padded 0
    assert new.grad[0].tolist() == approx([0.0, 1.1 / 3, -0.5 / 3, 0.0])
    # value_clip 0 turns clipping off: 0.5 * (0.25 + 1.21 + 0.25) / 3 = 0.285
    loss, _ = value_loss(new, old, ret, mask, value_clip=0.0)
    assert loss.item() == approx(0.285)


def test_kl_estimators():
    # pi = 0.5, pi_ref = 0.25: log pi - log pi_ref = ln 2
    #   k1 = ln 2 = 0.693147;  k3 = r - 1 - ln r with r = 0.5: 0.5 - 1 + 0.693147 = 0.193147
    # pi = 0.25, pi_ref = 0.5: k1 = -0.693147;  r = 2: k3 = 2 - 1 - 0.693147 = 0.306853
    lp = torch.log(torch.tensor([0.5, 0.25]))
    ref = torch.log(torch.tensor([0.25, 0.5]))
    assert kl_penalty(lp, ref, "k1").tolist() == approx([0.693147, -0.693147])
    assert kl_penalty(lp, ref, "k3").tolist() == approx([0.193147, 0.306853])
    with pytest.raises(ValueError):
        kl_penalty(lp, ref, "k2")


def test_kl_estimators_are_unbiased():
    # Exact expectation over a 3-token vocabulary: E_pi[k] = sum_x pi(x) k(x) = KL(pi || ref)
    p = torch.tensor([0.2, 0.5, 0.3])
    q = torch.tensor([0.4, 0.4, 0.2])
    kl = (p * (p / q).log()).sum().item()
    for est in ("k1", "k3"):
        assert (p * kl_penalty(p.log(), q.log(), est)).sum().item() == approx(kl)


def test_entropy_from_logits():
    # uniform over 4: ln 4 = 1.386294
    # p = (0.25, 0.75): -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.346574 + 0.215762 = 0.562335
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [math.log(1.0), math.log(3.0), -1e9, -1e9]])
    assert entropy_from_logits(logits).tolist() == approx([1.386294, 0.562335])


def test_explained_variance():
    ret = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(ret, ret, mask).item() == approx(1.0)
    # V = 0: Var[R - V] = Var[R] -> 0
    assert explained_variance(torch.zeros_like(ret), ret, mask).item() == approx(0.0)


def test_environment_tokens_get_zero_gradient():
    """Prompt / observation / padding positions must receive exactly zero gradient."""
    torch.manual_seed(0)
    B, T, V = 2, 8, 5
    logits = torch.randn(B, T, V, requires_grad=True)  # (B, T, V)
    tokens = torch.randint(V, (B, T))
    mask = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 0], [0, 1, 1, 0, 0, 1, 1, 1]], dtype=torch.bool)
    # Garbage where the mask is 0: inf advantages, nan old log-probs, far-off reference log-probs.
    adv = torch.where(mask, torch.randn(B, T), torch.tensor(float("inf")))
    old = logprobs_from_logits(logits.detach(), tokens) + 0.3 * torch.randn(B, T)
    ref = torch.where(mask, old + 0.1, torch.tensor(-1e4))
    old = torch.where(mask, old, torch.tensor(float("nan")))

    new = logprobs_from_logits(logits, tokens)  # (B, T)
    pg_loss, _ = policy_loss(new, old, adv, mask, clip_eps=0.2, loss_agg="seq-mean-token-mean")
    kl_loss = aggregate(kl_penalty(new, ref, "k3"), mask)
    entropy_loss = aggregate(entropy_from_logits(logits), mask)
    loss = pg_loss + 0.1 * kl_loss - 0.01 * entropy_loss
    loss.backward()

    assert torch.isfinite(loss)
    off = ~mask
    assert torch.equal(logits.grad[off], torch.zeros_like(logits.grad[off]))
    assert logits.grad[mask].abs().sum() > 0


def test_seq_mean_weighs_episodes_not_turn_sequences():
    # Episode A: 1 turn (one sequence, 2 action tokens, loss 1 each).
    # Episode B: 4 turns, one sequence per turn (history window), 1 action token each, loss 3.
    loss = torch.tensor([[1.0, 1.0], [3.0, 0.0], [3.0, 0.0], [3.0, 0.0], [3.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 0], [1, 0]])
    # share u = 1 / (action tokens of the episode): A's tokens 1/2, B's tokens 1/4
    share = torch.tensor([[0.5, 0.5], [0.25, 0.0], [0.25, 0.0], [0.25, 0.0], [0.25, 0.0]])
    # seq-mean-token-mean over episodes: (mean_A 1 + mean_B 3) / 2 = 2   (per sequence: (1+3*4)/5 = 2.6)
    assert aggregate(loss, mask, "seq-mean-token-mean", share).item() == approx(2.0)
    # seq-mean-token-sum: (sum_A 2 + sum_B 12) / 2 episodes = 7   (per sequence: 14 / 5 = 2.8)
    assert aggregate(loss, mask, "seq-mean-token-sum", share).item() == approx(7.0)
    # token-mean ignores episodes: 14 / 6
    assert aggregate(loss, mask, "token-mean", share).item() == approx(14 / 6)
    # a minibatch with only two of B's turn sequences: half an episode, mean 3
    assert aggregate(loss[1:3], mask[1:3], "seq-mean-token-mean", share[1:3]).item() == approx(3.0)
    assert aggregate(loss[1:3], mask[1:3], "seq-mean-token-sum", share[1:3]).item() == approx(12.0)


def test_policy_loss_clamps_the_log_ratio_so_gradients_stay_finite():
    # log-ratio 100 would overflow exp in float32 (inf); with A > 0 the clipped branch wins and
    # its zero gradient times d rho / d log rho = inf gave nan. Clamped at 20: finite loss, zero grad.
    new = torch.tensor([[100.0, 0.1]], requires_grad=True)
    old, adv, mask = torch.zeros(1, 2), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2)
    loss, stats = policy_loss(new, old, adv, mask, clip_eps=0.2)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(new.grad).all()
    # token 0 clipped (-1.2), token 1 inside (rho = e^0.1): (-1.2 - e^0.1) / 2
    assert loss.item() == approx((-1.2 - math.exp(0.1)) / 2)
    assert new.grad[0].tolist() == approx([0.0, -math.exp(0.1) / 2])


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_aggregate_weight_is_the_denominator_ranks_are_weighed_by(loss_agg):
    """Across ranks, one mean over all tokens (or episodes) weighs each rank's aggregate by its
    denominator: two halves of a batch, recombined so, give the whole batch's aggregate."""
    from agentrecipe.algos.losses import aggregate_weight

    torch.manual_seed(0)
    loss = torch.randn(6, 5)
    mask = torch.rand(6, 5) > 0.4
    mask[:, 0] = True
    share = torch.rand(6, 5) * mask
    whole = aggregate(loss, mask, loss_agg, share)
    halves = [(slice(0, 2), ), (slice(2, 6), )]
    parts = [(aggregate(loss[s], mask[s], loss_agg, share[s]), aggregate_weight(mask[s], loss_agg, share[s]))
             for (s,) in halves]
    total = sum(w for _, w in parts)
    assert sum(a * w for a, w in parts) / total == pytest.approx(float(whole), rel=1e-5)
    assert aggregate_weight(torch.zeros(2, 3, dtype=torch.bool), loss_agg) == 0.0
