"""Where model-written code runs: a subprocess in the episode folder, inside limits.

`run_limited(argv, folder, limits)` is the only way code of a SWE task is executed
(the package's tests, at build time and through the env's ``run_tests`` / ``submit``):

- wall time: the process group is killed after ``limits.wall_s`` seconds (and always
  at the end, so forked leftovers die with it);
- CPU seconds, address space and file size: ``resource.setrlimit`` in the child before
  exec (RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE);
- processes: a pids cgroup of its own (``pids.max = limits.nproc``; cgroup v1 or v2) when
  this process may create one (root), whose members are all killed at the end; and
  RLIMIT_NPROC (as root: ``limits.nproc`` for the run's own uid; else the user's processes
  now plus ``limits.nproc``, since it counts every process of the user);
- output: at most ``limits.max_output`` bytes are kept; past that the group is killed;
- network: as root, the child enters an empty network namespace (``unshare(CLONE_NEWNET)``:
  no interfaces, not even a working loopback). Without root no namespace can be made: proxy
  variables are unset instead; `ISOLATION` says which applies;
- mounts and IPC (as root): namespaces of its own too. Its /dev/shm is a fresh tmpfs of
  ``limits.shm_mb`` (RAM that RLIMIT_AS does not count: before, one run could fill the host's
  /dev/shm, and its files outlived it), gone with the run; the folders in ``hidden`` (the task
  files and the package cache: the fix, in a SWE task) are covered by an empty read-only tmpfs,
  since its CAP_DAC_READ_SEARCH reads any file. What it leaves in /tmp and /var/tmp (files and
  folders it owns at their top level) is removed after it;
- user: as root, the child then becomes a fresh unprivileged uid of its own (`SANDBOX_UIDS`,
  one per run, reserved for it by `reserved_uid`, no supplementary groups, no_new_privs). It keeps one capability,
  CAP_DAC_READ_SEARCH (ambient), so it can read the interpreter and the packages wherever
  they are installed (pyenv under a 0700 /root), and nothing else: it writes only where
  anyone may (/tmp) and in the folders lent to it (``writable=True``: the run folder, chowned
  to it for the run and back after), cannot signal or trace this process or any other, nor
  leave its cgroup or namespace. Without root the run keeps the caller's uid;
- set-up: a sandbox that cannot be set up (a container without CAP_SYS_ADMIN, say) runs nothing
  and raises `SandboxError`, told on a pipe that only the child's set-up holds (close-on-exec),
  so the code of the run cannot forge it, and the failure is never scored as a wrong fix;
- environment: a fixed, small set of variables (no proxies, no tokens of the caller; TMPDIR
  a folder of the run's own when it has a uid of its own).

Paths the agent names are checked by `resolve_inside` (no absolute paths, nothing that
resolves outside the folder, no symlinks on the way).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import pwd
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWIPC = 0x40000000, 0x00020000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 1 << 14, 1 << 18
SHARED_TMP = ("/tmp", "/var/tmp")
"""World-writable folders whose top-level leftovers of a run (as root: owned by its uid) are removed."""
PR_SET_KEEPCAPS, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE = 8, 24, 38, 47, 2
CAP_DAC_READ_SEARCH = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SANDBOX_UIDS = range(2_000_000, 3_000_000)
"""The uids (and gids) runs get as root, one drawn per run (`reserved_uid`): no account has them,
so a run owns nothing but what it is lent, and two runs cannot touch each other's files or processes."""
UID_LOCKS = Path("/run/agentrecipe-sandbox-uids")
"""One lock file per uid in use (an flock, held for the run, released if its process dies): a fixed
path, the same for every process whatever its TMPDIR, in root's /run rather than the shared /tmp."""


class SandboxError(RuntimeError):
    """The sandbox could not be set up: the run did not start (an environment error, never a score)."""


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@dataclass(frozen=True)
class Limits:
    wall_s: float = 30.0
    """Wall-clock seconds before the whole process group is killed."""
    cpu_s: int = 30
    memory_mb: int = 2048
    """RLIMIT_AS of the test process, in MiB."""
    nproc: int = 64
    """Processes the run may add to its user's (RLIMIT_NPROC; a fork bomb stops here)."""
    max_output: int = 200_000
    """Bytes of stdout + stderr kept; more kills the run."""
    file_mb: int = 64
    """RLIMIT_FSIZE: largest file the run may write, in MiB."""
    shm_mb: int = 64
    """Size of the run's own /dev/shm (as root), in MiB."""


@dataclass
class RunResult:
    returncode: int
    output: str
    seconds: float
    timed_out: bool = False
    output_limited: bool = False

    @property
    def contained(self) -> str:
        """Which limit ended the run ('' when it ended by itself)."""
        return "timeout" if self.timed_out else "output" if self.output_limited else ""


def cpu_limit(wall_s: float) -> int:
    """RLIMIT_CPU for a run limited to `wall_s` seconds: a little above it, so a single-threaded
    runaway is always stopped (and counted) by the wall-time limit; the CPU limit catches threads."""
    return int(wall_s) + 2


def _can_isolate() -> bool:
    return sys.platform == "linux" and os.geteuid() == 0


ISOLATION = "netns" if _can_isolate() else "proxy-unset"
"""'netns': namespaces of its own (network, mounts, IPC; as root); 'proxy-unset': none (not root)."""


def user_processes() -> int:
    """Processes of this real uid now (what RLIMIT_NPROC counts)."""
    uid, n = os.getuid(), 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if any(line.split()[1] == str(uid) for line in status.read_text().splitlines() if line.startswith("Uid:")):
                n += 1
        except OSError:
            pass
    return n


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The child's whole environment: PATH, locale, no proxies, no caller secrets."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/nonexistent",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "no_proxy": "*",
        "NO_PROXY": "*",
    }
    env.update(extra or {})
    return env


PIDS_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))


def make_pids_cgroup(limit: int) -> Path | None:
    """A fresh pids cgroup allowing `limit` processes, or None where none can be made."""
    for root in PIDS_ROOTS:
        if not (root / "cgroup.procs").exists() or not os.access(root, os.W_OK):
            continue
        group = root / f"agentrecipe-swe-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
        try:
            group.mkdir()
            (group / "pids.max").write_text(str(limit))
            return group
        except OSError:
            try:
                group.rmdir()
            except OSError:
                pass
    return None


def kill_all(pids: list[int]) -> None:
    """SIGKILL each of `pids`; one already gone is skipped."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove_pids_cgroup(group: Path) -> None:
    """Kill every process left in `group`, then remove it."""
    for _ in range(50):
        try:
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except OSError:
            return
        kill_all(pids)
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def _preexec(limits: Limits, isolate: bool, nproc: int, group: Path | None, uid: int | None,
             hidden: tuple[Path, ...] = (), report_fd: int | None = None):
    """The set-up of the child between fork and exec. report_fd: the write end of a close-on-exec
    pipe on which a failed set-up is told (only the set-up holds it: the run's code cannot write there)."""
    libc = ctypes.CDLL(None, use_errno=True)
    last_cap = int(Path("/proc/sys/kernel/cap_last_cap").read_text()) if uid is not None else 0

    def fail(code: int, why: str) -> None:
        """Never run unconfined: say why on the report pipe and on the run's output, and exit."""
        line = f"sandbox: {why}; the run did not start\n".encode()
        if report_fd is not None:
            os.write(report_fd, line)
        os.write(2, line)
        os._exit(code)

    def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None,
              gone_ok: bool = False) -> None:
        enc = lambda v: None if v is None else v.encode()  # noqa: E731
        if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
            if gone_ok and ctypes.get_errno() in (errno.ENOENT, errno.ENOTDIR):
                return
            fail(122, f"cannot mount {fstype or 'private'} on {target} (errno {ctypes.get_errno()})")

    def become(uid: int) -> None:
        """A fresh unprivileged uid keeping CAP_DAC_READ_SEARCH only (exits the child on any failure)."""
        for cap in range(last_cap + 1):
            if cap != CAP_DAC_READ_SEARCH and libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                fail(124, f"cannot drop capability {cap} from the bounding set (needs CAP_SETPCAP)")
        if libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
            fail(125, "cannot keep capabilities across setuid (prctl PR_SET_KEEPCAPS)")
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        except OSError as e:
            fail(129, f"cannot become uid {uid}: {e}")
        data = (_CapData * 2)()
        data[0].effective = data[0].permitted = data[0].inheritable = 1 << CAP_DAC_READ_SEARCH
        if libc.capset(ctypes.byref(_CapHeader(LINUX_CAPABILITY_VERSION_3, 0)), ctypes.byref(data)) != 0:
            fail(126, "cannot keep CAP_DAC_READ_SEARCH as the sandbox user (capset; a container without it?)")
        if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH, 0, 0) != 0:
            fail(127, "cannot raise CAP_DAC_READ_SEARCH as an ambient capability")
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            fail(128, "cannot set no_new_privs")

    def setup() -> None:  # runs in the child between fork and exec
        os.setsid()  # own process group: killed as one
        if group is not None:
            try:
                with open(group / "cgroup.procs", "w") as f:
                    f.write(str(os.getpid()))
            except OSError:
                fail(123, f"cannot join the pids cgroup {group}")
        if isolate:
            if libc.unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC) != 0:
                fail(121, "cannot enter new network, mount and IPC namespaces (needs CAP_SYS_ADMIN; a container "
                          "without it?)")
            mount(None, "/", None, MS_REC | MS_PRIVATE, None)  # nothing mounted here reaches the host
            if os.path.isdir("/dev/shm"):
                mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={limits.shm_mb}m,mode=1777")
            for folder in hidden:  # one removed meanwhile (a sweep's workspace) has nothing left to hide
                if os.path.isdir(folder):
                    mount("tmpfs", str(folder), "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                          "size=4k,mode=0555", gone_ok=True)
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
        mem = limits.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        size = limits.file_mb * 2**20
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        if uid is not None:  # last: as root the limits above may be raised past a low hard limit
            become(uid)

    return setup


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def chown_tree(folder: Path, uid: int, gid: int) -> None:
    """Give `folder` and everything in it to uid:gid without following links; a file with other
    hard links is left alone (its other names may lie outside the folder)."""
    for dirpath, dirnames, filenames in os.walk(folder):
        os.lchown(dirpath, uid, gid)
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode) or info.st_nlink == 1:
                os.lchown(path, uid, gid)


@contextmanager
def lent(folder: Path, uid: int | None):
    """`folder` belongs to `uid` inside the block and to its owner again after it."""
    if uid is None:
        yield
        return
    owner = os.stat(folder)
    chown_tree(folder, uid, uid)
    try:
        yield
    finally:
        chown_tree(folder, owner.st_uid, owner.st_gid)


def run_limited(argv: list[str], folder: str | Path, limits: Limits, env: dict[str, str] | None = None,
                writable: bool = False, hidden: tuple[str | Path, ...] = ()) -> RunResult:
    """Run `argv` in `folder` inside `limits`; never raises for what the child does, but raises
    `SandboxError` when the sandbox cannot be set up (nothing ran).

    writable: lend `folder` to the run (as root the run has a uid of its own, which may write
    only where it is let); without it, a run as root can write in `folder` only if anyone may.
    hidden: folders the run must not read (as root; none may hold `folder` or the interpreter)."""
    start = time.perf_counter()
    folder = Path(folder)
    hidden = tuple(Path(h).resolve() for h in hidden)
    for h in hidden:
        if not can_hide(h, folder):
            raise ValueError(f"sandbox: {h} cannot be hidden from a run: it holds the run's folder, the interpreter "
                             "or agentrecipe")
    with reserved_uid() if ISOLATION == "netns" else nullcontext() as uid:
        tmp = Path(tempfile.mkdtemp(prefix="agentrecipe-sandbox-")) if uid is not None else None
        try:
            if tmp is not None:
                os.chown(tmp, uid, uid)  # the run's own TMPDIR, empty and removed after it
            with lent(folder, uid if writable else None):
                extra = {**(env or {}), **({"TMPDIR": str(tmp)} if tmp else {})}
                return _run(argv, folder, limits, extra, uid, start, hidden)
        finally:
            if tmp is not None:
                remove_tree(tmp)
            if uid is not None:
                remove_owned(uid, SHARED_TMP)


@contextmanager
def reserved_uid(tries: int = 100):
    """A uid of SANDBOX_UIDS for one run, held until the block ends: no other run holds it (its lock
    file in UID_LOCKS), no account has it and no process runs as it. Drawn at random alone, two runs
    at once (pool workers, serve-env's threads) could draw the same uid, and the first to end would
    kill the other's processes (`kill_processes_of`) and remove its files (`remove_owned`)."""
    locks = os.open(lock_folder(), os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for _ in range(tries):
            uid = SANDBOX_UIDS.start + secrets.randbelow(len(SANDBOX_UIDS))
            if (fd := _lock_uid(locks, uid)) is not None:
                break
        else:
            raise SandboxError(f"sandbox: no free uid in {tries} draws (see {UID_LOCKS})")
        try:
            yield uid
        finally:
            try:
                os.unlink(str(uid), dir_fd=locks)
            except FileNotFoundError:
                pass
            finally:
                os.close(fd)
    finally:
        os.close(locks)


def lock_folder() -> Path:
    """UID_LOCKS, made if missing, refused (SandboxError) unless it is a real folder of this user's
    that no one else may enter: lock files are made in it as root."""
    try:
        UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(UID_LOCKS)
    except OSError as e:
        raise SandboxError(f"sandbox: cannot make the uid lock folder {UID_LOCKS} ({e})") from e
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SandboxError(f"sandbox: {UID_LOCKS} must be a folder owned by uid {os.geteuid()} with mode 0700 "
                           "(not a link, nothing for others); remove it")
    return UID_LOCKS


def _lock_uid(folder: int, uid: int) -> int | None:
    """The open, flock-held lock file of `uid` (in the lock folder open as `folder`) if the uid is
    free, else None."""
    name = str(uid)
    try:
        fd = os.open(name, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
    except OSError as e:
        raise SandboxError(f"sandbox: cannot open the lock file of uid {uid} in {UID_LOCKS} ({e})") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # still the file at its name (a run ending removes its file), and the uid has no account or process
        if (os.fstat(fd).st_ino == os.stat(name, dir_fd=folder, follow_symlinks=False).st_ino
                and not has_account(uid) and not processes_of(uid)):
            return fd
    except OSError:
        pass  # held by another run, or its file removed meanwhile
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def can_hide(folder: str | Path, run_folder: str | Path) -> bool:
    """Whether `folder` may be hidden from a run in `run_folder`: it holds neither that folder, nor the
    interpreter, nor agentrecipe (the run imports its pytest plugin)."""
    folder = Path(folder).resolve()
    return not any(Path(p).resolve().is_relative_to(folder)
                   for p in (run_folder, sys.prefix, sys.base_prefix, Path(__file__)))


def remove_owned(uid: int, folders: tuple[str, ...]) -> None:
    """Remove what `uid` owns at the top level of `folders` (a run's leftovers: its uid is its own)."""
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    remove_path(Path(entry.path))
            except OSError:
                pass


def processes_of(uid: int) -> list[int]:
    """PIDs of the live processes whose uid is `uid` (zombies skipped: they run nothing, and the
    kill cannot remove them; their parent, or init, reaps them)."""
    pids = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    pids.append(int(entry.name))
        except (OSError, IndexError):
            pass  # gone meanwhile
    return pids


def kill_processes_of(uid: int) -> None:
    """SIGKILL every process whose uid is `uid` (a run's own uid, reserved for it), until none is
    left: what left the run's process group (setsid) where no pids cgroup could be made."""
    for _ in range(50):
        pids = processes_of(uid)
        if not pids:
            return
        kill_all(pids)
        time.sleep(0.05)


def _run(argv: list[str], folder: Path, limits: Limits, env: dict[str, str], uid: int | None,
         start: float, hidden: tuple[Path, ...]) -> RunResult:
    group = make_pids_cgroup(limits.nproc)
    try:
        return _run_in(argv, folder, limits, env, uid, start, hidden, group)
    finally:
        if group is not None:
            remove_pids_cgroup(group)  # also when the run raised (a group already removed is skipped)


def _run_in(argv: list[str], folder: Path, limits: Limits, env: dict[str, str], uid: int | None,
            start: float, hidden: tuple[Path, ...], group: Path | None) -> RunResult:
    nproc = limits.nproc if uid is not None else user_processes() + limits.nproc
    report_r, report_w = os.pipe()  # close-on-exec (PEP 446): the run's own code never holds it
    try:
        proc = subprocess.Popen(argv, cwd=str(folder), env=clean_env(env), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                preexec_fn=_preexec(limits, ISOLATION == "netns", nproc, group, uid, hidden,
                                                    report_w))
    except subprocess.SubprocessError as e:  # the set-up raised (e.g. setrlimit past a hard limit)
        os.close(report_r)
        raise SandboxError(f"sandbox: the set-up failed ({e}); the run did not start") from e
    except BaseException:
        os.close(report_r)
        raise
    finally:
        os.close(report_w)
    chunks: list[bytes] = []
    over = threading.Event()

    def read() -> None:
        kept = 0
        while block := proc.stdout.read1(65536):
            if kept < limits.max_output:
                chunks.append(block[: limits.max_output - kept])
            kept += len(block)
            if kept > limits.max_output and not over.is_set():
                over.set()
                _kill_group(proc.pid)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill_group(proc.pid)  # also what the tests forked and left behind
    proc.wait()
    # The set-up writes its failure before the child exits; read what is there, never wait (a fork
    # by another thread of this process could hold a write end).
    os.set_blocking(report_r, False)
    try:
        setup_failure = os.read(report_r, 65536).decode("utf-8", "replace").strip()
    except BlockingIOError:
        setup_failure = ""
    finally:
        os.close(report_r)
    if group is not None:
        remove_pids_cgroup(group)  # and whatever left the process group
    if uid is not None:
        kill_processes_of(uid)  # and the group, where no cgroup could be made
    reader.join(timeout=5)
    if setup_failure:
        raise SandboxError(setup_failure)
    output = b"".join(chunks).decode("utf-8", "replace")
    return RunResult(proc.returncode, output, time.perf_counter() - start, timed_out, over.is_set())


def resolve_inside(root: str | Path, name: str) -> Path:
    """`root/name`, refused (ValueError) when absolute, outside root, or through a symlink."""
    root = Path(root).resolve()
    if not name or name.startswith(("/", "~")) or "\x00" in name:
        raise ValueError(f"{name!r}: only paths inside the repository, relative to its root")
    path = root
    for part in Path(name).parts:
        if part in ("", "."):
            continue
        if part == "..":
            raise ValueError(f"{name!r}: '..' is not allowed")
        path = path / part
        if path.is_symlink():
            raise ValueError(f"{name!r}: symbolic links are not followed")
    if not path.resolve().is_relative_to(root):
        raise ValueError(f"{name!r}: outside the repository")
    return path


def remove_tree(folder: str | Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def remove_path(path: Path) -> None:
    """Remove whatever is at `path` (file, link, FIFO or folder) without following a link."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
