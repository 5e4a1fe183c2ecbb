"""Wilson intervals, unbiased pass@k and the per-level metrics cell."""

from __future__ import annotations

import json
import math

import pytest

from agentrecipe.eval.metrics import (context_cut_warnings, mean_interval, pass_at_k, summarize,
                                      summarize_levels, wilson_interval)
from agentrecipe.report.tables import success_cell


@pytest.mark.parametrize(
    "successes, n, low, high",
    [
        (0, 10, 0.0, 0.2775),
        (5, 10, 0.2366, 0.7634),
        (10, 10, 0.7225, 1.0),
        # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I.
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
    ],
)
def test_wilson_interval_matches_hand_and_published_values(successes, n, low, high):
    lo, hi = wilson_interval(successes, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)
    assert 0.0 <= lo <= successes / n <= hi <= 1.0


def test_wilson_interval_edge_cases():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(5, 10)
    assert lo + hi == pytest.approx(1.0)  # symmetric around one half
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


@pytest.mark.parametrize(
    "n, c, k, expected",
    [(4, 1, 1, 0.25), (4, 1, 2, 0.5), (4, 0, 1, 0.0), (4, 0, 4, 0.0), (4, 3, 2, 1.0), (4, 4, 1, 1.0), (10, 3, 1, 0.3)],
)
def test_pass_at_k(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_equals_binomial_formula():
    n, c, k = 20, 5, 4
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_needs_k_samples():
    with pytest.raises(ValueError, match="samples"):
        pass_at_k(2, 1, 4)


def _rec(game, mode, won, turns=3, invalid=0, score=None, failed=False, level="L"):
    return {"policy": "p", "level": level, "game": game, "mode": mode, "won": won, "turns": turns,
            "invalid": invalid, "score": float(won) if score is None else score, "max_score": 1.0, "failed": failed}


def test_summarize_cell():
    records = [
        _rec("g1", "greedy", True, turns=2, invalid=1),
        _rec("g2", "greedy", False, turns=6, invalid=3, score=0.5),
        *[_rec("g1", "sampled", w) for w in (True, False, False, False)],
        _rec("g2", "sampled", False, failed=True),
        *[_rec("g2", "sampled", False) for _ in range(3)],
    ]
    cell = summarize(records, [1, 4])
    assert cell["success"] == 0.5 and cell["n"] == 2
    assert (cell["success_ci_low"], cell["success_ci_high"]) == wilson_interval(1, 2)
    assert cell["score"] == 0.75
    assert cell["turns_won"] == 2.0
    assert cell["invalid_rate"] == 0.5  # 4 invalid of 8 greedy turns
    assert cell["pass@1"] == 0.125 and cell["pass@4"] == 0.5  # mean over games of (0.25, 0) and (1, 0)
    assert cell["failed"] == 1


def test_score_interval_holds_negative_scores():
    """ScienceWorld scores a failed task -100 of 100. Before, the score interval was clipped to
    [0, 1]: here mean -0.5 came with (0.0, 0.48), an interval above its own mean."""
    scores = [-1.0, -1.0, -1.0, 1.0]
    cell = summarize([_rec(f"g{i}", "greedy", s > 0, score=s) for i, s in enumerate(scores)], [1])
    assert cell["score"] == -0.5
    assert cell["score_ci_low"] < cell["score"] < cell["score_ci_high"]
    low, high = mean_interval(scores, low=-1.0)
    assert (cell["score_ci_low"], cell["score_ci_high"]) == (low, high)
    assert -1.0 <= low  # still clipped, to the lowest score seen


def test_deterministic_policy_passes_at_every_k_iff_greedy_won():
    cell = summarize([_rec("g1", "greedy", True), _rec("g2", "greedy", False)], [1, 4])
    assert cell["pass@1"] == cell["pass@4"] == 0.5


def test_no_wins_has_no_turns_won():
    assert summarize([_rec("g1", "greedy", False)], [1])["turns_won"] is None


def test_summarize_levels_with_groups():
    records = [_rec("a", "greedy", True, level="A"), _rec("b", "greedy", False, level="B"),
               _rec("c", "greedy", False, level="C")]
    out = summarize_levels(records, [1], {"in_domain": ["A", "B"], "ood": ["C"], "empty": []})
    assert list(out) == ["A", "B", "C", "in_domain", "ood"]
    assert out["in_domain"]["success"] == 0.5 and out["in_domain"]["n"] == 2


def test_context_cut_warns_per_policy_and_level_above_the_threshold():
    cut = {"rl": {"a": {"context_cut": 0.5}, "b": {"context_cut": 0.1}, "in_domain": {"context_cut": 0.3}},
           "sft": {"a": {"context_cut": 0.0}}, "random": {"a": {}}}
    lines = context_cut_warnings(cut, ["a", "b", "c"], 1024)
    assert lines == ["warning: 50% of the rl policy's greedy episodes on a ended because the prompt outgrew "
                     "agent.max_context (1024 tokens): raise it, or lower agent.history"]  # 0.1 is not above
    assert context_cut_warnings(cut, ["b"], 1024, threshold=0.05)[0].startswith("warning: 10% of the rl policy's")


def test_stored_cell_prints_like_the_counts():
    """The table string of a stored cell equals the one computed from the counts, for every count up
    to 100 episodes. Before, cells were stored to 6 decimals, and 33/40's Wilson low 0.680500095 was
    stored as 0.6805 and printed 68.0 where its counts give 68.1."""
    for n in range(1, 101):
        records = [_rec(f"g{i}", "greedy", False) for i in range(n)]
        for wins in range(n + 1):
            for r in records[:wins]:
                r["won"] = True
            low, high = wilson_interval(wins, n)
            exact = {"success": wins / n, "success_ci_low": low, "success_ci_high": high}
            stored = json.loads(json.dumps(summarize(records, [1])))  # as metrics.json holds it
            assert success_cell(stored) == success_cell(exact), (wins, n)
