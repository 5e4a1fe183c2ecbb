"""Replay a game's expert plan: the source of demonstrations and of the tiny tokenizer's corpus."""

from __future__ import annotations

from agentrecipe.agent.prompt import INVALID_REPLY, SYSTEM_PROMPT, user_text
from agentrecipe.envs.base import Env, GameSpec, Observation


def replay_expert(env: Env, game: GameSpec, max_turns: int = 200) -> tuple[list[Observation], list[str]]:
    """Play the game's expert plan (or the env's next expert action); return (observations, actions).

    observations has one more entry than actions (the final state). Raises if the expert does not win.
    """
    obs = env.reset(game)
    observations, actions = [obs], []
    plan = list(game.expert_plan)
    while not obs.won and len(actions) < max_turns:
        action = plan[len(actions)] if len(actions) < len(plan) else obs.expert_action
        if not action:
            break
        obs, _, done, _ = env.step(action)
        observations.append(obs)
        actions.append(action)
        if done:
            break
    if not obs.won:
        raise ValueError(f"{game.path}: the expert plan did not win the game after {len(actions)} actions")
    return observations, actions


def corpus_texts(observations: list[Observation], actions: list[str]) -> list[str]:
    """Every piece of text the agent will read or write in this episode."""
    texts = [user_text(observations[0], True, with_goal=True)]
    texts += [user_text(o, True, with_goal=False) for o in observations[1:]]
    return texts + list(actions) + [SYSTEM_PROMPT, INVALID_REPLY]


def replay_games(env, games: list[GameSpec], desc: str = "expert replays"):
    """Yield (game, observations, actions) of each game's expert replay, for an EnvConfig `env`:
    through its servers one game at a time when it lists any (`env.remote`), else in one
    in-process environment."""
    from tqdm import tqdm

    if env.remote:
        from agentrecipe.envs.pool import open_pool
        from agentrecipe.envs.remote_pool import PoolEnv

        with open_pool(env.name, env.family_options, 1, env.step_timeout, env.remote) as pool:
            served = PoolEnv(pool)
            for game in tqdm(games, desc=desc):
                yield (game, *replay_expert(served, game))
        return
    from agentrecipe.envs.registry import get_family

    local = get_family(env.name).make_env(env.family_options)
    try:
        for game in tqdm(games, desc=desc):
            yield (game, *replay_expert(local, game))
    finally:
        local.close()
