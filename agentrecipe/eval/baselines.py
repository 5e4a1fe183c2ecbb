"""Non-LLM policies that bracket the learned ones: the expert (upper bound), a seeded
random-admissible player and an always-first-admissible player (lower bounds).

They play through the same `EnvPool` as the LLM policies and return the same
`Episode` objects (with empty token ids), so every metric is computed one way.
"""

from __future__ import annotations

import random

from agentrecipe.envs.base import GameSpec, Observation
from agentrecipe.rollout.episode import Episode, end_episodes, start_episodes

FALLBACK_ACTION = "look"


class Baseline:
    """A policy that picks an action from the observation alone (plus the game's plan)."""

    name = "baseline"
    stochastic = False
    """True when episodes differ by seed (then sampled episodes are played for pass@k)."""
    uses_temperature = False
    """Temperatures are ignored: a stochastic baseline is sampled at eval.temperature 0 too."""

    def act(self, obs: Observation, game: GameSpec, turn: int, rng: random.Random) -> str:
        raise NotImplementedError

    def play(self, games: list[GameSpec], pool, max_turns: int, temperatures: list[float] | None = None,
             seed: int | None = None) -> list[Episode]:
        """One episode per game, in lock-step through `pool`; `temperatures` are ignored.

        Episode i draws from its own RNG seeded by (seed, i), so results do not depend
        on how episodes are batched across workers.
        """
        base = 0 if seed is None else seed
        rngs = [random.Random(base * 1_000_003 + i) for i in range(len(games))]
        episodes = start_episodes(games, pool)
        for turn in range(max_turns):
            live = [i for i, ep in enumerate(episodes) if not ep.done]
            if not live:
                break
            actions: list[str | None] = [None] * len(games)
            for i in live:
                ep = episodes[i]
                actions[i] = self.act(ep.observations[-1], ep.game, turn, rngs[i])
                ep.action_ids.append([])  # no tokens: not a language model
                ep.logprobs.append([])
                ep.allowed.append(None)
                ep.action_texts.append(actions[i])
            results = pool.step(actions)
            for i in live:
                episodes[i].record(actions[i], results[i])
        return end_episodes(episodes)


class ExpertBaseline(Baseline):
    """The environment's expert: its next action from the current state, else the game's
    stored plan at this turn (both come from the game generator's walkthrough)."""

    name = "expert"

    def act(self, obs, game, turn, rng):
        if obs.expert_action:
            return obs.expert_action
        if turn < len(game.expert_plan):
            return game.expert_plan[turn]
        return obs.admissible_commands[0] if obs.admissible_commands else FALLBACK_ACTION


class RandomBaseline(Baseline):
    """Uniformly random admissible command (seeded per episode)."""

    name = "random"
    stochastic = True

    def act(self, obs, game, turn, rng):
        return rng.choice(sorted(obs.admissible_commands)) if obs.admissible_commands else FALLBACK_ACTION


class FirstBaseline(Baseline):
    """Always the first admissible command in sorted order."""

    name = "first"

    def act(self, obs, game, turn, rng):
        return sorted(obs.admissible_commands)[0] if obs.admissible_commands else FALLBACK_ACTION


BASELINES: dict[str, type[Baseline]] = {b.name: b for b in (ExpertBaseline, RandomBaseline, FirstBaseline)}


def get_baseline(name: str) -> Baseline:
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")
    return BASELINES[name]()

