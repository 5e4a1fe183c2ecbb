"""Evaluate a policy (a model folder or a baseline) on held-out games.

Per game: one greedy episode (temperature 0) gives success, score, turns and
invalid-action rate; `samples` episodes at `temperature` give pass@k. A policy
whose episodes cannot differ (greedy-only baselines, temperature 0) plays no
sampled episodes: each of its tries would repeat the greedy one. Everything
runs through one `EnvPool`, in batches of `batch_size` episodes, greedy and
sampled episodes side by side in one batch (one temperature per episode), on
the rollout engine's fast path (KV caches kept across turns); a crashed or
hung environment fails its episode (counted as not won, never raised).

    pool = EnvPool("textworld", {}, n_workers=2, timeout=30)
    result = evaluate_policy(ModelPolicy.from_folder(folder, agent_cfg), games, pool, eval_cfg)
    write_results(out_dir, [result])
"""

from __future__ import annotations

import json
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from tqdm import tqdm

from agentrecipe.agent.prompt import PromptEncoder
from agentrecipe.config import AgentConfig, EvalConfig
from agentrecipe.envs.base import GameSpec
from agentrecipe.envs.manifest import MANIFEST_NAME, read_manifest
from agentrecipe.eval.baselines import BASELINES, get_baseline
from agentrecipe.eval.metrics import summarize_levels
from agentrecipe.rollout.engine import RolloutSettings, run_episodes
from agentrecipe.rollout.episode import Episode
from agentrecipe.rollout.hf_backend import HFBackend

GAME_SUFFIXES = (".z8", ".ulx")
CUSTOM_LEVEL_NAME = "custom"


class Policy(Protocol):
    name: str
    stochastic: bool  # episodes differ by seed: sampled episodes are played for pass@k
    uses_temperature: bool  # False: random at any temperature, so sampled even at eval.temperature 0

    def play(self, games: list[GameSpec], pool, max_turns: int, temperatures: list[float],
             seed: int | None) -> list[Episode]:
        """One episode per game, game i at temperatures[i] (0 = greedy)."""


class ModelPolicy:
    """A causal LM from a HF folder, playing through the rollout engine."""

    stochastic = True
    uses_temperature = True

    def __init__(self, name: str, model, tokenizer, agent: AgentConfig, device: str = "cpu", top_p: float = 1.0):
        self.name = name
        self.agent = agent
        self.top_p = top_p
        self.backend = HFBackend(model.to(device), tokenizer.pad_token_id, tokenizer.eos_token_id)
        self.encoder = PromptEncoder(tokenizer, agent.show_admissible, agent.history)

    @classmethod
    def from_folder(cls, folder: str | Path, agent: AgentConfig, name: str | None = None, device: str = "cpu",
                    dtype: torch.dtype = torch.float32) -> ModelPolicy:
        from agentrecipe.models.registry import load_model

        model, tokenizer = load_model(folder, dtype)
        return cls(name or Path(folder).name, model, tokenizer, agent, device)

    def play(self, games, pool, max_turns, temperatures, seed):
        settings = RolloutSettings.from_agent(self.agent, max_turns, 1.0, self.top_p, seed)
        return run_episodes(games, self.backend, self.encoder, pool, settings, temperatures=temperatures)


def load_policy(spec: str, agent: AgentConfig, device: str = "cpu", dtype: torch.dtype = torch.float32,
                name: str | None = None) -> Policy:
    """A baseline by name (expert, random, first) or a model from a HF folder."""
    if spec in BASELINES and not Path(spec).is_dir():
        return get_baseline(spec)
    return ModelPolicy.from_folder(spec, agent, name, device, dtype)


@dataclass
class EvalResult:
    policy: str
    records: list[dict] = field(default_factory=list)
    """One flat record per episode (see `episode_record`)."""
    transcripts: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    """{level or group: metrics cell} (see `agentrecipe.eval.metrics.summarize`)."""


def episode_record(policy: str, mode: str, ep: Episode) -> dict:
    rec = {"policy": policy, "mode": mode, **ep.summary()}
    if ep.observations and ep.observations[0].max_score:  # what the game itself reports
        rec["max_score"] = float(ep.observations[0].max_score)
    return rec


def select_games(games: list[GameSpec], levels: list[str], n: int) -> list[GameSpec]:
    """The first `n` games by seed of each level, levels in the given order."""
    by_level: dict[str, list[GameSpec]] = defaultdict(list)
    for g in games:
        by_level[g.level].append(g)
    missing = [lvl for lvl in levels if not by_level.get(lvl)]  # .get: [] would add the level to `have`
    if missing:
        raise ValueError(f"no games for level(s) {', '.join(missing)}; have {', '.join(sorted(by_level)) or 'none'}")
    return [g for lvl in levels for g in sorted(by_level[lvl], key=lambda g: g.seed)[:n]]


def evaluate_policy(policy: Policy, games: list[GameSpec], pool, cfg: EvalConfig,
                    groups: dict[str, list[str]] | None = None, batch_size: int = 32,
                    progress: bool = True) -> EvalResult:
    """Greedy and sampled episodes of `policy` on `games`; records, transcripts and per-level summary.

    `groups` adds pooled cells, e.g. {"in_domain": env.levels, "ood": env.ood_levels}.
    Episodes play `batch_size` at a time, greedy first, then sampled, a batch mixing both where
    it straddles them. Batch b of the run is seeded with `cfg.seed * 100_000 + b`, so a rerun
    repeats it exactly.
    """
    # A model at temperature 0 would replay its greedy episode; the random baseline ignores the
    # temperature, and without sampled episodes its pass@k collapsed to the greedy episode's win.
    sampled = policy.stochastic and (cfg.temperature > 0 or not policy.uses_temperature)
    plan = [(g, "greedy") for g in games]
    if sampled:
        plan += [(g, "sampled") for g in games for _ in range(cfg.samples)]
    result = EvalResult(policy.name)
    episodes: list[tuple[str, Episode]] = []
    bar = tqdm(total=len(plan), desc=f"eval {policy.name}", unit="ep", disable=not progress)
    for b, start in enumerate(range(0, len(plan), batch_size)):
        chunk = plan[start:start + batch_size]
        temperatures = [0.0 if mode == "greedy" else cfg.temperature for _, mode in chunk]
        played = policy.play([g for g, _ in chunk], pool, cfg.max_turns, temperatures, cfg.seed * 100_000 + b)
        episodes += [(mode, ep) for (_, mode), ep in zip(chunk, played)]
        bar.update(len(chunk))
        bar.set_postfix(failed=sum(ep.failed for _, ep in episodes))
    bar.close()

    result.records = [episode_record(policy.name, mode, ep) for mode, ep in episodes]
    shown: dict[str, int] = defaultdict(int)
    for (mode, ep), rec in zip(episodes, result.records):
        if mode == "greedy" and shown[ep.game.level] < cfg.transcripts:
            shown[ep.game.level] += 1
            result.transcripts.append({**{k: rec[k] for k in ("policy", "level", "game", "mode", "won", "score",
                                                              "turns", "failed", "error")},
                                       "transcript": ep.transcript()})
    result.summary = summarize_levels(result.records, cfg.pass_k, groups)
    return result


def write_results(out_dir: str | Path, results: list[EvalResult]) -> Path:
    """metrics.json ({policy: {level: cell}}), episodes.jsonl and transcripts.jsonl under out_dir.

    Each file is written beside its old version and renamed over it (never half-written);
    metrics.json last, so it never describes episodes that are not on disk."""
    from agentrecipe.train.checkpoint import replace_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = {r.policy: r.summary for r in results}
    replace_file(out / "episodes.jsonl",
                 "".join(json.dumps(rec, sort_keys=True) + "\n" for r in results for rec in r.records))
    replace_file(out / "transcripts.jsonl", "".join(json.dumps(t) + "\n" for r in results for t in r.transcripts))
    return replace_file(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")


# ----------------------------------------------------------------- ad hoc games
def games_from_folder(folder: str | Path, levels: list[str] | None = None) -> list[GameSpec]:
    """Games to evaluate on: a folder with a manifest.jsonl (its test split; every row of a manifest
    without a test split; a level without test games is left out with a warning, refused when
    asked for by `levels`: its train and valid games are not test games), any
    folder of TextWorld .z8/.ulx files, each with the .json TextWorld wrote beside it, or a folder
    of ALFWorld game folders (``game.tw-pddl``, official layout or any part of it).

    A loose TextWorld game's level is read from its .json metadata (ours, tw-simple and tw-cooking
    games say it), else it is the game's folder under `folder` ('custom' at the top); max score
    and expert plan come from the .json. A game without its .json is kept with a warning:
    TextWorld then cannot list admissible commands and its episodes will fail. An ALFWorld game's
    level is its task type.
    """
    from agentrecipe.envs.alfworld.importer import games_in_folder

    folder = Path(folder)
    manifest = folder / MANIFEST_NAME
    if manifest.exists():
        games = read_manifest(manifest)
        test = [g for g in games if g.split == "test"]
        if not test:  # an ad hoc manifest: every row is a test game
            return [g for g in games if levels is None or g.level in levels]
        untested = [lvl for lvl in dict.fromkeys(g.level for g in games) if lvl not in {g.level for g in test}]
        if levels is not None and (asked := [lvl for lvl in levels if lvl in untested]):
            raise ValueError(f"{manifest}: level(s) {', '.join(asked)} have no test games (only train/valid ones, "
                             "which are not held out)")
        if untested and levels is None:
            warnings.warn(f"{manifest}: level(s) {', '.join(untested)} have no test games; left out", stacklevel=2)
        return [g for g in test if levels is None or g.level in levels]
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder of games")
    games = []
    for path in sorted(p for p in folder.rglob("*") if p.suffix in GAME_SUFFIXES):
        rel = path.relative_to(folder)
        games.append(_game_from_file(path, rel.parts[0] if len(rel.parts) > 1 else CUSTOM_LEVEL_NAME))
    alfworld = games_in_folder(folder)
    if games and alfworld:
        raise ValueError(f"{folder}: holds both TextWorld ({len(games)}) and ALFWorld ({len(alfworld)}) games; "
                         "evaluate one family at a time")
    games = [g for g in games or alfworld if levels is None or g.level in levels]
    if not games:
        raise FileNotFoundError(f"{folder}: no manifest.jsonl, no {'/'.join(GAME_SUFFIXES)} games and no ALFWorld "
                                "game.tw-pddl" + (f" of level(s) {', '.join(levels)}" if levels else ""))
    return games


def _game_from_file(path: Path, folder_level: str) -> GameSpec:
    from agentrecipe.envs.textworld_env import level_from_metadata

    meta = path.with_suffix(".json")
    max_score, plan, level = 1.0, (), folder_level
    if not meta.exists():
        warnings.warn(f"{path}: no {meta.name} beside it; TextWorld needs it for admissible commands, "
                      "so this game's episodes will likely fail", stacklevel=3)
    else:
        try:
            import textworld

            game = textworld.Game.load(str(meta))
            max_score = float(game.max_score) or 1.0
            plan = tuple(game.metadata.get("walkthrough") or game.walkthrough or ())
            level = level_from_metadata(game.metadata) or folder_level
        except Exception as e:  # noqa: BLE001 - a foreign or old json: play it without a plan
            warnings.warn(f"{meta}: cannot read max score / walkthrough ({type(e).__name__}: {e})", stacklevel=3)
    return GameSpec(path=str(path), level=level, env="textworld", split="test", seed=0, max_score=max_score,
                    expert_plan=plan)
