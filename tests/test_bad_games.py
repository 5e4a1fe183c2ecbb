"""One broken game must not sink an evaluation or a run (issue 13, defects 2 and 8): a folder's games
are checked when loaded, and a run built on too many failed episodes fails loudly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from agentrecipe.envs.check_games import failed_share_error
from stages.rl import failure_guard

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def loose_games(tmp_path_factory) -> Path:
    """Three loose TextWorld games (with their .json) and a fourth whose story file is truncated."""
    from agentrecipe.envs.textworld_env import build_games

    root = tmp_path_factory.mktemp("loose")
    games = build_games("w1-o2-q1", "test", [1, 2, 3, 4], root, {})
    broken = Path(games[1].path)
    broken.write_bytes(broken.read_bytes()[:100_000])  # the interpreter dies on it: "Story file read error"
    return root


def test_cli_names_and_leaves_out_a_corrupt_game_and_plays_every_other(loose_games, tmp_path, capsys):
    from agentrecipe.cli import main

    params = tmp_path / "params.yaml"  # eval.episodes = 2 must not cut a loose folder down to two games
    params.write_text("eval: {episodes: 2, samples: 1, pass_k: [1], max_turns: 4}\nenv: {workers: 1}\n")
    out = tmp_path / "out"
    assert main(["evaluate", "--model", "expert", "--games", str(loose_games), "--params", str(params),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "w1-o2-q1-s2.z8" in printed.err and "Story file read error" in printed.err and "exit code" in printed.err
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert sorted(Path(e["game"]).name for e in episodes) == ["w1-o2-q1-s1.z8", "w1-o2-q1-s3.z8", "w1-o2-q1-s4.z8"]
    assert sorted(e["seed"] for e in episodes) == [0, 2, 3]  # numbered in file order, not all 0
    assert all(e["won"] and not e["failed"] for e in episodes)


def test_cli_fails_when_no_game_starts(loose_games, tmp_path, capsys):
    from agentrecipe.cli import main

    only_broken = tmp_path / "broken"
    only_broken.mkdir()
    for f in loose_games.glob("w1-o2-q1-s2.*"):
        shutil.copy(f, only_broken / f.name)
    assert main(["evaluate", "--model", "expert", "--games", str(only_broken), "--workers", "1",
                 "--params", str(tmp_path / "absent.yaml"), "--out", str(tmp_path / "out")]) == 1
    assert "no game in" in capsys.readouterr().err


def test_too_many_failed_episodes_fail_the_evaluation():
    ok = {"policy": "rl", "failed": False, "game": "g", "error": ""}
    bad = {"policy": "rl", "failed": True, "game": "broken.z8", "error": "worker 0 died (exit code 1)"}
    assert failed_share_error([ok] * 9 + [bad], 0.1, "eval.max_failed_share") is None  # 10%: at the limit
    error = failed_share_error([ok] * 8 + [bad] * 2, 0.1, "eval.max_failed_share")
    assert "2 of 10 episodes of rl failed" in error and "eval.max_failed_share=0.1" in error and "broken.z8" in error
    # per policy: a baseline's clean episodes do not hide the model's failures
    expert = [{**ok, "policy": "expert"}] * 100
    assert "of rl failed" in failed_share_error(expert + [ok] * 8 + [bad] * 2, 0.1, "k")
    # per mode: success comes from the greedy episodes alone. Before, 10 of 20 greedy episodes
    # failed unseen beside 80 clean sampled ones (10 of 100 pooled), a 50% success built on failures.
    greedy = [{**ok, "mode": "greedy"}] * 10 + [{**bad, "mode": "greedy"}] * 10
    sampled = [{**ok, "mode": "sampled"}] * 80
    assert "10 of 20 greedy episodes of rl failed" in failed_share_error(greedy + sampled, 0.1, "k")


def test_rl_stops_once_too_many_of_its_episodes_failed():
    """On the run's counts (all ranks, kept across a resume: rl_train's `rollout/*_total`)."""
    logged = []
    guarded = failure_guard(lambda step, stats: logged.append(step), limit=0.25)
    guarded(1, {"rollout/failed_total": 1.0, "rollout/episodes_total": 4.0})  # 1 of 4: at the limit
    guarded(2, {"rollout/failed_total": 1.0, "rollout/episodes_total": 8.0})
    with pytest.raises(SystemExit, match=r"4 of 12 RL episodes failed by step 3.*rl.max_failed_share=0.25"):
        guarded(3, {"rollout/failed_total": 4.0, "rollout/episodes_total": 12.0})  # 4 of 12: above
    assert logged == [1, 2, 3]  # the step is logged before the run stops


@pytest.mark.parametrize("limit,failed,played", [(0.29, 29, 100), (0.57, 57, 100), (0.58, 29, 50), (0.7, 63, 90)])
def test_a_failed_share_exactly_at_the_limit_is_not_over_it(limit, failed, played):
    # in floats limit * played is just under `failed` for these (0.29 * 100 = 28.999...)
    assert limit * played < failed
    ok, bad = {"policy": "rl", "mode": "greedy"}, {"policy": "rl", "mode": "greedy", "failed": True}
    assert failed_share_error([ok] * (played - failed) + [bad] * failed, limit, "eval.max_failed_share") is None
    assert failed_share_error([ok] * (played - failed - 1) + [bad] * (failed + 1), limit, "k") is not None
    failure_guard(lambda step, stats: None, limit)(1, {"rollout/failed_total": float(failed),
                                                       "rollout/episodes_total": float(played)})
