"""Environments as a service: real `agentrecipe serve-env` servers on 127.0.0.1, started here.

The rollout engine plays through two servers exactly as through the local pool; killing or
freezing a server mid-batch fails only its episodes (counted) and the run goes on; a server's
memory stays flat over 1000 episodes; bad input is refused with a clear error.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import torch

from agentrecipe.envs import registry
from agentrecipe.envs.base import GameSpec

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]  # the fake families, as the servers import them
import fixed_turn_env  # noqa: E402

from agentrecipe.envs.remote_pool import RemotePool  # noqa: E402
from agentrecipe.envs.server import MAX_ACTION_CHARS, MAX_BODY_BYTES  # noqa: E402

torch.set_num_threads(1)
FAMILIES = {"fake": "fake_envs", "ballast": "ballast_envs", "fixed": "fixed_turn_env"}
# A server of one of the test families: the `serve-env` command, with those families registered.
LAUNCH = f"""
import sys
sys.path[:0] = [{str(ROOT / 'tests')!r}, {str(ROOT / 'bench')!r}]
from agentrecipe.envs import registry
registry.FAMILIES.update({FAMILIES!r})
from agentrecipe.cli import main
sys.exit(main(sys.argv[1:]))
"""
TURNS = 5
FIXED = [GameSpec(path=f"fixed-{s}", level=f"t{TURNS}", env="fixed", seed=s) for s in range(8)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `serve-env` process on 127.0.0.1 (stopped by its PID)."""

    def __init__(self, family: str, log_dir: Path, port: int | None = None, params: Path | None = None):
        self.family, self.port = family, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"{family}-{self.port}-{time.monotonic_ns()}.log"
        args = ["serve-env", "--env", family, "--port", str(self.port), "--params", str(params or log_dir / "none.yaml")]
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-c", LAUNCH, *args], cwd=ROOT, stdout=out,
                                         stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})

    def wait(self, timeout: float = 180.0) -> Server:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited: {self.log.read_text()}"
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.url} did not start: {self.log.read_text()}")

    def stats(self) -> dict:
        return httpx.get(self.url + "/stats", timeout=5).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture(autouse=True)
def test_families_here_too(monkeypatch):
    """The test families registered in this process as in the servers' (a pool reads its family's
    play options)."""
    for name, module in FAMILIES.items():
        monkeypatch.setitem(registry.FAMILIES, name, module)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two servers of the fixed-turn family, one of the ballast family, one of the fake family, one of
    TextWorld (started at once)."""
    log_dir = tmp_path_factory.mktemp("servers")
    started = {name: Server(family, log_dir) for name, family in
               (("a", "fixed"), ("b", "fixed"), ("ballast", "ballast"), ("fake", "fake"), ("textworld", "textworld"))}
    try:
        for s in started.values():
            s.wait()
        started["log_dir"] = log_dir
        yield started
    finally:
        for s in list(started.values()):
            if isinstance(s, Server):
                s.stop()


@pytest.fixture(scope="module")
def policy():
    """A tiny untrained model: greedy admissible decoding picks some admissible command each turn."""
    from agentrecipe.agent.prompt import PromptEncoder
    from agentrecipe.config import ModelConfig
    from agentrecipe.models.registry import build_tiny
    from agentrecipe.models.tokenizer import train_tokenizer
    from agentrecipe.rollout.hf_backend import HFBackend

    texts = [" ".join((t, *c)) for s in range(4) for t, c in [fixed_turn_env.room_text(s, k) for k in range(3)]]
    tok = train_tokenizer(texts + [fixed_turn_env.OBJECTIVE], 400)
    model = build_tiny(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0), tok)
    return PromptEncoder(tok, True, 2), HFBackend(model, tok.pad_token_id, tok.eos_token_id)


def play(policy, pool, games, backend=None):
    from agentrecipe.rollout.engine import RolloutSettings, run_episodes

    encoder, hf = policy
    return run_episodes(games, backend or hf, encoder, pool, RolloutSettings(max_turns=TURNS + 1, max_context=2048,
                                                                               temperature=0.0))


class KillingBackend:
    """The policy's backend, calling `act()` just before generating turn `turn` (counted from 1)."""

    def __init__(self, backend, turn: int, act):
        self.backend, self.turn, self.act, self.calls = backend, turn, act, 0

    def generate(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.turn:
            self.act()
        return self.backend.generate(*args, **kwargs)

    def __getattr__(self, name):  # release() and the rest: the wrapped backend's
        return getattr(self.backend, name)


def test_rollout_engine_plays_through_two_servers_as_through_the_local_pool(servers, policy):
    from agentrecipe.envs.pool import EnvPool

    with EnvPool("fixed", {}, n_workers=0) as local:
        expected = play(policy, local, FIXED)
    a, b = servers["a"], servers["b"]
    before = [a.stats()["episodes"], b.stats()["episodes"]]
    with RemotePool("fixed", [a.url, b.url], timeout=10) as pool:
        got = play(policy, pool, FIXED)
        assert pool.failures == 0
    assert [a.stats()["episodes"] - before[0], b.stats()["episodes"] - before[1]] == [4, 4]  # spread evenly
    assert [ep.summary() for ep in got] == [ep.summary() for ep in expected]
    assert [ep.observations for ep in got] == [ep.observations for ep in expected]  # every field, every turn
    assert [ep.action_texts for ep in got] == [ep.action_texts for ep in expected]
    assert all(ep.turns == TURNS and ep.done and not ep.failed for ep in got)
    assert a.stats()["open_envs"] == 0 and b.stats()["open_envs"] == 0  # closed at episode end


def test_killed_server_fails_only_its_episodes_and_is_retried(servers, policy):
    a, b = servers["a"], servers["b"]
    with RemotePool("fixed", [a.url, b.url], timeout=10, connect_timeout=2, retry_after=1.0) as pool:
        episodes = play(policy, pool, FIXED, KillingBackend(policy[1], 3, b.stop))  # dies before turn 3's step
        failed = [ep for ep in episodes if ep.failed]
        assert len(failed) == 4 and pool.failures == 4  # B held half the batch
        assert all(b.url in ep.error and ep.turns == 3 for ep in failed)
        assert all(ep.turns == TURNS and not ep.failed for ep in episodes if ep not in failed)

        # The run goes on: the next batch plays on A alone (while B restarts on its port).
        servers["b"] = b = Server("fixed", servers["log_dir"], port=b.port)
        before = a.stats()["episodes"]
        assert not any(ep.failed for ep in play(policy, pool, FIXED))
        assert a.stats()["episodes"] - before == 8 and pool.failures == 4

        # Back, B gets episodes again once retry_after has passed.
        b.wait()
        time.sleep(1.0)
        assert not any(ep.failed for ep in play(policy, pool, FIXED))
        assert b.stats()["episodes"] == 4


def test_frozen_server_times_out_only_its_episodes(servers, policy):
    a, b = servers["a"], servers["b"]
    with RemotePool("fixed", [a.url, b.url], timeout=2, connect_timeout=1, retry_after=60) as pool:
        start = time.monotonic()
        try:
            freeze = KillingBackend(policy[1], 2, lambda: os.kill(a.proc.pid, signal.SIGSTOP))  # before turn 2's step
            episodes = play(policy, pool, FIXED, freeze)
            failed = [ep for ep in episodes if ep.failed]
            assert len(failed) == 4 and pool.failures == 4
            assert all(a.url in ep.error and "no answer in time" in ep.error for ep in failed)
            assert time.monotonic() - start < 30
            before = b.stats()["episodes"]
            assert not any(ep.failed for ep in play(policy, pool, FIXED))  # A no longer gets episodes
            assert b.stats()["episodes"] - before == 8
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)


def test_a_busy_healthy_server_is_not_taken_for_a_hung_one(servers):
    """A server runs its env calls one at a time. Before, each request got one flat timeout, so of
    4 healthy 0.4 s steps on one server with a 1 s timeout the last ones failed as "no answer in
    time", and the server was set aside as hung. Now each request gets the timeout once per call
    queued with it (4 s here, for 1.6 s of steps)."""
    games = [GameSpec(path=f"g{i}", level="x", env="fake", seed=i) for i in range(4)]
    with RemotePool("fake", [servers["fake"].url], timeout=1.0, start_timeout=60) as pool:
        pool.reset(games)
        res = pool.step(["slow"] * 4)
        assert not any(r.failed for r in res), pool.last_errors
        assert [r.obs.text for r in res] == [f"slow 1 in game {i}" for i in range(4)]
        assert all(o is not None for o in pool.reset(games)) and pool.failures == 0


def test_one_slow_call_does_not_set_a_healthy_server_aside(servers):
    """Before, a request without an answer set its server aside for `retry_after`: after one 0.4 s
    step against a 0.3 s timeout, the idle, healthy server got no episode of the next reset (all 4
    failed: "no environment server answers"). Now the reset's /stats decides."""
    games = [GameSpec(path=f"g{i}", level="x", env="fake", seed=i) for i in range(4)]
    with RemotePool("fake", [servers["fake"].url], timeout=0.3, start_timeout=60, retry_after=60) as pool:
        assert pool.reset(games[:1])[0] is not None
        [res] = pool.step(["slow"])
        assert res.failed and "no answer in time" in res.error
        deadline = time.monotonic() + 30
        while servers["fake"].stats()["busy_s"] > 0 and time.monotonic() < deadline:  # the slow call ends
            time.sleep(0.05)
        assert all(o is not None for o in pool.reset(games)), pool.last_errors
        assert not any(r.failed for r in pool.step(["win"] * 4)), pool.last_errors


def test_a_server_with_a_hung_env_call_gets_no_new_episodes(servers):
    """A hung env call blocks its server's env thread for good, while its /health still answers.
    Before, the pool gave that server new episodes after every `retry_after`, and each failed by
    timeout: 5 failures here, for 1 hung episode. Now its /stats says how long the running call
    has taken, and the pool keeps new episodes on the other server."""
    hung, other = Server("fake", servers["log_dir"]), Server("fake", servers["log_dir"])
    games = [GameSpec(path=f"g{i}", level="x", env="fake", seed=i) for i in range(4)]
    try:
        hung.wait(), other.wait()
        with RemotePool("fake", [hung.url, other.url], timeout=1, connect_timeout=1, retry_after=0.5,
                        start_timeout=60) as pool:
            pool.reset(games[:2])  # one episode on each server
            res = pool.step(["hang", "win"])
            assert res[0].failed and "no answer in time" in res[0].error and not res[1].failed
            assert httpx.get(hung.url + "/health", timeout=5).status_code == 200  # the event loop answers
            assert hung.stats()["busy_s"] > 1
            for _ in range(2):
                time.sleep(0.6)  # past retry_after: the pool asks the hung server again
                assert all(o is not None for o in pool.reset(games)), pool.last_errors
                assert {server for server, _ in pool._sessions.values()} == {1}
            assert pool.failures == 1
            assert other.stats()["busy_s"] == 0
    finally:
        hung.stop(), other.stop()


def test_a_busy_server_is_not_taken_for_a_hung_one_before_it_answered_the_pool(servers):
    """Another client's call may run past `timeout` on a server this pool has not heard from yet
    (a first call imports the family): start_timeout more for it, as for the pool's own first
    resets. Here a 0.4 s step of one pool, while a second pool with a 0.1 s timeout starts."""
    import threading

    url = servers["fake"].url
    games = [GameSpec(path=f"g{i}", level="x", env="fake", seed=i) for i in range(2)]
    with RemotePool("fake", [url], timeout=5, start_timeout=60) as busy, \
            RemotePool("fake", [url], timeout=0.1, start_timeout=60) as fresh:
        busy.reset(games[:1])
        stepping = threading.Thread(target=busy.step, args=(["slow"],))
        stepping.start()
        time.sleep(0.2)  # the slow step is running on the server's one env thread
        obs = fresh.reset(games[1:])
        stepping.join()
        assert obs[0] is not None and fresh.failures == 0, fresh.last_errors


def test_server_memory_is_flat_over_1000_episodes(servers):
    """Each ballast env holds 1 MiB until closed: without closing, RSS would grow by about 900 MiB."""
    server = servers["ballast"]
    proc = psutil.Process(server.proc.pid)
    games = [GameSpec(path=f"b/{i}", level="fake", env="ballast", seed=i) for i in range(50)]
    rss = {}
    with RemotePool("ballast", [server.url], timeout=20) as pool:
        for batch in range(20):
            pool.reset(games)
            pool.step(["look"] * 50)
            assert all(r.done for r in pool.step(["win"] * 50))
            if batch + 1 in (2, 10, 20):
                rss[(batch + 1) * 50] = proc.memory_info().rss / 2**20
        assert pool.failures == 0
    stats = server.stats()
    assert stats["episodes"] == 1000 and stats["open_envs"] == 0
    print(f"server RSS (MiB) by episodes played: {rss}")
    assert rss[1000] - rss[500] < 32, rss  # measured: about 10 (allocator and thread churn, levelling off)


def test_textworld_through_a_server_matches_the_local_env(servers, tw_games):
    from agentrecipe.envs.textworld_env import make_env

    games = list(tw_games.values())
    env = make_env({})
    expected = []
    for g in games:  # the expert plan played in this process
        obs = [env.reset(g)] + [env.step(a)[0] for a in g.expert_plan]
        expected.append(obs)
    env.close()
    with RemotePool("textworld", [servers["textworld"].url], timeout=30) as pool:
        got = [[o] for o in pool.reset(games)]
        for t in range(max(len(g.expert_plan) for g in games)):
            res = pool.step([g.expert_plan[t] if t < len(g.expert_plan) else None for g in games])
            for i, r in enumerate(res):
                if r is not None:
                    got[i].append(r.obs)
        assert pool.failures == 0
    assert got == expected
    assert all(obs[-1].won for obs in got)
    assert servers["textworld"].stats()["open_envs"] == 0


def test_a_closed_session_opens_no_env():
    """OpenEnv's idle reaper closes a session but leaves its WebSocket open: a reset sent there later
    opened a family env that no session accounted for (never closed, outside --max-episodes)."""
    from agentrecipe.envs.server import COUNTS, FamilyEnvironment

    game = {"path": "g0", "level": "x", "env": "fake"}
    session = FamilyEnvironment("fake", {})
    before = COUNTS.open_envs
    assert session.reset(game=game).text == "start 0" and COUNTS.open_envs == before + 1
    session.close()
    assert COUNTS.open_envs == before
    with pytest.raises(ValueError, match="this session was closed"):
        session.reset(game=game)
    assert COUNTS.open_envs == before


def test_a_relative_game_path_is_the_clients_not_the_servers(servers, tw_games, tmp_path, monkeypatch):
    """Before, a relative path went to the server as it was and was opened in the server's working
    folder (here the project root), where the client's games are not: a queued experiment's run in
    its own copy failed every episode there, or played another build's game of the same name."""
    import shutil

    game = tw_games["custom"]
    shutil.copytree(Path(game.path).parent, tmp_path / "client" / "games")
    monkeypatch.chdir(tmp_path / "client")
    relative = GameSpec(path=f"games/{Path(game.path).name}", level=game.level, env=game.env, seed=game.seed,
                        expert_plan=game.expert_plan)
    assert not (ROOT / relative.path).exists()
    with RemotePool("textworld", [servers["textworld"].url], timeout=30) as pool:
        [obs] = pool.reset([relative])
        assert obs is not None, pool.last_errors
        for action in game.expert_plan:
            [res] = pool.step([action])
            assert not res.failed, res.error
        assert res.obs.won


def test_expert_replays_for_sft_data_through_a_server(servers, tw_games):
    """gen_sft_data and prepare_model replay through env.remote's servers when it lists any."""
    from agentrecipe.agent.replay import replay_games
    from agentrecipe.config import EnvConfig
    from agentrecipe.envs.remote_pool import PoolEnv

    games = [tw_games["cooking"], tw_games["simple"]]
    local = list(replay_games(EnvConfig(name="textworld"), games))
    served = list(replay_games(EnvConfig(name="textworld", remote=[servers["textworld"].url]), games))
    assert served == local and all(obs[-1].won for _, obs, _ in served)
    assert servers["textworld"].stats()["open_envs"] == 0
    with RemotePool("textworld", [servers["textworld"].url], timeout=30) as pool:
        with pytest.raises(RuntimeError, match="reset failed: .*plays 'textworld' games, not 'fake'"):
            PoolEnv(pool).reset(GameSpec(path="x", level="l", env="fake"))


def test_bad_input_is_refused_and_fails_one_episode(servers):
    a = servers["a"]
    with RemotePool("fixed", [a.url], timeout=5) as pool:
        other = GameSpec(path="fake/1", level="fake", env="fake")
        huge = GameSpec(path="fixed-1", level="t5", env="fixed", expert_plan=("x" * 1000,) * (MAX_BODY_BYTES // 1000))
        obs = pool.reset([FIXED[0], other, huge, FIXED[1]])
        assert obs[0] is not None and obs[3] is not None and obs[1] is None and obs[2] is None
        assert "plays 'fixed' games, not 'fake'" in pool.last_errors[1]
        assert pool.failures == 2
        code = "__import__('os')._exit(1)"  # a plain string: the server never evaluates it
        res = pool.step([code, None, None, "y" * (MAX_ACTION_CHARS + 1)])
        assert not res[0].failed and res[3].failed and pool.failures == 3
    assert a.stats()["open_envs"] == 0
    r = httpx.post(a.url + "/reset", content=b"{" + b" " * MAX_BODY_BYTES + b"}",
                   headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_unreachable_or_wrong_server_is_an_error_at_start(servers):
    start = time.monotonic()
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectionError, match=f"{dead} does not answer"):
        RemotePool("fixed", [servers["a"].url, dead], connect_timeout=2)
    with pytest.raises(ConnectionError, match="serves 'fixed', not 'textworld'"):
        RemotePool("textworld", [servers["a"].url])
    assert time.monotonic() - start < 10


def test_play_options_are_the_ones_that_change_episodes():
    defaults = registry.play_options("swe", {})
    assert defaults["window"] == 15 and "cache_dir" not in defaults and "p2p" not in defaults  # build / local keys
    assert registry.play_options("swe", {"window": 30, "cache_dir": "/srv", "p2p": 2}) == {**defaults, "window": 30}
    assert registry.play_options("alfworld", {"data_dir": "/data"}) == {"expert": "handcoded", "max_expert_steps": 200}
    assert registry.play_options("textworld", {"expert": False}) == {}  # nothing a policy sees
    assert registry.option_differences("swe", defaults, {**defaults, "window": 30}) == [
        "env.swe.window: this run 15, the server 30"]


def test_a_server_playing_other_options_is_an_error_at_start(tmp_path):
    """A run recorded env.swe.window 15 while its server showed 30 lines: silently another experiment."""
    import yaml

    from agentrecipe.params import compose

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(compose(ROOT / "params", ["env=swe", "env.swe.window=30",
                                                               "env.swe.cache_dir=/srv/swe-cache"])))
    server = Server("swe", tmp_path, params=params)
    try:
        server.wait()
        assert server.stats()["play_options"]["window"] == 30
        with pytest.raises(ConnectionError, match=r"plays other options \(env\.swe\.window: this run 15, the server 30\)"):
            RemotePool("swe", [server.url], options={})
        # the same play options, another cache folder (this machine's): accepted
        RemotePool("swe", [server.url], options={"window": 30, "cache_dir": "/elsewhere"}).close()
    finally:
        server.stop()


def test_unknown_family_and_bad_urls_are_refused_before_any_work(capsys):
    from agentrecipe.cli import main
    from agentrecipe.config import ConfigError, EnvConfig

    assert main(["serve-env", "--env", "nope"]) == 2
    assert "unknown environment 'nope'; known: alfworld" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="env.remote"):
        EnvConfig(remote=["127.0.0.1:8765"])
    assert EnvConfig(remote=["http://127.0.0.1:8765", "https://envs.example.org"]).remote


def test_cli_evaluate_through_a_server_gives_the_local_results(servers, tw_games, tmp_path):
    import json
    import shutil

    from agentrecipe.cli import main

    games = tmp_path / "games"
    games.mkdir()
    for spec in tw_games.values():
        for f in Path(spec.path).parent.glob(Path(spec.path).stem + ".*"):
            shutil.copy(f, games / f.name)
    metrics = {}
    for where, extra in (("local", []), ("served", ["--remote", servers["textworld"].url])):
        out = tmp_path / where
        argv = ["evaluate", "--model", "expert", "first", "--games", str(games), "--max-turns", "30", "--workers", "1",
                "--samples", "2", "--params", str(tmp_path / "absent.yaml"), "--out", str(out), *extra]
        assert main(argv) == 0
        metrics[where] = json.loads((out / "metrics.json").read_text())
    assert metrics["served"] == metrics["local"]
    assert all(metrics["local"]["expert"][spec.level]["success"] == 1.0 for spec in tw_games.values())
    assert servers["textworld"].stats()["open_envs"] == 0
