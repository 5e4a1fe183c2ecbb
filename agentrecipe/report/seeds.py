"""A sweep's points summed up across seeds: mean, a 95% interval, the per-seed values.

A sweep with `seed=0,1,2` has one experiment per (setting, seed). `summarise` groups the
experiments that differ only in `seed` and gives, per policy cell (rl and sft, in-domain and
out-of-domain, greedy success and the sampled episodes' pass@1), two intervals that answer
different questions:

- across seeds: mean of the per-seed success rates with Student's t interval,
      mean +- t_{0.975, n-1} * s / sqrt(n)      (s: sample standard deviation, n seeds)
  how much a rerun with another seed moves the answer: training noise, plus the draw of test
  games since each seed is tested on its own (env.test_draw follows the seed);
- pooled: the greedy test episodes of every seed pooled, Wilson (1927) 95% interval: the
  precision of the setting's success over all the games its seeds were tested on (distinct games
  when env.test_draw follows the seed; with one shared set of games it overstates it, since the
  same game then counts once per seed).

With one seed there is no across-seed interval (nan).
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from typing import Any

from agentrecipe.eval.metrics import mean_interval, wilson_interval
from agentrecipe.report.tables import pct

SEED_KEY = "seed"
CELLS = {"rl in-domain": ("rl.in_domain", "success"), "rl ood": ("rl.ood", "success"),
         "sft in-domain": ("sft.in_domain", "success"), "sft ood": ("sft.ood", "success"),
         "rl in-domain sampled": ("rl.in_domain", "pass@1"), "rl ood sampled": ("rl.ood", "pass@1"),
         "sft in-domain sampled": ("sft.in_domain", "pass@1"), "sft ood sampled": ("sft.ood", "pass@1")}
"""Summary column -> (metrics prefix, metric) from evaluation: greedy `success`, and `pass@1`, the
success of the sampled episodes (eval.samples per test game, averaged per game). `<prefix>.n` is
the number of test games; a sampled cell is pooled over those (each game's rate weighted by one
game), so its Wilson interval counts games, not sampled episodes."""

def exact_mean(values: list[float]) -> float:
    """The mean of `values` as written, in exact arithmetic: a float sum can land just under a half
    that `pct` rounds up (0, 0 and 3/80 gave 0.012499999999999999, printed 1.2 where 1/80 is 1.3)."""
    return float(sum(Fraction(repr(float(v))) for v in values) / len(values))


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): Student's t 95% interval of the mean, clipped to [0, 1]; nan bounds for one value."""
    if not values:
        raise ValueError("no values")
    mean = exact_mean(values)
    if len(values) == 1:
        return mean, math.nan, math.nan
    return (mean, *mean_interval(values))


def _is_number(x: Any) -> bool:
    """A measured value: a number, not nan (a metric read back from a CSV as 'nan' is not measured)."""
    return isinstance(x, (int, float)) and not math.isnan(x)


def summarise(rows: list[dict[str, Any]], swept: list[str]) -> list[dict[str, Any]]:
    """One row per setting (the swept keys other than `seed`), in first-seen order, from the sweep's
    rows (`experiment`, `state`, the swept keys, flat metrics). Only successful experiments count;
    `seeds` lists those that did, `missing` the others. `<column> per seed` holds one value per
    seed of `seeds`, in its order ("nan" where that experiment lacks the metric, which then stays out
    of the mean and the pooled count; empty where none has it), as the metric was stored (`:g`, no
    second rounding)."""
    keys = [k for k in swept if k != SEED_KEY]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(k, "") for k in keys), []).append(row)
    out = []
    for setting, members in groups.items():
        done = [r for r in members if r["state"] == "success"]
        summary: dict[str, Any] = {**dict(zip(keys, setting)),
                                   "seeds": " ".join(str(r.get(SEED_KEY, "")) for r in done),
                                   "missing": " ".join(r["experiment"] for r in members if r["state"] != "success")}
        for column, (prefix, metric) in CELLS.items():
            key = f"{prefix}.{metric}"
            measured = [_is_number(r.get(key)) for r in done]
            have = [r for r, m in zip(done, measured) if m]
            rates = [float(r[key]) for r in have]
            per_seed = [float(r[key]) if m else math.nan for r, m in zip(done, measured)] if have else []
            n = sum(int(r.get(f"{prefix}.n") or 0) for r in have)
            # greedy success: a whole count per seed, rounded so, as results.csv may hold the rate to 4
            # decimals (28 wins of 89 came back as 27.998); pass@1: a sum of per-game rates, unrounded
            per_row = [float(r[key]) * int(r.get(f"{prefix}.n") or 0) for r in have]
            wins = float(sum(round(w) for w in per_row)) if metric == "success" else sum(per_row)
            wins = min(float(n), round(wins, 9))  # no 3.0000000000000004 of a float sum
            mean, low, high = t_interval(rates) if rates else (math.nan,) * 3
            p_low, p_high = wilson_interval(wins, n) if n else (math.nan, math.nan)
            summary.update({f"{column} mean": mean, f"{column} low": low, f"{column} high": high,
                            f"{column} per seed": " ".join(f"{v:g}" for v in per_seed),
                            f"{column} pooled": wins / n if n else math.nan,
                            f"{column} pooled low": p_low, f"{column} pooled high": p_high,
                            f"{column} episodes": n})
        out.append(summary)
    return out


def cell_text(summary: dict[str, Any], column: str) -> str:
    """'41.7 [30.2, 53.1]' (mean across seeds, t interval), '40.0' for one seed, '–' for none."""
    mean, low, high = (summary[f"{column} {p}"] for p in ("mean", "low", "high"))
    return pct(mean) if math.isnan(low) else f"{pct(mean)} [{pct(low)}, {pct(high)}]"


def per_seed_text(summary: dict[str, Any], column: str) -> str:
    """The per-seed rates in whole percent, rounded once and half up from the stored decimal text
    ('40 45 3' for 0.4 0.45 0.034483), '–' for a seed without the metric."""
    return " ".join("–" if v.lower() == "nan" else str((Decimal(v) * 100).quantize(Decimal(1), ROUND_HALF_UP))
                    for v in summary[f"{column} per seed"].split())


def pooled_text(summary: dict[str, Any], column: str) -> str:
    """'41.7 [35.6, 48.0] n=240' (all seeds' test episodes pooled, Wilson interval)."""
    if not summary[f"{column} episodes"]:
        return "–"
    return (f"{pct(summary[f'{column} pooled'])} [{pct(summary[f'{column} pooled low'])}, "
            f"{pct(summary[f'{column} pooled high'])}] n={summary[f'{column} episodes']}")


def summary_table(summaries: list[dict[str, Any]], swept: list[str], columns: list[str]) -> list[dict[str, str]]:
    """Display rows: the setting, then per column the across-seed cell and the per-seed values."""
    keys = [k for k in swept if k != SEED_KEY]
    return [{**{k: str(s[k]) for k in keys}, "seeds": s["seeds"] or "–",
             **{h: v for c in columns for h, v in ((c, cell_text(s, c)), (f"{c} per seed", per_seed_text(s, c)))}}
            for s in summaries]
