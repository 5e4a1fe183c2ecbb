"""Evaluation statistics: Wilson intervals, unbiased pass@k, and per-level aggregation of episodes.

An episode record is a flat dict (see `agentrecipe.eval.evaluate.episode_record`):
``policy, level, game, seed, mode ("greedy" | "sampled"), won, score, max_score,
turns, invalid, truncated, failed``. A failed episode (crashed or hung environment)
counts as not won: dropping it would flatter a policy that drives the game into a crash.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% for the default z).

        centre = (p + z^2 / 2n) / (1 + z^2 / n)
        half   = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / 4n^2)

    Wilson (1927), "Probable inference, the law of succession, and statistical inference".
    Unlike the normal approximation it stays inside [0, 1] and is not degenerate at 0 or n
    successes. With n = 0 nothing is known: (0, 1).
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact ends: no 0.9999999999999999
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from n samples of which c succeed.

        pass@k = 1 - C(n - c, k) / C(n, k)

    Chen et al. (2021), "Evaluating Large Language Models Trained on Code", eq. 1; computed
    as 1 - prod_{i = n-c+1}^{n} (1 - k / i) for numerical stability.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs at least k = {k} samples per game, got n = {n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


# Two-sided 95% critical values of Student's t for 1..30 degrees of freedom (above: `t_975`'s expansion).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t_975(df: int) -> float:
    """Student's t two-sided 95% critical value for `df` >= 1 degrees of freedom: the table up to 30,
    above it the Cornish-Fisher expansion in 1/df around the normal's z = 1.959964 (Abramowitz and
    Stegun 26.7.5; within 1e-5 of the exact value from 31 on: 2.0395 at 31, 2.0227 at 39, not 1.96)."""
    if df < 1:
        raise ValueError(f"need at least 1 degree of freedom, got {df}")
    if df <= len(T_975):
        return T_975[df - 1]
    z, v = 1.959964, float(df)
    g = ((z**3 + z) / 4, (5 * z**5 + 16 * z**3 + 3 * z) / 96, (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
         (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160)
    return z + sum(gi / v ** (i + 1) for i, gi in enumerate(g))


def mean_interval(xs: list[float], low: float = 0.0, high: float = 1.0) -> tuple[float, float]:
    """Student's t 95% interval of a mean of values in [low, high]:

        mean -+ t(n - 1) * s / sqrt(n),   s^2 = sum (x - mean)^2 / (n - 1)

    clipped to [low, high]; with fewer than 2 values nothing is known: (low, high). It measures
    the spread of the values only: values all alike give a zero-width interval (0/20 won on 0/1
    scores gives (0, 0), where the Wilson interval of success gives (0, 0.161)).
    Used for the mean score (e.g. SWE tasks' pass ratio), beside the Wilson interval of success.
    """
    n = len(xs)
    if n < 2:
        return low, high
    mean = sum(xs) / n
    half = t_975(n - 1) * math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1) / n)
    return max(low, mean - half), min(high, mean + half)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summarize(records: Iterable[dict], pass_k: list[int]) -> dict:
    """One metrics cell from episode records of one policy (and usually one level).

    From greedy episodes: ``success`` (won / n) with its 95% Wilson interval
    (``success_ci_low``, ``success_ci_high``), ``score`` (mean score / max score) with its
    95% t interval (``score_ci_low``, ``score_ci_high``; `mean_interval`),
    ``turns_won`` (mean turns of won episodes, None if none won), ``invalid_rate``
    (invalid actions / turns), ``context_cut`` (share of greedy episodes ended by
    agent.max_context: a context too small for the game cuts episodes short without an error),
    ``n`` (greedy episodes) and ``failed`` (failed episodes of both modes). ``pass@k`` averages, over games, the unbiased estimate from that game's
    sampled episodes; a game without sampled episodes (a deterministic policy) passes
    at every k exactly when its greedy episode wins.
    """
    records = list(records)
    greedy = [r for r in records if r["mode"] == "greedy"]
    wins = sum(bool(r["won"]) for r in greedy)
    low, high = wilson_interval(wins, len(greedy))
    turns = sum(r["turns"] for r in greedy)
    scores = [r["score"] / r["max_score"] if r["max_score"] else 0.0 for r in greedy]
    # Scores lie in [0, 1] except where a family scores below 0 (ScienceWorld's failed task is
    # -100 of 100): clipping to [0, 1] there put the interval above its own mean.
    score_low, score_high = mean_interval(scores, low=min([0.0, *scores]), high=max([1.0, *scores]))
    cell: dict = {
        "success": wins / len(greedy) if greedy else None,
        "success_ci_low": low,
        "success_ci_high": high,
        "score": _mean(scores),
        "score_ci_low": score_low,
        "score_ci_high": score_high,
        "turns_won": _mean([r["turns"] for r in greedy if r["won"]]),
        "invalid_rate": sum(r["invalid"] for r in greedy) / turns if turns else 0.0,
        "context_cut": sum(bool(r.get("context_cut")) for r in greedy) / len(greedy) if greedy else 0.0,
    }
    by_game: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_game[r["game"]].append(r)
    for k in pass_k:
        per_game = []
        for rs in by_game.values():
            sampled = [r for r in rs if r["mode"] == "sampled"]
            if sampled:
                per_game.append(pass_at_k(len(sampled), sum(bool(r["won"]) for r in sampled), k))
            else:
                per_game.append(float(any(r["won"] for r in rs)))
        cell[f"pass@{k}"] = _mean(per_game)
    cell["n"] = len(greedy)
    cell["failed"] = sum(bool(r["failed"]) for r in records)
    # Stored as computed, not rounded: a bound rounded to 6 decimals could land on x.xx5 and print
    # 68.0% where its counts give 68.1% (33/40's Wilson low 0.680500095).
    return cell


def summarize_levels(records: Iterable[dict], pass_k: list[int], groups: dict[str, list[str]] | None = None) -> dict:
    """{level: cell} for every level in `records` (in first-seen order), plus one pooled
    cell per entry of `groups` (e.g. {"in_domain": [...], "ood": [...]}) that has episodes."""
    records = list(records)
    levels = list(dict.fromkeys(r["level"] for r in records))
    out = {lvl: summarize([r for r in records if r["level"] == lvl], pass_k) for lvl in levels}
    for name, members in (groups or {}).items():
        rs = [r for r in records if r["level"] in members]
        if rs:
            out[name] = summarize(rs, pass_k)
    return out


CONTEXT_CUT_WARN = 0.1
"""Share of a policy's greedy episodes on a level, ended by agent.max_context, above which to warn."""


def context_cut_warnings(metrics: dict[str, dict[str, dict]], levels: list[str], max_context: int,
                         threshold: float = CONTEXT_CUT_WARN) -> list[str]:
    """A line per policy and level whose `context_cut` share exceeds `threshold`. Such episodes are valid
    (no error, no failure), but their numbers measure the context limit, not the policy."""
    return [f"warning: {cells[lvl]['context_cut']:.0%} of the {policy} policy's greedy episodes on {lvl} ended "
            f"because the prompt outgrew agent.max_context ({max_context} tokens): raise it, or lower agent.history"
            for policy, cells in metrics.items() for lvl in levels
            if lvl in cells and cells[lvl].get("context_cut", 0.0) > threshold]
