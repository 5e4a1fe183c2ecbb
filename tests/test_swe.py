"""SWE tasks: level grammar, AST mutations, the edit command, task generation on a local package, the env."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

from agentrecipe.config import ConfigError, EnvConfig, RewardConfig
from agentrecipe.envs import swe
from agentrecipe.envs.base import GameSpec
from agentrecipe.envs.build import check_plan
from agentrecipe.envs.swe import mutate, tasks
from agentrecipe.envs.swe.env import WORKDIR, edit_lines, sweep_stale
from agentrecipe.eval.metrics import mean_interval
from agentrecipe.rewards import turn_rewards
from tests.swe_fixture import CALC, SPEC, seed_cache

SNIPPET = """def f(xs, n):
    total = 0
    for x in xs:
        if x > n:
            total += x * 2
    return total
"""


# ------------------------------------------------------------------- levels and options
def test_level_grammar():
    assert tasks.parse_level("cmp-f1") == (("cmp",), 1)
    assert tasks.parse_level("any-f2") == (mutate.KINDS, 2)
    for bad in ("cmp", "cmp-f0", "cmp-f4", "swap-f1", "w2-o3-q4"):
        with pytest.raises(ValueError, match="unknown SWE level"):
            swe.check_level(bad)
    with pytest.raises(ConfigError, match=r"env.ood_levels: unknown SWE level 'any-f9'"):
        EnvConfig(name="swe", levels=["any-f1"], ood_levels=["any-f9"])


def test_options_refuse_unknown_keys_and_unpinned_packages():
    with pytest.raises(ConfigError, match=r"env.swe: unknown option\(s\) \['windw'\]"):
        EnvConfig(name="swe", levels=["any-f1"], ood_levels=[], swe={"windw": 10})
    with pytest.raises(ConfigError, match="pin an exact version"):
        EnvConfig(name="swe", levels=["any-f1"], ood_levels=[], swe={"packages": ["toolz>=1"]})
    assert EnvConfig(name="swe", levels=["op-f1"], ood_levels=[], swe={"p2p": 2}).family_options == {"p2p": 2}


def test_params_file_states_the_defaults():
    import yaml

    params = yaml.safe_load((Path(__file__).parents[1] / "params/env/swe.yaml").read_text())
    assert params["swe"] == swe.DEFAULTS


def test_mean_interval():
    # mean 0.5; s^2 = (0.09 + 0.01 + 0.01 + 0.09) / 3 = 0.0667; half = t(3) 3.182 * sqrt(0.0667 / 4) = 0.4108
    # (the normal's 1.96 gave 0.2530: about 38% too narrow at 4 values)
    low, high = mean_interval([0.2, 0.4, 0.6, 0.8])
    assert low == pytest.approx(0.0892, abs=1e-4) and high == pytest.approx(0.9108, abs=1e-4)
    assert mean_interval([0.5] * 4) == (0.5, 0.5)
    assert mean_interval([0.0, 1.0]) == (0.0, 1.0)  # 0.5 -+ 0.98, clipped
    assert mean_interval([0.3]) == (0.0, 1.0)


# ------------------------------------------------------------------------- mutations
def test_mutations_of_each_kind_on_a_small_function():
    found = {(m.kind, m.line, m.mutated) for m in mutate.candidates("f.py", SNIPPET)}
    assert ("cmp", 4, "        if x >= n:") in found
    assert ("cond", 4, "        if not x > n:") in found
    assert ("op", 5, "            total += x // 2") in found  # * -> //
    assert ("obo", 2, "    total = 1") in found and ("obo", 2, "    total = -1") in found
    assert ("drop", 2, None) in found  # `for` follows at the same indentation
    assert not any(k == "drop" and line == 5 for k, line, _ in found)  # last statement of its block
    assert ("var", 6, "    return n") in found  # first other name of the function
    # Only lines allowed (those the tests execute) are mutated.
    assert {m.line for m in mutate.candidates("f.py", SNIPPET, lines_allowed={4})} == {4}


def test_every_fix_command_undoes_its_mutation():
    lines = SNIPPET.split("\n")
    for m in mutate.candidates("f.py", SNIPPET):
        broken = mutate.apply(SNIPPET, m).split("\n")
        start, end, text = mutate.fix_command(m).split(" ", 4)[2:5]
        fixed, _ = edit_lines(broken, int(start), int(end), text.removeprefix("<<<").strip())
        assert fixed == lines, m


def test_edit_lines_indentation_newlines_insert_and_delete():
    lines = ["def f(x):", "    y = 1", "    return y"]
    # New lines take line START's indentation, plus 4 spaces per leading \t; \n separates lines.
    assert edit_lines(lines, 2, 2, r"if x:\n\ty = 2\nelse:\n\ty = 3")[0] == [
        "def f(x):", "    if x:", "        y = 2", "    else:", "        y = 3", "    return y"]
    assert edit_lines(lines, 3, 2, "y += x") == (["def f(x):", "    y = 1", "    y += x", "    return y"], 1)
    assert edit_lines(lines, 2, 2, "") == (["def f(x):", "    return y"], 0)
    with pytest.raises(ValueError, match="not a range"):
        edit_lines(lines, 3, 5, "x")


# ----------------------------------------------------------------- built tasks (local package)
@pytest.fixture(scope="session")
def calc_tasks(tmp_path_factory):
    """Tasks built from the local calc package: {level: [GameSpec]} plus the options used."""
    root = tmp_path_factory.mktemp("swe")
    opts = {"packages": [SPEC], "cache_dir": str(seed_cache(root / "cache")), "p2p": 2, "timeout": 20.0}
    built = {"any-f1": swe.build_games("any-f1", "train", [50001, 50002, 50003], root / "any-f1" / "train", opts),
             "any-f2": swe.build_games("any-f2", "train", [50001], root / "any-f2" / "train", opts)}
    return built, opts


def test_tasks_hold_failing_and_passing_tests_and_an_issue_without_the_diff(calc_tasks):
    built, _ = calc_tasks
    for level, games in built.items():
        keys = set()
        for game in games:
            task = tasks.read_task(game.path)
            assert len(task["mutations"]) == int(level[-1])
            assert len({m["file"] for m in task["mutations"]}) == len(task["mutations"])
            assert task["FAIL_TO_PASS"] and not set(task["FAIL_TO_PASS"]) & set(task["PASS_TO_PASS"])
            for m in task["mutations"]:
                assert m["original"].strip() not in task["issue"] and (m["mutated"] or "@@").strip() not in task["issue"]
                keys.add((m["file"], m["line"], m["mutated"]))
            assert task["FAIL_TO_PASS"][0] in task["issue"]
            assert game.expert_plan[-2:] == ("run_tests", "submit")
        # No two tasks of a level and split share a bug.
        assert len(keys) == sum(len(json.loads(Path(g.path).read_text())["mutations"]) for g in games)


def test_expert_resolves_every_task_and_dense_rewards_sum_to_the_pass_ratio(calc_tasks):
    built, opts = calc_tasks
    env = swe.make_env(opts)
    try:
        for game in built["any-f1"] + built["any-f2"]:
            check_plan(env, game)  # the build's own check: the plan wins
            obs = env.reset(game)
            deltas = []
            for action in game.expert_plan:
                assert action in obs.admissible_commands, (action, obs.admissible_commands)
                obs, reward, done, info = env.step(action)
                deltas.append(reward)
                assert not info["invalid"]
            assert done and obs.won and obs.score == 1.0
            dense = turn_rewards(deltas, obs.won, [False] * len(deltas), obs.max_score, RewardConfig(mode="dense"))
            assert sum(dense) == pytest.approx(1.0)
            assert env.folder is None  # removed at submit
    finally:
        env.close()


def test_unfixed_submit_scores_the_pass_ratio_and_is_not_resolved(calc_tasks):
    built, opts = calc_tasks
    game = built["any-f1"][0]
    task = tasks.read_task(game.path)
    env = swe.make_env(opts)
    obs = env.reset(game)
    assert obs.score == 0.0 and obs.objective == task["issue"]
    obs, reward, done, info = env.step("submit")
    n_p2p, n = len(task["PASS_TO_PASS"]), len(task["FAIL_TO_PASS"]) + len(task["PASS_TO_PASS"])
    assert done and not obs.won and obs.lost
    assert reward == pytest.approx(n_p2p / n) and info["pass_ratio"] == pytest.approx(n_p2p / n)
    env.close()


def test_admissible_edits_are_bounded_sorted_and_hold_the_fix_only_in_view(calc_tasks):
    built, opts = calc_tasks
    env = swe.make_env(opts)
    for game in built["any-f1"]:
        task = tasks.read_task(game.path)
        m = mutate.Mutation(**task["mutations"][0])
        obs = env.reset(game)
        fix = mutate.fix_command(m)
        assert fix not in obs.admissible_commands  # nothing open yet
        for action in game.expert_plan[:-3]:
            obs, *_ = env.step(action)
        edits = [c for c in obs.admissible_commands if c.startswith("edit ")]
        assert fix in edits and len(edits) <= opts.get("candidate_edits", swe.DEFAULTS["candidate_edits"])
        assert list(obs.admissible_commands) == sorted(obs.admissible_commands)
        obs, *_ = env.step(fix)
        assert fix not in obs.admissible_commands  # the file changed: only distractors now
    env.close()
    assert len(edits) > 1  # distractors are offered too


def test_a_second_reset_gives_the_same_observation(calc_tasks):
    built, opts = calc_tasks
    env = swe.make_env(opts)
    first = env.reset(built["any-f1"][0])
    env.step("run_tests")
    assert env.reset(built["any-f1"][0]) == first
    env.close()


def test_test_files_cannot_be_edited_and_are_restored(calc_tasks):
    built, opts = calc_tasks
    game = built["any-f1"][0]
    env = swe.make_env(opts)
    env.reset(game)
    obs, _, _, info = env.step("edit tests/test_calc.py 1 1 <<< import calc")
    assert info["invalid"] and "test file" in obs.text
    # nor the tests' configuration (before, pytest.ini could load a plugin from the package's code)
    obs, _, _, info = env.step("edit pytest.ini 1 1 <<< [pytest]\\naddopts = -p calc.ops")
    assert info["invalid"] and "tested source files" in obs.text, obs.text
    env.close()


def test_task_folder_without_its_test_list_is_a_clear_error(calc_tasks, tmp_path):
    built, opts = calc_tasks
    src = Path(built["any-f1"][0].path).parent
    broken = tmp_path / "broken-task"
    shutil.copytree(src, broken)
    task = json.loads((broken / "task.json").read_text())
    del task["FAIL_TO_PASS"]
    (broken / "task.json").write_text(json.dumps(task))
    env = swe.make_env(opts)
    with pytest.raises(ValueError, match=rf"{broken}/task.json: SWE task without its FAIL_TO_PASS"):
        env.reset(GameSpec(path=str(broken / "task.json"), level="any-f1", env="swe"))
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}: not a SWE task folder"):
        tasks.read_task(tmp_path)


def test_package_whose_tests_fail_is_skipped_with_a_message(tmp_path):
    files = dict(CALC)
    files["tests/test_calc.py"] += "\n\ndef test_already_broken():\n    assert add(1, 1) == 3\n"
    cache = seed_cache(tmp_path / "cache", files, spec="brokencalc==0.1")
    seed_cache(cache)  # the good one beside it
    opts = {"packages": ["brokencalc==0.1", SPEC], "cache_dir": str(cache), "p2p": 1}
    with pytest.warns(UserWarning, match=r"skipping package: brokencalc==0.1: its own tests do not pass before "
                                         r"mutation: 1 of 12 tests fail"):
        games = swe.build_games("cmp-f1", "train", [50001], tmp_path / "cmp-f1" / "train", opts)
    assert tasks.read_task(games[0].path)["package"] == SPEC
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="no usable package"):
            swe.build_games("cmp-f1", "train", [50001], tmp_path / "x", {**opts, "packages": ["brokencalc==0.1"]})


def test_episode_folders_are_removed_on_close_and_after_a_crash(calc_tasks):
    built, opts = calc_tasks
    env = swe.make_env(opts)
    env.reset(built["any-f1"][0])
    folder = env.folder
    assert folder.is_dir() and folder.parent == WORKDIR
    env.reset(built["any-f1"][1])  # a new episode removes the last one
    assert not folder.exists()
    folder = env.folder
    env.close()
    assert not folder.exists()
    # A worker killed hard leaves its folder; the next env (any process) sweeps it.
    proc = subprocess.run(["python3", "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = WORKDIR / f"{proc.stdout.strip()}-abc"
    (stale / "repo").mkdir(parents=True)
    assert sweep_stale() >= 1 and not stale.exists()
    mine = WORKDIR / f"{os.getpid()}-live"
    mine.mkdir()
    sweep_stale()
    assert mine.exists()  # a live process's folder stays
    mine.rmdir()


def _sdist(folder: Path, files: dict[str, str], top: str = "calc-0.1") -> Path:
    """A .tar.gz sdist of `files` under `top/` in folder/sdists, as `pip download` leaves it."""
    import io
    import tarfile

    archive = folder / "sdists" / f"{top}.tar.gz"
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as t:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return archive


def test_unpack_keeps_only_plain_members_inside_the_destination(tmp_path):
    import io
    import tarfile

    from agentrecipe.envs.swe.packages import unpack

    archive = tmp_path / "x.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        for name in ("pkg/ok.py", "pkg/../../evil.py", "/abs.py"):
            info = tarfile.TarInfo(name)
            info.size = 2
            t.addfile(info, io.BytesIO(b"x\n"))
        link = tarfile.TarInfo("pkg/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(link)
    (tmp_path / "out").mkdir()
    dest = unpack(archive, tmp_path / "out" / "src")
    assert sorted(p.name for p in dest.rglob("*")) == ["ok.py"]
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "out" / "evil.py").exists()


def test_build_workers_sharing_a_package_cache_prepare_it_once(tmp_path, monkeypatch):
    """Two workers (threads here) prepare the same package at once: one unpacks and baselines it,
    the other waits for it (without the lock the second rename failed: 'Directory not empty')."""
    import threading
    import time

    from agentrecipe.envs.swe import packages
    from agentrecipe.envs.swe.sandbox import Limits

    cache = tmp_path / "cache"
    _sdist(cache, CALC)
    unpacked = []
    real_unpack = packages.unpack

    def slow_unpack(archive, dest):
        unpacked.append(dest)
        time.sleep(0.5)  # both workers are past their checks by now, without the lock
        return real_unpack(archive, dest)

    monkeypatch.setattr(packages, "unpack", slow_unpack)
    results, errors = [], []

    def work():
        try:
            results.append(packages.prepare(SPEC, cache, Limits()))
        except Exception as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == [] and len(results) == 2 and len(unpacked) == 1
    assert results[0].tests == results[1].tests and "tests/test_calc.py" in results[0].tests


def test_a_task_depends_on_its_split_not_on_what_the_process_built_before(calc_tasks, tmp_path):
    """Before, bugs taken by earlier calls in the same process were skipped: a build worker reused for
    a second batch gave seed s another task than a fresh one, and batches in different workers
    repeated tasks. Now a call starts afresh, and the build gives an SWE split one job."""
    from agentrecipe.config import EnvConfig
    from agentrecipe.envs.build import plan_jobs

    built, opts = calc_tasks
    again = swe.build_games("any-f1", "train", [50001, 50002, 50003], tmp_path / "any-f1" / "train", opts)
    bugs = lambda games: [tasks.read_task(g.path)["mutations"] for g in games]  # noqa: E731
    assert bugs(again) == bugs(built["any-f1"])
    cfg = EnvConfig(name="swe", levels=["any-f1", "any-f2"], ood_levels=[], n_train=12, n_valid=4, n_test=8, workers=2)
    jobs = plan_jobs(cfg, tmp_path, {})
    assert sorted((job[1], job[2], len(job[3])) for job in jobs) == [
        ("any-f1", "test", 8), ("any-f1", "train", 12), ("any-f1", "valid", 4),
        ("any-f2", "test", 8), ("any-f2", "train", 12), ("any-f2", "valid", 4)]


def test_offered_edits_do_not_depend_on_how_the_task_path_is_written(calc_tasks, monkeypatch):
    """Before, the distractor edits were drawn with the task's path as seed: the same task by a
    relative path (another working directory, another clone) offered other edits."""
    import dataclasses

    built, opts = calc_tasks
    env = swe.make_env(opts)

    def offered(game):
        obs = env.reset(game)
        for action in game.expert_plan[:-3]:
            obs, *_ = env.step(action)
        return [c for c in obs.admissible_commands if c.startswith("edit ")]

    absolute = [offered(game) for game in built["any-f1"]]
    relative = []
    for game in built["any-f1"]:
        monkeypatch.chdir(Path(game.path).parent)
        relative.append(offered(dataclasses.replace(game, path=Path(game.path).name)))
    env.close()
    assert relative == absolute


def test_a_build_into_the_project_root_hides_its_split_folders_only(tmp_path, monkeypatch):
    """A build output holding the interpreter or agentrecipe cannot be hidden from a run (run_limited
    refuses it): hidden_from_runs then hides the task's split folder only."""
    import sys

    from agentrecipe.envs.swe import env as swe_env
    from agentrecipe.envs.swe.env import hidden_from_runs

    monkeypatch.setattr(swe_env, "CODE_ROOT", tmp_path / "site-packages")  # agentrecipe installed, not this checkout
    task_dir = tmp_path / "any-f1" / "train" / "any-f1-s0"
    task_dir.mkdir(parents=True)
    (tmp_path / "_packages").mkdir()
    assert hidden_from_runs(task_dir, {}) == (task_dir.parent.resolve(), tmp_path.resolve())
    monkeypatch.setattr(sys, "prefix", str(tmp_path / ".venv"))  # the project root holds the venv
    assert hidden_from_runs(task_dir, {}) == (task_dir.parent.resolve(),)
