"""Broken games found before a run, and runs built on too many failed episodes refused.

    bad = check_games(pool, games)            # {path: error}: games whose reset fails
    error = failed_share_error(records, 0.1, "eval.max_failed_share")
    if error: sys.exit(error)

A game that kills the interpreter (a truncated story file) is isolated by the pool, so
one check costs one reset per game and names every bad file with its error.
"""

from __future__ import annotations

from fractions import Fraction

from agentrecipe.envs.base import GameSpec


def check_games(pool, games: list[GameSpec], batch_size: int = 32) -> dict[str, str]:
    """{game path: error} of the games whose reset fails in `pool` (one reset per game)."""
    bad: dict[str, str] = {}
    for start in range(0, len(games), batch_size):
        chunk = games[start:start + batch_size]
        for slot, (game, obs) in enumerate(zip(chunk, pool.reset(chunk))):
            if obs is None:
                bad[game.path] = pool.last_errors.get(slot, "reset failed")
    return bad


def playable(pool, games: list[GameSpec], log=print) -> list[GameSpec]:
    """The games of `games` that start; each one left out is logged with its error."""
    bad = check_games(pool, games)
    for path, error in bad.items():
        log(f"warning: left out {path}: it does not start ({error})")
    if bad:
        log(f"warning: {len(bad)} of {len(games)} games left out (above); {len(games) - len(bad)} remain")
    return [g for g in games if g.path not in bad]


def more_than_share(count: float, total: float, limit: float) -> bool:
    """count / total > limit, in exact arithmetic on the limit as written (in floats 0.29 * 100 is
    28.999..., so 29 failures of 100 would count as more than a share of 0.29)."""
    return Fraction(count) > Fraction(repr(limit)) * Fraction(total)


def failed_share_error(records: list[dict], limit: float, key: str) -> str | None:
    """An error message when more than `limit` of one policy's episodes of one mode in `records`
    failed (else None).

    A record is one episode (`policy`, `mode`, `failed`, `error`, `game` keys). Greedy and sampled
    episodes count apart: success comes from the greedy ones alone, and pooled with 4 samples per
    game half of them could fail unseen. The message counts the failures and quotes the first
    errors, so the cause is on screen."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r.get("policy", "?"), r.get("mode", "")), []).append(r)
    for (policy, mode), mine in groups.items():
        failed = [r for r in mine if r.get("failed")]
        if more_than_share(len(failed), len(mine), limit):
            examples = "; ".join(f"{r.get('game', '?')}: {r.get('error', '')}" for r in failed[:3])
            episodes = f"{mode} episodes" if mode else "episodes"
            return (f"error: {len(failed)} of {len(mine)} {episodes} of {policy} failed ({len(failed) / len(mine):.0%}), "
                    f"more than {key}={limit:g}: its success rate would be built on failures. First errors: {examples}")
    return None
