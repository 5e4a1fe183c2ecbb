"""The SWE sandbox: every escape an agent's edit can try is contained, and counted.

Each test plants the escape in the package's `add` (through the env's `edit` command, as an
agent would) and runs the tests with `run_tests`; tests/test_calc.py::test_add calls it.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest

from agentrecipe.envs import swe
from agentrecipe.envs.base import GameSpec
from agentrecipe.envs.swe import sandbox
from agentrecipe.envs.swe.env import hidden_from_runs
from agentrecipe.envs.swe.sandbox import (ISOLATION, SANDBOX_UIDS, Limits, SandboxError, _preexec, make_pids_cgroup,
                                          remove_pids_cgroup, resolve_inside, run_limited)
from tests.swe_fixture import CALC, SPEC

ADD_LINE = 5  # `    return a + b` in calc/ops.py


@pytest.fixture
def task(tmp_path) -> GameSpec:
    """A hand-written task on the calc package: test_add must pass, test_shout is a PASS_TO_PASS test."""
    return write_task(tmp_path / "task")


@pytest.fixture
def readable_tmp():
    """A temporary folder a run's own uid may enter (pytest's tmp_path is 0700 root's)."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp())
    base.chmod(0o755)
    yield base
    shutil.rmtree(base)


def write_task(folder: Path) -> GameSpec:
    for rel, text in CALC.items():
        (folder / "repo" / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / "repo" / rel).write_text(text)
    (folder / "task.json").write_text(json.dumps({
        "package": SPEC, "mutations": [], "FAIL_TO_PASS": ["tests/test_calc.py::test_add"],
        "PASS_TO_PASS": ["tests/test_calc.py::test_shout"], "issue": "test_add fails",
        "sources": ["calc/ops.py", "calc/text.py"], "test_files": ["tests/test_calc.py"], "expert_plan": []}))
    return GameSpec(path=str(folder / "task.json"), level="any-f1", env="swe")


def plant(env, code: str):
    """Replace `add`'s body by `code` (\\n-separated lines), then run the tests."""
    obs, _, _, info = env.step(f"edit calc/ops.py {ADD_LINE} {ADD_LINE} <<< {code}")
    assert not info["invalid"], obs.text
    start = time.perf_counter()
    obs, reward, done, info = env.step("run_tests")
    return obs, info, time.perf_counter() - start


def test_paths_outside_the_repository_are_refused_and_counted(task, tmp_path):
    env = swe.make_env({"packages": [SPEC]})
    env.reset(task)
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    (env.root / "link").symlink_to(tmp_path)
    for action in ["open ../../secret.txt", "open /etc/passwd", "ls ..", "open link/secret.txt",
                   "edit ../task.json 1 1 <<< {}", "search x/../../"]:
        obs, _, _, info = env.step(action)
        if action.startswith("search"):  # search reads only files inside; nothing to refuse
            assert not info["invalid"]
            continue
        assert info["invalid"] and "Path refused" in obs.text, (action, obs.text)
        assert "secret" not in obs.text.replace("secret.txt", "")
    assert env.stats["refused_paths"] == 5
    assert json.loads(Path(task.path).read_text())["FAIL_TO_PASS"]  # untouched
    with pytest.raises(ValueError):
        resolve_inside(env.root, "calc/../../x")
    env.close()


def test_an_infinite_loop_is_stopped_at_the_time_limit(task):
    env = swe.make_env({"packages": [SPEC], "timeout": 3.0})
    env.reset(task)
    obs, info, seconds = plant(env, r"while True:\n\tpass")
    assert info["sandbox"]["contained"] == "timeout" and env.stats["timeout"] == 1
    assert "time limit" in obs.text and info["pass_ratio"] == 0.0
    assert seconds < 3.0 + 10.0  # killed, not waited for (slack for a loaded machine)
    env.close()


def test_a_fork_bomb_stops_at_the_process_limit_and_leaves_nothing_behind(task):
    env = swe.make_env({"packages": [SPEC], "nproc": 8, "timeout": 20.0})
    env.reset(task)
    # A bounded bomb: up to 64 children that each sleep; the limit refuses most of them.
    code = (r"import os, time\nfor i in range(64):\n\ttry:\n\t\tpid = os.fork()\n\texcept OSError:\n"
            r"\t\topen('forks.txt', 'a').write('refused' + chr(10))\n\t\treturn -1\n\tif pid == 0:\n"
            r"\t\topen('forks.txt', 'a').write(f'child {os.getpid()}' + chr(10))\n\t\ttime.sleep(60)\n"
            r"\t\tos._exit(0)\nreturn a + b")
    obs, info, _ = plant(env, code)
    log = (env.root / "forks.txt").read_text().split("\n")
    children = [int(line.split()[1]) for line in log if line.startswith("child")]
    # RLIMIT_NPROC counts all of the user's processes (set to those at the start + 8); other
    # processes of the user that end meanwhile free slots, hence the slack.
    assert "refused" in log and len(children) <= 8 + 16
    if (group := make_pids_cgroup(1)) is not None:
        remove_pids_cgroup(group)  # (as root) a pids cgroup of its own: exactly 7 + pytest itself
        assert len(children) == 7
    assert info["pass_ratio"] == 0.5  # test_add failed (add returned -1), test_shout passed
    for pid in children:  # killed with the run's process group
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "zombie" in status.read_text(), pid
    env.close()


def test_huge_output_is_cut_and_the_run_stopped():
    # At the pipe: past max_output bytes the run is killed and what was kept returned.
    start = time.perf_counter()
    res = run_limited([sys.executable, "-c", "while True: print('x' * 1000)"], "/tmp",
                      Limits(wall_s=30, max_output=10_000))
    assert res.output_limited and res.contained == "output" and len(res.output) <= 10_000
    assert time.perf_counter() - start < 15


def test_huge_output_from_a_test_is_stopped_by_the_file_size_limit(task):
    # pytest captures a test's output in a file: RLIMIT_FSIZE (64 MiB) stops the writes there
    # (Python ignores SIGXFSZ, so the write fails with EFBIG and the test fails).
    env = swe.make_env({"packages": [SPEC], "timeout": 20.0})
    env.reset(task)
    obs, info, _ = plant(env, r"import os\nfor _ in range(200):\n\tos.write(1, b'x' * 2**20)\nreturn a + b")
    assert info["pass_ratio"] == 0.5 and "File too large" in obs.text, obs.text
    assert len(obs.text) <= swe.DEFAULTS["max_obs_chars"] + 60
    env.close()


def test_memory_is_limited(task):
    env = swe.make_env({"packages": [SPEC], "memory_mb": 1024})
    env.reset(task)
    obs, info, _ = plant(env, r"x = bytearray(8 * 2**30)\nreturn a + b")
    assert info["pass_ratio"] == 0.5 and "MemoryError" in obs.text
    env.close()


@pytest.mark.skipif(ISOLATION != "netns", reason="no network namespace without root: proxies are only unset")
def test_a_test_cannot_reach_the_network(task):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def serve():
        deadline = time.time() + 30
        while time.time() < deadline and not accepted:
            try:
                accepted.append(server.accept())
            except socket.timeout:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    env = swe.make_env({"packages": [SPEC]})
    env.reset(task)
    obs, info, _ = plant(env, rf"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\nreturn a + b")
    assert info["pass_ratio"] == 0.5 and ("OSError" in obs.text or "ConnectionRefused" in obs.text), obs.text
    accepted.append(None)  # stop the server
    thread.join(5)
    assert accepted == [None]  # nobody connected
    server.close()
    env.close()


def test_environment_variables_do_not_leak(task, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("SECRET_TOKEN", "abc")
    res = run_limited([sys.executable, "-c", "import os; print(sorted(os.environ))"], "/tmp", Limits())
    assert "HTTPS_PROXY" not in res.output and "SECRET_TOKEN" not in res.output


# The tests' code is the model's: it must not be able to score itself, hang the env process
# (which runs outside the sandbox) or make it write outside the episode folder.
def test_a_test_that_skips_itself_is_not_a_pass(task):
    """Before, a skip counted as passed: one edit (`pytest.skip()`) resolved the task."""
    env = swe.make_env({"packages": [SPEC]})
    env.reset(task)
    obs, info, _ = plant(env, r"import pytest\npytest.skip('not today')")
    assert info["pass_ratio"] == 0.5 and "FAILED tests/test_calc.py::test_add: skipped" in obs.text
    obs, _, done, _ = env.step("submit")
    assert done and "Not resolved" in obs.text
    env.close()


def test_a_report_forged_by_the_tests_is_not_trusted(task):
    """Before, code run by the tests rewrote the report at exit and won with `add` still broken."""
    env = swe.make_env({"packages": [SPEC]})
    env.reset(task)
    forged = {"tests": {t: {"passed": True, "skipped": False, "message": ""}
                        for t in ("tests/test_calc.py::test_add", "tests/test_calc.py::test_shout")}}
    code = (rf"import atexit, json\ndef forge():\n\tjson.dump({forged!r}, open('.swe_report.json', 'w'))\n"
            r"atexit.register(forge)\nreturn a - b")
    obs, info, _ = plant(env, code)
    assert info["pass_ratio"] == 0.0 and "pytest exited with code 1" in obs.text, obs.text
    assert env.stats["report_mismatch"] == 1
    env.close()


def test_fifos_left_by_the_tests_do_not_hang_the_env(task):
    """Before, a FIFO in place of the report (or named *.py, for `search`) blocked the env process
    for good: it reads them outside the sandbox, where no time limit applies."""
    env = swe.make_env({"packages": [SPEC], "timeout": 10.0})
    env.reset(task)
    code = (r"import atexit, os\nos.path.exists('calc/zz.py') or os.mkfifo('calc/zz.py')\n"
            r"def fifo():\n\tos.remove('.swe_report.json')\n\tos.mkfifo('.swe_report.json')\n"
            r"atexit.register(fifo)\nreturn a + b")
    out = []
    thread = threading.Thread(target=lambda: out.append((plant(env, code), env.step("search return"))), daemon=True)
    thread.start()
    thread.join(90)
    assert out, "the env hung on a FIFO"
    (obs, info, _), (found, *_) = out[0]
    assert info["pass_ratio"] == 0.0 and "tests pass" in obs.text  # no report to read: nothing passed
    assert "matches for 'return'" in found.text
    env.close()


def test_restoring_the_test_files_never_writes_through_a_symlink(task, tmp_path):
    """Before, the tests' code swapped tests/ for a symlink and the next run's restore (outside the
    sandbox) overwrote a file of that name wherever the link pointed."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "test_calc.py").write_text("precious\n")
    env = swe.make_env({"packages": [SPEC]})
    env.reset(task)
    code = (rf"import atexit, os, shutil\ndef swap():\n\tshutil.rmtree('tests')\n\tos.symlink({str(victim)!r}, 'tests')\n"
            r"atexit.register(swap)\nreturn a + b")
    plant(env, code)
    assert (env.root / "tests").is_symlink()
    obs, _, _, info = env.step("run_tests")
    assert (victim / "test_calc.py").read_text() == "precious\n"
    assert info["pass_ratio"] == 1.0, obs.text  # restored into the repo, and run (the swap then ran again)
    env.close()


@pytest.mark.skipif(ISOLATION != "netns", reason="as root only: without root the run keeps the caller's uid")
def test_the_tests_code_runs_as_a_user_who_may_write_only_in_its_folder(task, tmp_path):
    """Before, the tests' code ran as root: it could write anywhere (site-packages, this project),
    read this process's environment, and leave its cgroup to outlive the run."""
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    targets = {"outside": tmp_path / "outside.txt", "site": site / f"zz_sandbox_{tmp_path.name}.pth",
               "project": Path(swe.__file__).parent / f"zz_sandbox_{tmp_path.name}.txt",
               "cgroup": next((p for p in (Path("/sys/fs/cgroup/pids/cgroup.procs"), Path("/sys/fs/cgroup/cgroup.procs"))
                               if p.exists()), Path("/sys/fs/cgroup/cgroup.procs"))}
    env = swe.make_env({"packages": [SPEC]})
    env.reset(task)
    code = (rf"import os\nlog = open('escape.txt', 'w')\nfor name, path in {dict((k, str(v)) for k, v in targets.items())!r}.items():"
            r"\n\ttry:\n\t\topen(path, 'a').write(str(os.getpid()))\n\t\tlog.write(name + ' written' + chr(10))"
            r"\n\texcept OSError as e:\n\t\tlog.write(name + ' ' + type(e).__name__ + chr(10))"
            r"\nfor name, call in (('environ', lambda: open(f'/proc/{os.getppid()}/environ').read()),"
            r" ('signal', lambda: os.kill(os.getppid(), 0))):\n\ttry:\n\t\tcall()\n\t\tlog.write(name + ' done' + chr(10))"
            r"\n\texcept OSError as e:\n\t\tlog.write(name + ' ' + type(e).__name__ + chr(10))"
            r"\nlog.write(f'uid {os.getuid()}' + chr(10))\nlog.close()\nreturn a + b")
    try:
        obs, info, _ = plant(env, code)
        log = (env.root / "escape.txt").read_text().splitlines()
    finally:
        for key in ("outside", "site", "project"):
            targets[key].unlink(missing_ok=True)
    assert info["pass_ratio"] == 1.0, obs.text  # it ran, wrote its own folder, and the tests passed
    assert not any(line.endswith((" written", " done")) for line in log), log
    assert {line.split()[0] for line in log} == {*targets, "environ", "signal", "uid"}
    assert int(log[-1].split()[1]) in SANDBOX_UIDS
    assert (env.root / "escape.txt").stat().st_uid == os.getuid()  # the folder is ours again after the run
    env.close()


def test_a_sandbox_that_cannot_be_set_up_says_why_and_runs_nothing(tmp_path):
    """The child exits before exec with a line naming what failed (e.g. a container without
    CAP_SYS_ADMIN for the network namespace), rather than running unconfined or silently."""
    import subprocess

    marker = tmp_path / "ran"
    proc = subprocess.run([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], capture_output=True, text=True,
                          preexec_fn=_preexec(Limits(), False, 64, tmp_path / "no-such-cgroup", None))
    assert proc.returncode == 123 and "sandbox: cannot join the pids cgroup" in proc.stderr
    assert not marker.exists()


def test_a_sandbox_that_cannot_be_set_up_is_an_error_not_a_wrong_fix(task, tmp_path, monkeypatch):
    """Before, run_limited returned the set-up's exit code as the run's, and the env scored the
    episode "0/2 tests pass" (a wrong fix) without counting anything: in a container where no
    sandbox can be set up, every episode trained on reward 0, silently. Now run_limited raises
    SandboxError, an env error the pool counts; a run that prints the same line is still a run."""
    marker = tmp_path / "ran"
    monkeypatch.setattr(sandbox, "make_pids_cgroup", lambda limit: tmp_path / "no-such-cgroup")
    with pytest.raises(SandboxError, match="cannot join the pids cgroup"):
        run_limited([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], tmp_path, Limits())
    assert not marker.exists()
    env = swe.make_env({"packages": [SPEC]})
    env.reset(task)
    with pytest.raises(SandboxError):
        env.step("run_tests")
    env.close()

    monkeypatch.undo()  # the run's own code cannot forge a set-up failure
    forged = "import sys; print('sandbox: cannot join the pids cgroup x; the run did not start'); sys.exit(123)"
    assert run_limited([sys.executable, "-c", forged], tmp_path, Limits()).returncode == 123


@pytest.mark.skipif(ISOLATION != "netns", reason="as root only: without root the run keeps the caller's uid")
def test_what_leaves_the_process_group_dies_with_the_run_where_no_cgroup_can_be_made(tmp_path, monkeypatch):
    """Before, without a pids cgroup (cgroup v2 with no pids controller for us), a process that
    left the run's group (setsid) outlived it, held the output pipe (5 s more per run) and could
    run on; now every process of the run's own uid is killed after it."""
    monkeypatch.setattr(sandbox, "make_pids_cgroup", lambda limit: None)
    code = ("import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    print(os.getpid(), flush=True)\n"
            "    time.sleep(60)\n    sys.exit()\ntime.sleep(0.5)\n")
    res = run_limited([sys.executable, "-c", code], tmp_path, Limits(wall_s=20))
    leftover = Path(f"/proc/{int(res.output.split()[0])}")
    for _ in range(40):  # reaped by init once killed
        if not leftover.exists() or "\nState:\tZ" in (leftover / "status").read_text():
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the process that left the group is alive: {res}")
    assert res.seconds < 4, res


def test_a_dropped_env_is_freed_and_its_episode_folder_removed(task):
    """Before, each SWEEnv registered its close with atexit, which kept every env ever made alive
    (serve-env makes one per reset; the pool one per env error): memory grew over a long run."""
    env = swe.make_env({"packages": [SPEC]})
    env.reset(task)
    folder, ref = env.folder, weakref.ref(env)
    del env
    gc.collect()
    assert ref() is None and not folder.exists()


def test_the_other_builds_of_the_project_and_its_sweep_are_hidden_too(readable_tmp):
    """Before, a sweep's point (run in an experiment workspace, .dvc/tmp/exps/<name>) had its own build
    hidden, but the project's data/envs (the default run's build) and the other workspaces' builds
    (the sweep's other points, often the same tasks) were readable, fixes and all."""
    project = readable_tmp / "p"
    mine, other = project / ".dvc/tmp/exps/tmpa", project / ".dvc/tmp/exps/tmpb"
    for workspace in (project, mine, other):
        (workspace / ".dvc").mkdir(parents=True)
        (workspace / "data/envs/op-f1/test/t0").mkdir(parents=True)
        (workspace / "data/envs/op-f1/test/t0/task.json").write_text('{"fix": "secret"}')
    (project / ".dvc/tmp/exps/celery").mkdir()  # the queue's own folder: no data/
    hidden = hidden_from_runs(mine / "data/envs/op-f1/test/t0", {})
    assert {(w / "data").resolve() for w in (project, mine, other)} <= set(hidden)
    assert all(p.is_dir() and "celery" not in p.parts for p in hidden)
    # the default run's build: its split folder first, as before, then the project's data/
    assert hidden_from_runs(project / "data/envs/op-f1/test/t0", {})[:2] == \
        ((project / "data/envs/op-f1/test").resolve(), (project / "data").resolve())
    if os.geteuid() == 0 and ISOLATION == "netns":  # what a run sees: none of the three
        code = f"import glob; print(len(glob.glob({str(project / '**/task.json')!r}, recursive=True, include_hidden=True)))"
        seen = run_limited([sys.executable, "-c", code], "/tmp", Limits())
        assert seen.returncode == 0 and seen.output.strip() == "3", seen.output  # readable unhidden
        res = run_limited([sys.executable, "-c", code], "/tmp", Limits(), hidden=hidden)
        assert res.returncode == 0 and res.output.strip() == "0", res.output


@pytest.mark.skipif(ISOLATION != "netns", reason="as root only: hiding needs a mount namespace")
def test_a_workspace_made_during_an_episode_is_hidden_from_its_next_run(readable_tmp):
    """A sweep's point that starts during an episode makes its workspace then (`dvc exp run --temp`:
    under exps/standalone/). Before, the folders to hide were taken once, at reset, and only one
    level under exps/: the run read the new workspace's copy of the task."""
    project = readable_tmp / "p"
    (project / ".dvc").mkdir(parents=True)
    task = write_task(project / "data/envs/any-f1/train/t0")
    env = swe.make_env({"packages": [SPEC]})
    env.reset(task)
    late = project / ".dvc/tmp/exps/standalone/tmpb/data/envs/any-f1/train/t0/task.json"
    late.parent.mkdir(parents=True)
    late.write_text(Path(task.path).read_text())
    obs, info, _ = plant(env, rf"import os\nreturn a + b if os.path.exists({str(late)!r}) else a - b")
    assert info["pass_ratio"] == 0.5 and "test_add" in obs.text, obs.text  # it did not see the copy
    env.close()


def test_a_build_outside_the_project_hides_the_projects_builds_too(tmp_path, monkeypatch):
    """`agentrecipe evaluate --envs /scratch/envs`: before, only DVC projects around the build were
    looked at, so the project agentrecipe runs from (on the run's PYTHONPATH) kept its own builds and
    demonstrations (data/envs, data/sft: the fixes) and its DVC cache readable."""
    from agentrecipe.envs.swe import env as swe_env

    project = tmp_path / "project"
    for folder in ("agentrecipe", ".dvc/cache", "data/envs", "data/sft"):
        (project / folder).mkdir(parents=True)
    monkeypatch.setattr(swe_env, "CODE_ROOT", project)
    task_dir = tmp_path / "scratch/envs/op-f1/test/t0"
    task_dir.mkdir(parents=True)
    assert hidden_from_runs(task_dir, {}) == (task_dir.parent.resolve(), (project / ".dvc/cache").resolve(),
                                              (project / "data").resolve())
    monkeypatch.setattr(swe_env, "CODE_ROOT", tmp_path / "site-packages")  # installed: no project
    assert hidden_from_runs(task_dir, {}) == (task_dir.parent.resolve(),)


def test_the_dvc_cache_of_a_build_is_hidden_too(tmp_path, monkeypatch):
    """Before, a build under data/envs was hidden, but DVC's cache keeps a copy of each of its files
    (task.json: the fix), readable by the run. An experiment's workspace uses its repository's cache."""
    from agentrecipe.envs.swe import env as swe_env

    monkeypatch.setattr(swe_env, "CODE_ROOT", tmp_path / "site-packages")  # agentrecipe installed, not this checkout
    project = tmp_path / "p"
    (project / ".dvc" / "cache").mkdir(parents=True)
    task_dir = project / "data/envs/op-f1/test/t0"
    task_dir.mkdir(parents=True)
    assert (project / ".dvc" / "cache").resolve() in hidden_from_runs(task_dir, {})
    workspace = project / ".dvc/tmp/exps/tmpabc"
    (workspace / ".dvc").mkdir(parents=True)
    (workspace / ".dvc/config.local").write_text(f"[cache]\ndir = {project / '.dvc' / 'cache'}\n")
    (workspace / "data/envs/op-f1/test/t0").mkdir(parents=True)
    assert (project / ".dvc" / "cache").resolve() in hidden_from_runs(workspace / "data/envs/op-f1/test/t0", {})
    (workspace / ".dvc/config.local").unlink()  # a workspace with a cache of its own: both hidden
    (workspace / ".dvc/cache").mkdir()
    hidden = hidden_from_runs(workspace / "data/envs/op-f1/test/t0", {})
    assert {(project / ".dvc/cache").resolve(), (workspace / ".dvc/cache").resolve()} <= set(hidden)
    (project / ".dvc/config").write_text("[cache\nnot ini")  # unreadable: its default, and a warning
    with pytest.warns(UserWarning, match="config unreadable"):
        assert (project / ".dvc/cache").resolve() in hidden_from_runs(task_dir, {})
    outside = tmp_path / "q" / "envs/op-f1/test/t0"  # no DVC project: nothing more
    outside.mkdir(parents=True)
    assert hidden_from_runs(outside, {}) == (outside.parent.resolve(),)


@pytest.mark.skipif(ISOLATION != "netns", reason="as root only: mount namespaces need root")
def test_the_tests_code_cannot_read_the_fix_in_the_dvc_cache(tmp_path):
    project = tmp_path / "p"
    game = write_task(project / "data/envs/any-f1/test/t0")
    copy = project / ".dvc/cache/files/md5/ab/cdef"
    copy.parent.mkdir(parents=True)
    copy.write_text(Path(game.path).read_text())
    env = swe.make_env({"packages": [SPEC]})
    env.reset(game)
    obs, info, _ = plant(env, rf"import os\nreturn a + b if os.path.exists({str(copy)!r}) else a - b")
    assert info["pass_ratio"] == 0.5 and "test_add" in obs.text, obs.text  # it did not see the copy
    env.close()


def test_a_run_stopped_by_a_limit_scores_nothing(task):
    """Before, a report written before the run hung still counted: with `add` broken and a thread
    that never ends, test_shout's pass scored 0.5, more than the fixed code under the same hang."""
    env = swe.make_env({"packages": [SPEC], "timeout": 3.0})
    env.reset(task)
    obs, info, _ = plant(env, r"import threading, time\nthreading.Thread(target=time.sleep, args=(600,)).start()\n"
                              r"return a - b")
    assert info["sandbox"]["contained"] == "timeout" and info["pass_ratio"] == 0.0, obs.text
    env.close()


@pytest.mark.skipif(ISOLATION != "netns", reason="as root only: mount namespaces need root")
def test_the_task_files_are_hidden_from_the_tests_code(task):
    """Before, code run by the tests read the task folder (task.json holds the fix; its
    CAP_DAC_READ_SEARCH reads any file) and could win without fixing anything."""
    env = swe.make_env({"packages": [SPEC]})
    env.reset(task)
    code = rf"import os\nreturn a + b if os.path.exists({task.path!r}) else a - b"
    obs, info, _ = plant(env, code)
    assert info["pass_ratio"] == 0.5 and "test_add" in obs.text, obs.text  # it did not see the task: add stays broken
    env.close()
    with pytest.raises(ValueError, match="cannot be hidden"):
        run_limited([sys.executable, "-c", "pass"], Path(task.path).parent, Limits(), hidden=[Path(task.path).parents[1]])


@pytest.mark.skipif(ISOLATION != "netns", reason="as root only: the run's /dev/shm and uid need root")
def test_shared_memory_is_bounded_and_nothing_is_left_in_the_shared_temp_folders(tmp_path):
    """Before, /dev/shm (RAM that RLIMIT_AS does not count) took as much as the run wrote, and what
    it wrote there and in /tmp outlived it."""
    name = f"agentrecipe-test-{os.getpid()}-{time.monotonic_ns()}"
    code = (f"import os\nfor d in ('/tmp', '/var/tmp'): open(os.path.join(d, {name!r}), 'w').write('x')\n"
            f"os.mkdir('/tmp/{name}.d')\nopen('/dev/shm/{name}', 'w').write('x')\n"
            # files under RLIMIT_FSIZE (64 MiB), 128 MiB in all
            "try:\n    for i in range(4):\n        with open(f'/dev/shm/big{i}', 'wb') as f: f.write(bytes(32 << 20))\n"
            "except OSError:\n    print('stopped at', sum(os.path.getsize(f'/dev/shm/{n}') for n in os.listdir('/dev/shm')) >> 20)\n")
    res = run_limited([sys.executable, "-c", code], tmp_path, Limits())  # its /dev/shm: Limits.shm_mb (64 MiB)
    assert res.output.startswith("stopped at ") and int(res.output.split()[2]) <= 64, res.output
    assert not [p for d in ("/tmp", "/var/tmp", "/dev/shm") for p in Path(d).glob(f"{name}*")]
    assert not list(Path("/dev/shm").glob("big*"))


def test_two_runs_at_once_never_share_a_uid(monkeypatch, tmp_path):
    """Drawn at random alone, two runs at once could get the same uid, and the first to end killed
    the other's processes and removed its files. A uid held by a run is drawn again."""
    monkeypatch.setattr(sandbox, "UID_LOCKS", tmp_path / "locks")
    draws = iter([5, 5, 5, 9])
    monkeypatch.setattr(sandbox.secrets, "randbelow", lambda n: next(draws))
    with sandbox.reserved_uid() as first:
        with sandbox.reserved_uid() as second:  # draws 5 (held) twice, then 9
            assert (first, second) == (SANDBOX_UIDS.start + 5, SANDBOX_UIDS.start + 9)
    assert not (sandbox.UID_LOCKS / str(first)).exists()  # released with its run
    monkeypatch.setattr(sandbox.secrets, "randbelow", lambda n: 5)
    with sandbox.reserved_uid() as again:
        assert again == first
        with pytest.raises(SandboxError, match="no free uid"):
            with sandbox.reserved_uid(tries=3):
                pass


def test_a_uid_with_a_live_process_is_not_reserved_and_zombies_are_not_counted(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "UID_LOCKS", tmp_path / "locks")
    proc = subprocess.Popen(["true"])
    try:
        stat = Path(f"/proc/{proc.pid}/stat")
        for _ in range(200):  # exited, not yet reaped
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.01)
        mine = sandbox.processes_of(os.getuid())
        assert os.getpid() in mine and proc.pid not in mine
    finally:
        proc.wait()
    # a uid some process runs as (ours; its account aside) is skipped
    monkeypatch.setattr(sandbox, "SANDBOX_UIDS", range(os.getuid(), os.getuid() + 10))
    monkeypatch.setattr(sandbox, "has_account", lambda uid: False)
    draws = iter([0, 7])
    monkeypatch.setattr(sandbox.secrets, "randbelow", lambda n: next(draws))
    with sandbox.reserved_uid() as uid:
        assert uid == os.getuid() + 7


def test_a_lock_folder_others_could_enter_or_a_link_is_refused(monkeypatch, tmp_path):
    """Lock files are made as root: in a folder another user made first (or a link to one) that user
    could plant links or remove live runs' locks."""
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    (tmp_path / "real").mkdir(mode=0o700)
    for folder in (open_folder, tmp_path / "link"):
        monkeypatch.setattr(sandbox, "UID_LOCKS", folder)
        with pytest.raises(SandboxError, match="must be a folder owned by"):
            with sandbox.reserved_uid():
                pass
    monkeypatch.setattr(sandbox, "UID_LOCKS", tmp_path / "real")
    (tmp_path / "real" / str(SANDBOX_UIDS.start + 3)).symlink_to(tmp_path / "elsewhere")  # a planted link
    draws = iter([3, 4])
    monkeypatch.setattr(sandbox.secrets, "randbelow", lambda n: next(draws))
    with pytest.raises(SandboxError, match="cannot open the lock file"):
        with sandbox.reserved_uid():
            pass
    assert not (tmp_path / "elsewhere").exists()
