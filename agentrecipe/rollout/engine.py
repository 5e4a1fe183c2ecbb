"""The multi-turn rollout loop: B episodes in lock-step, or two halves in ping-pong.

Each turn: build every live episode's prompt from cached token pieces, generate
all next actions in one batched backend call (keyed by episode, so the backend
may keep each episode's KV cache and prefill only the new tokens), step all
environments through the pool, record observations. Episodes end when the game
ends, at the turn limit, or when the prompt would outgrow the context. A crashed
or hung environment fails its episode only (recorded, counted, never raised).

With `overlap_env`, the episodes play as two halves: while the pool steps one
half (in a worker thread; the pool waits on its worker processes without the
GIL), the model generates the other half's next actions. Only one `pool.step`
is in flight at a time (the pool is not re-entrant).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tqdm import tqdm

from agentrecipe.agent.decoding import TokenTrie
from agentrecipe.agent.prompt import INVALID_REPLY, PromptEncoder, fits_context, parse_reply
from agentrecipe.envs.base import GameSpec
from agentrecipe.rollout.backend import GenerationBackend, SamplingParams
from agentrecipe.rollout.episode import Episode, end_episodes, start_episodes


@dataclass
class RolloutSettings:
    max_turns: int = 20
    decoding: str = "admissible"
    """`free` or `admissible` (constrained to the admissible commands)."""
    max_context: int = 1024
    max_action_tokens: int = 24
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    overlap_env: bool = False
    """Two halves in ping-pong: one half's env step overlaps the other's generation.
    Each backend call then samples half the batch, so the draws (and results) differ from lock-step."""

    @classmethod
    def from_agent(cls, agent, max_turns: int, temperature: float, top_p: float = 1.0,
                   seed: int | None = None, overlap_env: bool = False) -> "RolloutSettings":
        """Settings for a policy configured by an AgentConfig (decoding, context and reply limits)."""
        return cls(max_turns, agent.decoding, agent.max_context, agent.max_action_tokens, temperature, top_p, seed,
                   overlap_env)


def run_episodes(
    games: list[GameSpec],
    backend: GenerationBackend,
    encoder: PromptEncoder,
    pool,
    settings: RolloutSettings,
    progress: bool = False,
    temperatures: list[float] | None = None,
) -> list[Episode]:
    """Play one episode per game (a game may repeat, e.g. a GRPO group) and return them in order.

    `temperatures` (one per game, 0 = greedy) overrides `settings.temperature`, so greedy and
    sampled episodes can share one batch.
    """
    if temperatures is not None and len(temperatures) != len(games):
        raise ValueError(f"temperatures: {len(temperatures)} values for {len(games)} games")
    play = _Rollout(start_episodes(games, pool), backend, encoder, settings, temperatures)
    n = len(games)
    groups = [list(range(n // 2)), list(range(n // 2, n))] if settings.overlap_env and n >= 2 else [list(range(n))]
    bar = tqdm(total=settings.max_turns, desc="turns", leave=False, disable=not progress)
    try:
        if len(groups) == 1:
            for turn in range(settings.max_turns):
                batch, actions = play.generate(groups[0], turn, turn)
                if not batch:
                    break
                play.record(batch, actions, pool.step(actions))
                bar.update(1)
        else:
            _ping_pong(play, groups, pool, settings.max_turns, bar)
    finally:
        backend.release(list(range(n)))
        bar.close()
    return end_episodes(play.episodes)


def _ping_pong(play: "_Rollout", groups: list[list[int]], pool, max_turns: int, bar) -> None:
    """Alternate the groups: generate group g's turn while the pool steps the other group's last one."""
    turn = [0] * len(groups)
    pending = None  # (batch, actions, future of pool.step)
    with ThreadPoolExecutor(max_workers=1) as ex:
        while True:
            for g, members in enumerate(groups):
                batch = []
                if turn[g] < max_turns:
                    batch, actions = play.generate(members, turn[g], turn[g] * len(groups) + g)
                    turn[g] = turn[g] + 1 if batch else max_turns  # an empty batch: this group is over
                    if g == 0 and batch:
                        bar.update(1)
                if pending is not None:
                    play.record(pending[0], pending[1], pending[2].result())
                    pending = None
                if batch:
                    pending = (batch, actions, ex.submit(pool.step, actions))
            if pending is None and all(t >= max_turns for t in turn):
                return


class _Rollout:
    """The episodes of one `run_episodes` call and the two halves of a turn: generate, then record."""

    def __init__(self, episodes: list[Episode], backend, encoder: PromptEncoder, settings: RolloutSettings,
                 temperatures: list[float] | None):
        self.episodes, self.backend, self.encoder, self.settings = episodes, backend, encoder, settings
        self.temperatures = temperatures
        self.caches: list[dict] = [{} for _ in episodes]
        self.command_ids: dict[str, list[int]] = {}  # commands repeat across turns and episodes: tokenise once

    def generate(self, members: list[int], turn: int, call: int) -> tuple[list[int], list[str | None]]:
        """Next actions of the live episodes among `members`: (episodes in the batch, full-length action list)."""
        settings, encoder = self.settings, self.encoder
        prompts, tries, batch, ended = [], [], [], []
        for i in members:
            ep = self.episodes[i]
            if ep.done:
                continue
            ids, _, _ = encoder.prompt(ep.observations, ep.action_ids, self.caches[i])
            trie = (_admissible_trie(encoder, ep, self.caches[i], self.command_ids)
                    if settings.decoding == "admissible" else None)
            longest = self.caches[i]["longest"] if trie is not None else None
            if not fits_context(len(ids), settings.max_action_tokens, longest, settings.max_context):
                ep.done, ep.truncated, ep.context_cut = True, True, True
                ended.append(i)
                continue
            prompts.append(ids)
            tries.append(trie)
            batch.append(i)
        self.backend.release(ended)
        actions: list[str | None] = [None] * len(self.episodes)
        if not batch:
            return batch, actions
        max_new = settings.max_action_tokens
        if settings.decoding == "admissible":  # a command must fit whole
            max_new = max([max_new] + [self.caches[i]["longest"] for i in batch])
        seed = None if settings.seed is None else settings.seed * 100_003 + call
        temperature = settings.temperature if self.temperatures is None else [self.temperatures[i] for i in batch]
        params = SamplingParams(temperature, settings.top_p, max_new, seed)
        gens = self.backend.generate(prompts, params, tries if settings.decoding == "admissible" else None, keys=batch)
        for i, gen in zip(batch, gens):
            ep = self.episodes[i]
            ep.action_ids.append(gen.ids)
            ep.logprobs.append(gen.logprobs)
            ep.allowed.append(gen.allowed)
            if settings.decoding == "admissible":
                # constrained to the admissible commands: the reply is one of them, as written (parse_reply
                # refused "0", a ScienceWorld gold step, and commands over its length limit)
                action = self.caches[i]["commands"].get(tuple(gen.ids)) if gen.finished else None
            else:
                text = encoder.tokenizer.decode([t for t in gen.ids if t != encoder.eos_id], skip_special_tokens=True)
                action = parse_reply(text) if gen.finished else None
            ep.action_texts.append(action)
            actions[i] = action
        return batch, actions

    def record(self, batch: list[int], actions: list[str | None], results) -> None:
        """The pool's answers to one generate call's actions; episodes that ended drop their kept caches."""
        for i in batch:
            ep, res = self.episodes[i], results[i]
            if actions[i] is None:
                ep.record_invalid_reply(INVALID_REPLY)
            else:
                ep.record(actions[i], res)
        self.backend.release([i for i in batch if self.episodes[i].done])


def _admissible_trie(encoder: PromptEncoder, ep: Episode, cache: dict, command_ids: dict) -> TokenTrie:
    """Trie over the current observation's admissible commands (eos-terminated token ids, memoised in command_ids)."""
    obs = ep.observations[-1]
    commands = obs.admissible_commands or ("look",)
    for c in commands:
        if c not in command_ids:
            command_ids[c] = encoder.encode_action(c)
    seqs = [command_ids[c] for c in commands]
    cache["longest"] = max(len(s) for s in seqs)
    cache["commands"] = {tuple(ids): c for c, ids in zip(commands, seqs)}  # a finished reply -> its command
    return TokenTrie(seqs)
