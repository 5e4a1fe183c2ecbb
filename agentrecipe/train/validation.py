"""Held-out validation during RL: greedy episodes on the valid split every `rl.eval_every` steps.

Researchers read learning curves from held-out games, not from the training rollouts'
success (those are sampled, on the games being trained on). The valid split is built by
build_envs from its own seed range, disjoint from train and test.
"""

from __future__ import annotations

from agentrecipe.envs.base import GameSpec
from agentrecipe.rollout.engine import RolloutSettings, run_episodes


def validation_stats(games: list[GameSpec], backend, encoder, pool, agent, max_turns: int) -> dict[str, float]:
    """`valid/*` metrics of one greedy episode per game: success, normalised score, turns, failed episodes,
    and the share of episodes ended because the prompt outgrew agent.max_context (`valid/context_cut`:
    above 0, the curve measures the context limit as well as the policy).

    Failed episodes (environment crash or hang) count as not won, as in evaluation."""
    settings = RolloutSettings.from_agent(agent, max_turns, temperature=0.0, seed=0)
    episodes = run_episodes(list(games), backend, encoder, pool, settings)
    n = max(len(episodes), 1)
    return {
        "valid/success": sum(ep.won for ep in episodes) / n,
        "valid/score": sum(ep.score / max(ep.game.max_score, 1e-9) for ep in episodes) / n,
        "valid/turns": sum(ep.turns for ep in episodes) / n,
        "valid/failed_episodes": float(sum(ep.failed for ep in episodes)),
        "valid/context_cut": sum(ep.context_cut for ep in episodes) / n,
    }


def is_validation_step(step: int, every: int, n_steps: int) -> bool:
    """Validate after step `step` (1-based count of finished steps) every `every` steps and after the last."""
    return every > 0 and (step % every == 0 or step == n_steps)
