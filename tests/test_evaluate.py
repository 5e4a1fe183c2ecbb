"""Evaluation on real generated games: baselines, an untrained tiny model through the stage, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from agentrecipe.config import EvalConfig
from agentrecipe.envs import registry
from agentrecipe.envs.base import GameSpec
from agentrecipe.envs.manifest import write_manifest
from agentrecipe.envs.pool import EnvPool
from agentrecipe.envs.registry import get_family
from agentrecipe.eval.baselines import get_baseline
from agentrecipe.eval.evaluate import evaluate_policy, games_from_folder, select_games

ROOT = Path(__file__).resolve().parents[1]
IN_DOMAIN, OOD = "w1-o2-q1", "w1-o3-q2"
METRIC_KEYS = {"success", "success_ci_low", "success_ci_high", "score", "score_ci_low", "score_ci_high", "turns_won", "invalid_rate",
               "context_cut", "pass@1", "pass@2", "n", "failed"}

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def envs_dir(tmp_path_factory) -> Path:
    """Two in-domain and one out-of-domain test game, with their manifest (about 10 s)."""
    root = tmp_path_factory.mktemp("envs")
    family = get_family("textworld")
    games = family.build_games(IN_DOMAIN, "test", [1, 2], root / IN_DOMAIN / "test", {})
    games += family.build_games(OOD, "test", [1], root / OOD / "test", {})
    write_manifest(games, root / "manifest.jsonl")
    return root


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    """An untrained tiny model (random weights) with a tokenizer trained on a few game words."""
    from agentrecipe.agent.prompt import SYSTEM_PROMPT
    from agentrecipe.config import ModelConfig
    from agentrecipe.models.registry import build_tiny
    from agentrecipe.models.tokenizer import train_tokenizer

    folder = tmp_path_factory.mktemp("tiny_model")
    texts = [SYSTEM_PROMPT, "go north, go south, take key, open chest, close safe, unlock locker with passkey"] * 20
    tokenizer = train_tokenizer(texts, vocab_size=320)
    cfg = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, vocab_size=320)
    build_tiny(cfg, tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_baselines(envs_dir):
    games = games_from_folder(envs_dir)
    assert {g.level for g in games} == {IN_DOMAIN, OOD} and all(g.split == "test" for g in games)
    cfg = EvalConfig(episodes=2, samples=2, pass_k=[1, 2], max_turns=6, transcripts=1)
    groups = {"in_domain": [IN_DOMAIN], "ood": [OOD]}
    with EnvPool("textworld", {}, n_workers=1, timeout=30) as pool:
        results = {b: evaluate_policy(get_baseline(b), games, pool, cfg, groups, batch_size=2, progress=False)
                   for b in ("expert", "random", "first")}
    expert = results["expert"]
    for level in (IN_DOMAIN, OOD, "in_domain", "ood"):
        cell = expert.summary[level]
        assert cell["success"] == 1.0 and cell["pass@2"] == 1.0 and cell["score"] == 1.0
        assert cell["invalid_rate"] == 0.0 and cell["failed"] == 0
    assert expert.summary[IN_DOMAIN]["n"] == 2 and expert.summary[OOD]["n"] == 1
    assert expert.summary[OOD]["turns_won"] == 2.0  # quest length 2: the expert needs two turns
    # Deterministic baselines play only greedy episodes; the random one also samples for pass@k.
    assert len(expert.records) == len(results["first"].records) == 3
    assert [r["mode"] for r in results["random"].records].count("sampled") == 3 * 2
    assert len(expert.transcripts) == 2  # one per level
    assert expert.transcripts[0]["transcript"][1] == {"role": "assistant", "text": games[0].expert_plan[0],
                                                      "invalid": False}
    for r in results.values():
        assert all(0.0 <= c["success_ci_low"] <= c["success_ci_high"] <= 1.0 for c in r.summary.values())


def test_random_baseline_is_sampled_at_temperature_zero(monkeypatch):
    """The random baseline ignores the temperature. Before, eval.temperature 0 played no sampled
    episodes for it, and its pass@k collapsed to the greedy episode's win."""
    sys.path.insert(0, str(Path(__file__).parent))
    monkeypatch.setitem(registry.FAMILIES, "fake", "fake_envs")
    games = [GameSpec(path=f"fake/{i}", level="fake", env="fake", split="test", seed=i) for i in range(2)]
    cfg = EvalConfig(episodes=2, samples=3, pass_k=[1, 3], temperature=0.0, max_turns=2, transcripts=0)
    with EnvPool("fake", {}, n_workers=0, timeout=10) as pool:
        modes = {b: [r["mode"] for r in evaluate_policy(get_baseline(b), games, pool, cfg, progress=False).records]
                 for b in ("random", "first")}
    assert modes["random"].count("sampled") == 2 * 3 and modes["random"].count("greedy") == 2
    assert modes["first"] == ["greedy", "greedy"]  # deterministic: nothing to sample


def test_select_games_takes_first_by_seed_and_names_missing_levels(envs_dir):
    games = games_from_folder(envs_dir)
    picked = select_games(games, [IN_DOMAIN], 1)
    assert [(g.level, g.seed) for g in picked] == [(IN_DOMAIN, 1)]
    with pytest.raises(ValueError, match="w9-o9-q9"):
        select_games(games, ["w9-o9-q9"], 1)


@pytest.mark.slow
def test_evaluate_stage_writes_every_policy_and_level(envs_dir, tiny_model_dir, tmp_path):
    models = tmp_path / "models"
    for name in ("base", "sft", "rl"):
        shutil.copytree(tiny_model_dir, models / name)
    params = {
        "env": {"levels": [IN_DOMAIN], "ood_levels": [OOD], "workers": 1, "step_timeout": 30.0},
        "agent": {"history": 1, "max_context": 1024},
        "eval": {"episodes": 2, "samples": 2, "pass_k": [1, 2], "temperature": 1.0, "max_turns": 3, "transcripts": 1},
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    out = tmp_path / "eval"
    run = subprocess.run(
        [sys.executable, "-m", "stages.evaluate", "--params", str(tmp_path / "params.yaml"), "--envs", str(envs_dir),
         "--models", str(models), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "AGENTRECIPE_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics) == ["base", "sft", "rl", "expert", "random", "first"]
    for policy, cells in metrics.items():
        assert set(cells) == {IN_DOMAIN, OOD, "in_domain", "ood"}, policy
        for cell in cells.values():
            assert set(cell) == METRIC_KEYS
    assert metrics["expert"]["in_domain"]["success"] == 1.0
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 3 * 3 * (1 + 2) + 3 + 3 * (1 + 2) + 3  # 3 models, expert, random, first on 3 games
    assert {"policy", "level", "game", "mode", "won", "score", "turns", "invalid", "failed"} <= set(episodes[0])
    assert all(e["turns"] <= 3 for e in episodes)
    transcripts = (out / "transcripts.jsonl").read_text().splitlines()
    assert len(transcripts) == 6 * 2  # one per policy and level
    assert "expert" in run.stdout and "success % [95% CI]" in run.stdout

    from agentrecipe.cli import main

    assert main(["show-results", "--metrics", str(out / "metrics.json")]) == 0


def test_evaluate_stage_names_a_missing_model_folder(envs_dir, tmp_path, monkeypatch):
    from stages import evaluate as stage

    (tmp_path / "params.yaml").write_text("{}\n")
    monkeypatch.setattr(sys, "argv", ["evaluate", "--params", str(tmp_path / "params.yaml"), "--envs", str(envs_dir),
                                      "--models", str(tmp_path / "models"), "--out", str(tmp_path / "eval")])
    with pytest.raises(SystemExit, match=str(tmp_path / "models" / "base")):
        stage.main()
    assert not (tmp_path / "eval").exists()


def test_cli_evaluate_on_a_loose_folder_of_games(envs_dir, tmp_path, capsys):
    """Any folder of .z8 + .json files; a game without its .json does not start and is left out, named.
    A game's level comes from its .json (ours say it), not from the folder it was copied into."""
    loose = tmp_path / "games"
    (loose / "mine").mkdir(parents=True)
    src = envs_dir / IN_DOMAIN / "test"
    for f in src.glob(f"{IN_DOMAIN}-s1.*"):
        shutil.copy(f, loose / "mine" / f.name)
    shutil.copy(src / f"{IN_DOMAIN}-s2.z8", loose / "orphan.z8")  # no json beside it
    with pytest.warns(UserWarning, match="orphan.json"):
        games = games_from_folder(loose)
    assert {g.level: len(g.expert_plan) > 0 for g in games} == {IN_DOMAIN: True, "custom": False}

    from agentrecipe.cli import main

    out = tmp_path / "out"
    argv = ["evaluate", "--model", "expert", "first", "--games", str(loose), "--episodes", "1", "--workers", "1",
            "--max-turns", "4", "--params", str(tmp_path / "absent.yaml"), "--out", str(out)]
    with pytest.warns(UserWarning):
        assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["expert"][IN_DOMAIN]["success"] == 1.0
    assert "custom" not in metrics["expert"]  # the orphan does not start: named and left out when loading
    printed = capsys.readouterr()
    assert f"| {IN_DOMAIN} | expert |" in printed.out and "left out" in printed.err and "orphan.z8" in printed.err


def test_loose_textworld_games_get_their_level_from_their_metadata(tw_games):
    """tw-simple games say their settings in the uuid, tw-cooking games in `settings`; ours say the level."""
    import textworld

    from agentrecipe.envs.textworld_env import LEVEL_KEY, level_from_metadata

    for spec in tw_games.values():
        metadata = textworld.Game.load(spec.path.rsplit(".", 1)[0] + ".json").metadata
        assert level_from_metadata(metadata) == spec.level
        foreign = {k: v for k, v in metadata.items() if k != LEVEL_KEY}  # as tw-make writes it
        assert level_from_metadata(foreign) == (None if spec.level.startswith("w") else spec.level)
    cooking = textworld.Game.load(tw_games["cooking"].path.rsplit(".", 1)[0] + ".json").metadata
    cooking = {k: v for k, v in cooking.items() if k != LEVEL_KEY}
    assert level_from_metadata({**cooking, "settings": {**cooking["settings"], "cut": True}}) is None  # no level name


def test_a_manifest_level_without_test_games_is_not_evaluated_on_its_train_games(tmp_path):
    """Before, levels were filtered before the 'test split, else every row' fallback: asking for a
    level with train and valid games only evaluated on them, as if they were held out."""
    from agentrecipe.envs.base import GameSpec

    rows = [GameSpec(str(tmp_path / f"a-{s}.z8"), "a", split=s) for s in ("train", "valid", "test")]
    rows += [GameSpec(str(tmp_path / f"b-{s}.z8"), "b", split=s) for s in ("train", "valid")]
    write_manifest(rows, tmp_path / "manifest.jsonl")
    with pytest.warns(UserWarning, match="level.s. b have no test games; left out"):
        assert [(g.level, g.split) for g in games_from_folder(tmp_path)] == [("a", "test")]
    assert [(g.level, g.split) for g in games_from_folder(tmp_path, ["a"])] == [("a", "test")]
    with pytest.raises(ValueError, match="level.s. b have no test games"):
        games_from_folder(tmp_path, ["b"])
    # a manifest without a test split (an ad hoc list of games): every row, of the levels asked for
    write_manifest([g for g in rows if g.split != "test"], tmp_path / "manifest.jsonl")
    assert [(g.level, g.split) for g in games_from_folder(tmp_path, ["b"])] == [("b", "train"), ("b", "valid")]


def test_select_games_names_the_levels_it_has():
    from agentrecipe.envs.base import GameSpec

    with pytest.raises(ValueError, match=r"no games for level\(s\) b; have a$"):  # before: 'have a, b'
        select_games([GameSpec("g.z8", "a", split="test")], ["a", "b"], 1)
