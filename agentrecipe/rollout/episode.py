"""One played episode, as the policy generated it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from agentrecipe.envs.base import GameSpec, Observation


@dataclass
class Episode:
    game: GameSpec
    observations: list[Observation] = field(default_factory=list)
    """Observation before each turn, plus the final one (len = turns + 1 when the game went on)."""
    action_ids: list[list[int]] = field(default_factory=list)
    """Token ids each turn's reply was sampled as (eos included when generated)."""
    logprobs: list[list[float]] = field(default_factory=list)
    allowed: list[list[list[int]] | None] = field(default_factory=list)
    """Per turn, per token: the ids constrained decoding allowed (None for free decoding)."""
    action_texts: list[str | None] = field(default_factory=list)
    """Parsed action of each turn (None: malformed reply, counted invalid)."""
    score_deltas: list[float] = field(default_factory=list)
    invalid: list[bool] = field(default_factory=list)
    won: bool = False
    lost: bool = False
    done: bool = False
    truncated: bool = False
    """Ended by the turn limit or the context limit, not by the game."""
    context_cut: bool = False
    """Ended because the next prompt and reply no longer fit agent.max_context (truncated too)."""
    failed: bool = False
    """The environment crashed or hung; the episode is recorded but not trained on."""
    error: str = ""

    def record(self, action: str, res) -> None:
        """Record the environment's answer (an EnvPool StepResult, or None) to `action`."""
        if res is None or res.failed:
            self.failed = self.done = True
            self.error = "no result" if res is None else res.error
            self.score_deltas.append(0.0)
            self.invalid.append(False)
            return
        admissible = self.observations[-1].admissible_commands
        self.observations.append(res.obs)
        self.score_deltas.append(float(res.reward))
        self.invalid.append(bool(res.info.get("invalid", action not in admissible)))
        self.won, self.lost, self.done = bool(res.obs.won), bool(res.obs.lost), bool(res.done)

    def record_invalid_reply(self, feedback: str) -> None:
        """A malformed reply: the agent is told `feedback`, the game does not move."""
        self.observations.append(dataclasses.replace(self.observations[-1], text=feedback))
        self.score_deltas.append(0.0)
        self.invalid.append(True)

    @property
    def turns(self) -> int:
        return len(self.action_ids)

    @property
    def score(self) -> float:
        return float(sum(self.score_deltas))

    def summary(self) -> dict:
        return {
            "game": self.game.path,
            "level": self.game.level,
            "seed": self.game.seed,
            "won": self.won,
            "lost": self.lost,
            "score": self.score,
            "max_score": self.game.max_score,
            "turns": self.turns,
            "invalid": int(sum(self.invalid)),
            "truncated": self.truncated,
            "context_cut": self.context_cut,
            "failed": self.failed,
            "error": self.error,
        }

    def transcript(self) -> list[dict]:
        """Readable turns: observation then action, for inspection."""
        rows = []
        for t, obs in enumerate(self.observations):
            rows.append({"role": "user", "text": obs.text, "admissible": list(obs.admissible_commands)})
            if t < len(self.action_texts):
                rows.append({"role": "assistant", "text": self.action_texts[t], "invalid": self.invalid[t]})
        return rows


def start_episodes(games: list[GameSpec], pool) -> list[Episode]:
    """Reset one environment slot per game; a failed reset gives a failed (done) episode."""
    episodes = [Episode(game=g) for g in games]
    for i, (ep, obs) in enumerate(zip(episodes, pool.reset(list(games)))):
        if obs is None:
            ep.failed = ep.done = True
            ep.error = "reset failed: " + str(getattr(pool, "last_errors", {}).get(i, "unknown error"))
        else:
            ep.observations.append(obs)
    return episodes


def end_episodes(episodes: list[Episode]) -> list[Episode]:
    """Episodes still running at the turn limit are truncated."""
    for ep in episodes:
        if not ep.done:
            ep.done = ep.truncated = True
    return episodes
