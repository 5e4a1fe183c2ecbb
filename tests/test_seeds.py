"""Across-seed summaries of a sweep (agentrecipe.report.seeds)."""

import math

import pytest

from agentrecipe.eval.metrics import wilson_interval
from agentrecipe.report import seeds


def _row(name, fraction, seed, rl, n=20, state="success"):
    return {"experiment": name, "state": state, "budget.sft_fraction": fraction, "seed": seed,
            "rl.in_domain.success": rl, "rl.in_domain.n": n, "sft.in_domain.success": 0.1, "sft.in_domain.n": n}


def test_t_interval_by_hand():
    # mean 0.5, s = 0.1, t_{0.975, 2} = 4.303: half = 4.303 * 0.1 / sqrt(3) = 0.24844
    mean, low, high = seeds.t_interval([0.4, 0.5, 0.6])
    assert mean == pytest.approx(0.5)
    assert (low, high) == (pytest.approx(0.25156, abs=1e-5), pytest.approx(0.74844, abs=1e-5))
    assert seeds.t_interval([0.0, 0.0, 1.0])[1] == 0.0  # clipped to [0, 1]
    one = seeds.t_interval([0.3])
    assert one[0] == 0.3 and math.isnan(one[1]) and math.isnan(one[2])


def test_t_critical_value_above_the_table():
    """Past 30 degrees of freedom: the t quantile, not the normal's 1.96 (intervals 2-4% too narrow
    before). Exact values: 2.0395 (31), 2.0227 (39), 2.0003 (60), 1.9799 (120)."""
    from agentrecipe.eval.metrics import t_975

    assert t_975(30) == 2.042
    for df, exact in ((31, 2.0395), (39, 2.0227), (60, 2.0003), (120, 1.9799)):
        assert t_975(df) == pytest.approx(exact, abs=1e-4), df


def test_percents_round_halves_up():
    from agentrecipe.report.tables import pct

    assert [pct(1 / 80), pct(63 / 80), pct(0.5), pct(1 / 3)] == ["1.3", "78.8", "50.0", "33.3"]
    assert pct(None) == pct(math.nan) == "–"


def test_a_mean_on_a_half_rounds_up_like_a_single_value():
    # 0, 0 and 3 wins of 80: mean 1/80, which a float sum put at 0.012499999999999999 ("1.2")
    from agentrecipe.report.finding import level_matrix
    from agentrecipe.report.tables import pct

    assert sum([0.0, 0.0, 0.0375]) / 3 < 0.0125
    mean, _, _ = seeds.t_interval([0.0, 0.0, 0.0375])
    assert pct(mean) == pct(1 / 80) == "1.3"
    rows = [{"experiment": f"s{i}", "state": "success", "seed": str(i), "rl.L.success": str(v)}
            for i, v in enumerate([0.0, 0.0, 0.0375])]
    assert level_matrix(rows, [], "rl")[1] == [["1.3"]]


def test_a_metric_read_back_as_nan_is_not_measured():
    rows = [_row("a0", "0.2", "0", 0.4), _row("a1", "0.2", "1", math.nan)]
    (summary,) = seeds.summarise(rows, ["budget.sft_fraction", "seed"])  # crashed before
    assert summary["rl in-domain per seed"] == "0.4 nan" and summary["rl in-domain episodes"] == 20


def test_summary_groups_the_seeds_of_each_setting_and_skips_failed_ones():
    rows = [_row("a0", "0.2", "0", 0.4), _row("a1", "0.2", "1", 0.5), _row("a2", "0.2", "2", 0.6),
            _row("b0", "1.0", "0", 0.9), _row("b1", "1.0", "1", 0.0, state="failed")]
    first, second = seeds.summarise(rows, ["budget.sft_fraction", "seed"])
    assert (first["budget.sft_fraction"], first["seeds"], first["missing"]) == ("0.2", "0 1 2", "")
    assert first["rl in-domain mean"] == pytest.approx(0.5)
    assert first["rl in-domain per seed"] == "0.4 0.5 0.6"
    # pooled: 8 + 10 + 12 = 30 wins of 60 episodes
    assert (first["rl in-domain pooled"], first["rl in-domain episodes"]) == (0.5, 60)
    assert (first["rl in-domain pooled low"], first["rl in-domain pooled high"]) == wilson_interval(30, 60)
    assert seeds.cell_text(first, "rl in-domain") == "50.0 [25.2, 74.8]"
    assert seeds.per_seed_text(first, "rl in-domain") == "40 50 60"
    # the failed seed is left out, named in `missing`; one seed left: no across-seed interval
    assert (second["seeds"], second["missing"], second["rl in-domain episodes"]) == ("0", "b1", 20)
    assert seeds.cell_text(second, "rl in-domain") == "90.0"
    assert seeds.cell_text(second, "rl ood") == "–" and seeds.pooled_text(second, "rl ood") == "–"
    table = seeds.summary_table([first, second], ["budget.sft_fraction", "seed"], ["rl in-domain"])
    assert table[0] == {"budget.sft_fraction": "0.2", "seeds": "0 1 2", "rl in-domain": "50.0 [25.2, 74.8]",
                        "rl in-domain per seed": "40 50 60"}


def test_pooled_greedy_wins_are_whole_from_rates_stored_to_four_decimals():
    """results.csv of earlier sweeps holds rates to 4 decimals: 28 wins of 89 read back as 0.3146,
    27.998 wins, and the page's pooled bound moved (22.8 -> 22.7). Greedy wins are whole per seed;
    sampled (pass@1) ones are per-game rates and stay as summed."""
    rows = [_row("a0", "0.2", "0", 0.3146, n=89)]
    rows[0].update({"rl.in_domain.pass@1": 0.3146})
    (summary,) = seeds.summarise(rows, ["budget.sft_fraction", "seed"])
    assert summary["rl in-domain pooled low"] == wilson_interval(28, 89)[0]
    assert summary["rl in-domain pooled"] == 28 / 89
    assert summary["rl in-domain sampled pooled"] == pytest.approx(0.3146)  # 27.9994 of 89, not rounded


def test_per_seed_values_are_rounded_once_half_up():
    # 18, 28 and 41 wins of 59: 30.508, 47.458, 69.492%; stored to 6 decimals, shown as whole percents.
    rows = [_row(f"e{s}", "0.2", str(s), round(k / 59, 6), n=59) for s, k in ((0, 18), (1, 28), (2, 41))]
    (summary,) = seeds.summarise(rows, ["budget.sft_fraction", "seed"])
    assert seeds.per_seed_text(summary, "rl in-domain") == "31 47 69"
    # a results.csv written at 4 decimals: 1/29 = 3.448% stored as 0.0345 is 3, not 0.035 -> 3.5 -> 4
    summary["rl in-domain per seed"] = "0.0345 0.125 1"
    assert seeds.per_seed_text(summary, "rl in-domain") == "3 13 100"


def test_a_seed_without_the_metric_keeps_its_place():
    rows = [_row("a0", "0.2", "0", 0.1), _row("a1", "0.2", "1", 0.3), _row("a2", "0.2", "2", 0.5)]
    rows[1] = {k: v for k, v in rows[1].items() if not k.startswith("rl.")}
    (summary,) = seeds.summarise(rows, ["budget.sft_fraction", "seed"])
    assert summary["seeds"] == "0 1 2" and summary["rl in-domain per seed"] == "0.1 nan 0.5"
    assert seeds.per_seed_text(summary, "rl in-domain") == "10 – 50"
    assert summary["rl in-domain mean"] == pytest.approx(0.3) and summary["rl in-domain episodes"] == 40
    # a column no seed has stays empty (the page shows one dash)
    assert summary["rl ood per seed"] == "" and seeds.per_seed_text(summary, "rl ood") == ""
