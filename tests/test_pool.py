"""EnvPool: episodes in worker processes; an env that raises, hangs or dies fails only its episodes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from agentrecipe.envs import registry
from agentrecipe.envs.base import GameSpec
from agentrecipe.envs.pool import EnvPool

sys.path.insert(0, str(Path(__file__).parent))  # spawned workers import fake_envs by name
import fake_envs  # noqa: E402

GAMES = [GameSpec(path=f"fake/{i}", level="fake", env="fake", seed=i) for i in range(4)]


@pytest.fixture
def fake_family(monkeypatch):
    monkeypatch.setitem(registry.FAMILIES, "fake", fake_envs.__name__)
    return "fake"


@pytest.mark.parametrize("n_workers", [0, 2])
def test_pool_plays_episodes(fake_family, n_workers):
    with EnvPool(fake_family, {}, n_workers=n_workers, timeout=10) as pool:
        obs = pool.reset(GAMES)
        assert [o.text for o in obs] == [f"start {i}" for i in range(4)]
        res = pool.step(["a", None, "win", "b"])
        assert res[1] is None
        assert res[0].obs.text == "a 1 in game 0" and not res[0].done
        assert res[2].done and res[2].reward == 1.0 and res[2].obs.won
        res = pool.step(["c", None, None, "d"])
        assert res[0].obs.text == "c 2 in game 0" and res[3].obs.text == "d 2 in game 3"
        assert pool.failures == 0


def test_pool_survives_an_env_that_raises(fake_family):
    with EnvPool(fake_family, {}, n_workers=2, timeout=10) as pool:
        pool.reset(GAMES)
        res = pool.step(["raise", "a", "b", "c"])
        assert res[0].failed and res[0].done and "fake env error" in res[0].error
        assert not any(r.failed for r in res[1:])
        assert pool.failures == 1
        assert pool.step(["a", "b", None, None])[1].obs.text == "b 2 in game 1"  # same worker, still fine
        assert pool.reset([GAMES[0]])[0].text == "start 0"  # a failed slot can start again


def test_pool_survives_hang_and_crash(fake_family):
    with EnvPool(fake_family, {}, n_workers=2, timeout=1.0) as pool:
        pool.reset(GAMES)  # slots 0, 2 in worker 0; slots 1, 3 in worker 1
        start = time.monotonic()
        res = pool.step(["hang", "a", None, "b"])
        assert time.monotonic() - start < 8
        assert res[0].failed and "no answer within 1 s" in res[0].error and "fake/0" in res[0].error
        assert not res[1].failed and not res[3].failed
        # Slot 2 shared the killed worker: its episode was replayed on the fresh one and goes on.
        res = pool.step([None, "c", "d", None])
        assert res[2].obs.text == "d 1 in game 2" and res[1].obs.text == "c 2 in game 1"
        res = pool.step([None, "crash", None, "e"])
        assert res[1].failed and "died" in res[1].error and "exit code 3" in res[1].error and "fake/1" in res[1].error
        assert res[3].obs.text == "e 2 in game 3"  # same worker as the crash, replayed, stepped
        assert pool.failures == 2
        obs = pool.reset(GAMES)  # every slot plays again after the restarts
        assert all(o is not None for o in obs)
        assert [r.obs.text for r in pool.step(["x"] * 4)] == [f"x 1 in game {i}" for i in range(4)]


def test_the_timeout_is_per_env_call_not_per_worker(fake_family):
    """Before: a worker got one `timeout` for all the slots it steps in turn, so four healthy
    0.4 s steps on one worker with a 1 s timeout were killed as a hang and a slot failed."""
    with EnvPool(fake_family, {}, n_workers=1, timeout=1.0) as pool:
        pool.reset(GAMES)
        res = pool.step(["slow"] * 4)  # 1.6 s of steps, 4 s allowed
        assert not any(r.failed for r in res), [r.error for r in res]
        assert [r.obs.text for r in res] == [f"slow 1 in game {i}" for i in range(4)]
        assert pool.failures == 0 and pool.restarts == 0
        res = pool.step(["slow", "hang", "slow", "slow"])  # a real hang is still caught, within 4 x 1 s
        assert res[1].failed and "no answer within 4 s" in res[1].error
        assert not res[0].failed and not res[2].failed and not res[3].failed


@pytest.mark.parametrize("n_workers", [1, 2])
def test_a_game_that_kills_its_worker_fails_alone(fake_family, n_workers):
    """Before: every slot of the dead worker failed with a bare "worker died" (9 of 9 with one
    worker). Now only the corrupt game fails, and its error names the file, exit code and output."""
    games = [GameSpec(path=f"fake/{i}", level="fake", env="fake", seed=i) for i in range(5)]
    games[2] = GameSpec(path="fake/2-corrupt", level="fake", env="fake", seed=2)
    with EnvPool(fake_family, {}, n_workers=n_workers, timeout=10) as pool:
        obs = pool.reset(games)
        assert [o is None for o in obs] == [False, False, True, False, False]
        error = pool.last_errors[2]
        assert "fake/2-corrupt" in error and "exit code 1" in error and "Story file read error" in error
        res = pool.step(["a", "b", None, "win", "c"])
        assert [r.obs.text for i, r in enumerate(res) if i != 2] == ["a 1 in game 0", "b 1 in game 1",
                                                                       "win 1 in game 3", "c 1 in game 4"]
        assert pool.failures == 1


def test_a_worker_killed_from_outside_loses_no_episode(fake_family):
    import os
    import signal

    with EnvPool(fake_family, {}, n_workers=2, timeout=10) as pool:
        pool.reset(GAMES)
        pool.step(["a"] * 4)
        os.kill(pool._workers[0].proc.pid, signal.SIGKILL)
        pool._workers[0].proc.join(5)
        res = pool.step(["b"] * 4)
        assert [r.obs.text for r in res] == [f"b 2 in game {i}" for i in range(4)]
        assert pool.failures == 0 and pool.restarts == 1


def test_pool_plays_textworld(tw_games):
    games = [tw_games["custom"], tw_games["cooking"]]
    won = [False, False]
    with EnvPool("textworld", {"expert": False}, n_workers=1, timeout=30) as pool:
        assert all(obs.score == 0 for obs in pool.reset(games))
        for i in range(max(len(g.expert_plan) for g in games)):
            res = pool.step([g.expert_plan[i] if i < len(g.expert_plan) else None for g in games])
            for s, r in enumerate(res):
                if r is not None:
                    assert not r.failed, r.error
                    won[s] = r.obs.won
        assert won == [True, True] and pool.failures == 0
    with pytest.raises(ValueError, match="unknown environment"):
        EnvPool("nope", {})


def test_a_pool_dropped_unclosed_removes_its_log_folder(fake_family):
    import gc

    pool = EnvPool(fake_family, {}, n_workers=1, timeout=10)
    logs = pool._logs
    assert logs.is_dir()
    del pool
    gc.collect()
    assert not logs.exists()  # before, every unclosed pool left an envpool-* folder in /tmp


PROBE_MAIN = '''
import os, sys
with open(os.environ["PROBE_LOG"], "a") as log:
    log.write(f"{os.getpid()}\\n")  # one line per interpreter that runs this module
sys.path.insert(0, os.environ["TESTS_DIR"])
from agentrecipe.envs import registry
from agentrecipe.envs.base import GameSpec
from agentrecipe.envs.pool import EnvPool

if __name__ == "__main__":
    registry.FAMILIES["fake"] = "fake_envs"
    with EnvPool("fake", {}, n_workers=2, timeout=10) as pool:
        obs = pool.reset([GameSpec(path=f"fake/{i}", level="fake", env="fake", seed=i) for i in range(2)])
    assert [o.text for o in obs] == ["start 0", "start 1"], obs
    assert __spec__.name == "probe_main" and __file__.endswith("probe_main.py")  # put back after the start
'''


def test_workers_do_not_rerun_the_main_module(tmp_path):
    """A stage's main module imports torch and transformers; spawned workers must not import it again."""
    import os
    import subprocess

    (tmp_path / "probe_main.py").write_text(PROBE_MAIN)
    log = tmp_path / "imports.log"
    env = {**os.environ, "PROBE_LOG": str(log), "TESTS_DIR": str(Path(__file__).parent),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "probe_main"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(log.read_text().split()) == 1  # the parent only
