"""A SWE task as a text game: a fresh copy of the buggy package per episode, and six commands.

Commands (one line each, as the agent replies; see `agent.prompt.parse_reply`):

    ls [DIR]                      files and folders (folders end in /)
    open FILE [START]             lines START .. START + window - 1 of FILE, numbered
    search TEXT                   lines of the repository's .py files that contain TEXT
    edit FILE START END <<< TEXT  replace lines START..END (1-based, inclusive) by TEXT;
                                  END = START - 1 inserts before line START; empty TEXT deletes.
                                  TEXT is one line: a literal backslash-n (\\n) starts a new
                                  line. Every new line gets the indentation of line START
                                  (the agent's whitespace is collapsed on the way), plus four
                                  spaces per leading literal \\t.
    run_tests                     run the task's FAIL_TO_PASS + PASS_TO_PASS tests (sandboxed)
    submit                        run them a last time and end the episode

Edits change only the task's tested source files (``sources``: not its tests, conftest.py or
pytest.ini); test files are also restored before every run (as SWE-bench does), so a task is
solved only by fixing the package. Observations are cut to ``max_obs_chars``.

Score and reward: the score is the pass ratio of the task's tests at the last run (0
before any run), and `step` returns its change, so an episode's rewards sum to its final
pass ratio (max_score = 1; the dense reward). ``won`` = every test passes at ``submit``
(the sparse reward: resolved).

Admissible commands (what constrained decoding may choose): ``ls``, ``ls DIR`` for the
folders holding sources, ``open FILE`` for each tested source file, ``run_tests``,
``submit``, ``search`` with words of the failing tests' names, and, with a file open:
page jumps (``open FILE START`` at +-1, 2, 4, ... 32 windows), ``open`` at the first
search hits, and up to ``candidate_edits`` edits of the lines in view: the fix of each
planted bug in view (while its file is untouched) plus distractors drawn with a seeded
RNG from the mutations `mutate.candidates` finds in the visible lines. The list is
sorted, so the fix's position depends on its text, not on it being the fix.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import tempfile
import warnings
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

from agentrecipe.envs.base import GameSpec, Observation
from agentrecipe.envs.swe import mutate
from agentrecipe.envs.swe.packages import run_tests as pytest_run
from agentrecipe.envs.swe.sandbox import Limits, can_hide, cpu_limit, remove_path, remove_tree, resolve_inside
from agentrecipe.envs.swe.tasks import PAGE_JUMPS, fits_action, read_task

EDIT = re.compile(r"^edit (\S+) (\d+) (\d+) <<<(?: ?(.*))?$")
SEARCH_HITS = 20
WORKDIR = Path(tempfile.gettempdir()) / "agentrecipe-swe"


class CommandError(ValueError):
    """A command the env refuses (bad syntax, bad path): the agent is told why."""


def sweep_stale(root: Path = WORKDIR) -> int:
    """Remove episode folders left by dead processes (named <pid>-...); the count removed."""
    n = 0
    for d in root.glob("*-*") if root.is_dir() else ():
        pid = d.name.split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            remove_tree(d)
            n += 1
    return n


def dvc_projects_of(folder: Path) -> list[Path]:
    """The roots of every DVC project `folder` lies in, innermost first."""
    return [root for root in (folder, *folder.parents) if (root / ".dvc").is_dir()]


def dvc_caches_of(projects: list[Path]) -> list[Path]:
    """The caches of these DVC projects (DVC's config: an experiment's workspace under .dvc/tmp/exps
    uses its repository's cache, which is also the enclosing project's). A config DVC cannot read
    counts as its default cache, with a warning."""
    caches = []
    for root in projects:
        try:
            from dvc.config import Config

            cache = Config(dvc_dir=str(root / ".dvc"))["cache"].get("dir")
        except ImportError:
            cache = None  # no DVC installed: the project's config is not ours to read; its default
        except Exception as e:  # noqa: BLE001 - a config DVC cannot read
            warnings.warn(f"{root / '.dvc'}: DVC's config unreadable ({e}); hiding its default cache "
                          "from SWE runs only", stacklevel=2)
            cache = None
        caches.append((root / ".dvc" / cache if cache else root / ".dvc" / "cache").resolve())
    return list(dict.fromkeys(caches))


CODE_ROOT = Path(__file__).resolve().parents[3]
"""Where agentrecipe is imported from: the project (a checkout), or site-packages (installed)."""


def data_folders_of(projects: list[Path]) -> list[Path]:
    """The data/ folders of these DVC projects and of each one's experiment workspaces
    (.dvc/tmp/exps/*/data). A sweep's points run in such workspaces side by side, often on the
    same tasks: each one's data/envs holds their fixes."""
    found = []
    for root in projects:
        exps = root / ".dvc" / "tmp" / "exps"
        # the queue's workspaces are exps/<tmp>, `dvc exp run --temp`'s exps/standalone/<tmp>
        workspaces = sorted(exps.glob("*/data")) + sorted(exps.glob("standalone/*/data"))
        found += [(root / "data").resolve(), *(w.resolve() for w in workspaces)]
    return list(dict.fromkeys(found))


def hidden_from_runs(task_dir: Path, opts: dict) -> tuple[Path, ...]:
    """What the code a task runs must not read: the fix is in the task folders (task.json) and in
    the package cache (the packages unmutated). The folder of the task's split (its tasks), the
    build output it lies in (where a `_packages` cache sits beside the level folders),
    env.swe.cache_dir, the DVC cache of the project the build lies in (it keeps a copy of
    every file of a DVC-tracked build; every enclosing project's), and the data/ folders of those
    projects and of their experiment workspaces (other builds of the same tasks: the default run's,
    the other points of a sweep); the same of the project agentrecipe runs from (a build elsewhere,
    e.g. `--envs /scratch/envs`, leaves the project's own builds and demonstrations); the ones that
    exist and hold neither the episode folders, nor the interpreter, nor agentrecipe (a build into
    the project root: its split folders only; any other folder left readable so is warned about).
    Call it for each run: workspaces come and go."""
    split_dir = task_dir.resolve().parent
    build = split_dir.parents[1] if len(split_dir.parents) > 1 else split_dir
    found = [split_dir, *([build] if (build / "_packages").is_dir() else [])]
    found += [Path(opts["cache_dir"]).resolve()] if opts.get("cache_dir") else []
    build_projects = dvc_projects_of(build)
    # a build outside the project: the project's too (each DVC config read once)
    code_projects = [r for r in dvc_projects_of(CODE_ROOT) if r not in build_projects]
    for projects in (build_projects, code_projects):
        found += dvc_caches_of(projects) + data_folders_of(projects)
    existing = [p for p in dict.fromkeys(found) if p.is_dir()]
    refused = [p for p in existing if not can_hide(p, WORKDIR)]
    if unexpected := [p for p in refused if p != build]:
        warnings.warn(f"SWE runs can read {', '.join(map(str, unexpected))}: it holds {WORKDIR}, the interpreter or "
                      "agentrecipe, so it cannot be hidden (copies of the tasks' fixes may lie there)", stacklevel=2)
    return tuple(p for p in existing if p not in refused)


def edit_lines(lines: list[str], start: int, end: int, text: str) -> tuple[list[str], int]:
    """`lines` with START..END (1-based, inclusive) replaced by `text` (the `edit` command's
    rules: literal \\n splits lines, indentation of line START plus 4 spaces per leading \\t);
    (new lines, number of lines inserted). ValueError for a range outside the file."""
    if not (1 <= start <= len(lines) + 1 and start - 1 <= end <= len(lines)):
        raise ValueError(f"lines {start}-{end} are not a range of the file (1-{len(lines)}; END = START - 1 inserts)")
    base = mutate.indent_of(lines[start - 1]) if start <= len(lines) else mutate.indent_of(lines[-1])
    new = []
    for piece in text.split("\\n") if text else []:
        piece = piece.strip()
        level = 0
        while piece.startswith("\\t"):
            piece, level = piece[2:].lstrip(), level + 1
        new.append(base + "    " * level + piece if piece else "")
    return lines[: start - 1] + new + lines[end:], len(new)


def restore(src: Path, root: Path, rel: str) -> None:
    """Copy `src` to root/rel, replacing whatever the tests' code left on the way: a symlinked
    folder (writing through it would write outside the episode), a file where a folder belongs,
    a folder or FIFO where the file belongs. This process is not sandboxed, so it never follows
    a link the model's code made."""
    path = root
    for part in Path(rel).parts[:-1]:
        path = path / part
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            path.unlink()
        path.mkdir(exist_ok=True)
    dst = path / Path(rel).name
    remove_path(dst)
    shutil.copy2(src, dst)


def _lines(text: str) -> list[str]:
    return text.split("\n")


class SWEEnv:
    """Plays SWE tasks (task.json + repo/) one at a time; options: `agentrecipe.envs.swe.DEFAULTS`.

    ``stats`` counts, over the env's life: ``runs`` and ``run_seconds`` of test runs, the runs a
    limit stopped (``timeout``, ``output``) or a signal killed (``killed``), and ``refused_paths``.
    """

    def __init__(self, opts: dict) -> None:
        self.opts = opts
        self.window = int(opts["window"])
        self.max_chars = int(opts["max_obs_chars"])
        self.limits = Limits(wall_s=float(opts["timeout"]), cpu_s=cpu_limit(opts["timeout"]),
                             memory_mb=int(opts["memory_mb"]), nproc=int(opts["nproc"]),
                             max_output=int(opts["max_output"]))
        self.stats: Counter = Counter()
        self.folder: Path | None = None
        self.task: dict | None = None
        WORKDIR.mkdir(parents=True, exist_ok=True)
        sweep_stale()
        self._remover: weakref.finalize | None = None  # removes the episode folder at close, at exit,
        # or when the env is dropped unclosed (it holds no reference to the env: envs stay collectable)

    # ------------------------------------------------------------- episode
    def reset(self, game: GameSpec) -> Observation:
        self.close()
        task_dir = Path(game.path).parent
        self.task = read_task(game.path)
        self.task_dir = task_dir
        self.folder = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=WORKDIR))
        self._remover = weakref.finalize(self, remove_tree, self.folder)
        self.root = self.folder / "repo"
        shutil.copytree(task_dir / "repo", self.root, symlinks=True)
        self.score, self.done, self.won = 0.0, False, False
        self.open_file: str | None = None
        self.start = 1
        self.hits: list[tuple[str, int]] = []
        self.plan = list(self.task.get("expert_plan", game.expert_plan))
        self.on_plan = 0
        self.game = game
        return self._observe(f"Repository {self.task['package']}: fix the issue.\n" + self._ls("."))

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        if self.task is None:
            raise RuntimeError("step() before reset()")
        command = " ".join(action.split()) if not action.startswith("edit ") else action.strip()
        info: dict[str, Any] = {"action": command, "invalid": False}
        if self.done:
            return self._observe("The episode is over."), 0.0, True, {**info, "invalid": True}
        follows = 0 <= self.on_plan < len(self.plan) and command == self.plan[self.on_plan]
        self.on_plan = self.on_plan + 1 if follows else -1  # -1: off the expert's plan
        reward = 0.0
        try:
            verb, _, rest = command.partition(" ")
            if verb == "ls":
                text = self._ls(rest or ".")
            elif verb == "open":
                text = self._open(rest)
            elif verb == "search":
                text = self._search(rest)
            elif verb == "edit":
                text = self._edit(command)
            elif verb in ("run_tests", "submit") and not rest:
                ratio, text, sandbox = self._run()
                reward, self.score = ratio - self.score, ratio
                info["sandbox"], info["pass_ratio"] = sandbox, ratio
                if verb == "submit":
                    self.done, self.won = True, ratio == 1.0
                    text = f"Submitted. {text}\n{'Resolved.' if self.won else 'Not resolved.'}"
                    self._remove()
            else:
                raise CommandError(f"Unknown command {command[:60]!r}. Commands: ls [DIR], open FILE [START], "
                                   "search TEXT, edit FILE START END <<< TEXT, run_tests, submit.")
        except CommandError as e:
            info["invalid"] = True
            text = str(e)
            if "refused" in text:
                self.stats["refused_paths"] += 1
        return self._observe(text), reward, self.done, info

    def close(self) -> None:
        self._remove()

    def _remove(self) -> None:
        if self._remover is not None:
            self._remover()  # remove_tree(self.folder), once
            self._remover = None
        self.folder = None

    # ------------------------------------------------------------ commands
    def _path(self, name: str) -> Path:
        try:
            return resolve_inside(self.root, name)
        except ValueError as e:
            raise CommandError(f"Path refused: {e}") from None

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.root.resolve()) if path.is_absolute() else path)

    def _ls(self, name: str) -> str:
        path = self._path(name)
        if not path.is_dir():
            raise CommandError(f"ls: {name}: no such folder")
        entries = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir()
                         if not p.name.startswith(".") and p.name != "__pycache__")
        return f"{name}:\n" + "\n".join(entries)

    def _read(self, name: str) -> tuple[Path, list[str]]:
        path = self._path(name)
        if not path.is_file():
            raise CommandError(f"{name}: no such file")
        return path, _lines(path.read_text(errors="replace"))

    def _open(self, rest: str) -> str:
        parts = rest.split(" ")
        if not rest or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise CommandError("usage: open FILE [START]")
        _, lines = self._read(parts[0])
        start = min(max(1, int(parts[1]) if len(parts) == 2 else 1), max(1, len(lines)))
        self.open_file, self.start = parts[0], start
        end = min(len(lines), start + self.window - 1)
        body = "\n".join(f"{n}: {lines[n - 1]}" for n in range(start, end + 1))
        return f"{parts[0]} (lines {start}-{end} of {len(lines)})\n{body}"

    def _search(self, text: str) -> str:
        if not text:
            raise CommandError("usage: search TEXT")
        hits = []
        for path in sorted(self.root.rglob("*.py")):
            # only regular files: the tests' code may have left a FIFO named *.py (reading it blocks)
            if path.is_symlink() or not path.is_file() or "__pycache__" in path.parts:
                continue
            rel = str(path.relative_to(self.root))
            for n, line in enumerate(_lines(path.read_text(errors="replace")), 1):
                if text in line:
                    hits.append((rel, n, line.strip()))
        self.hits = [(f, n) for f, n, _ in hits if f in self.task["sources"]][:5]
        shown = "\n".join(f"{f}:{n}: {line}" for f, n, line in hits[:SEARCH_HITS])
        more = f"\n... {len(hits)} matches in all" if len(hits) > SEARCH_HITS else ""
        return f"{len(hits)} matches for {text!r}" + (f":\n{shown}{more}" if hits else ".")

    def _edit(self, command: str) -> str:
        m = EDIT.match(command)
        if not m:
            raise CommandError("usage: edit FILE START END <<< TEXT  (\\n separates lines)")
        name, start, end, text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4) or ""
        path, lines = self._read(name)
        rel = self._rel(path)
        if rel in self.task["test_files"]:
            raise CommandError(f"{name} is a test file: tests are restored before every run; fix the package instead.")
        if rel not in self.task["sources"]:  # before, pytest.ini or conftest.py: the tests ran on the agent's terms
            raise CommandError(f"{name} is not one of the package's tested source files, the only files edits may "
                               "change; fix the package there.")
        try:
            lines, n_new = edit_lines(lines, start, end, text)
        except ValueError as e:
            raise CommandError(f"edit {name}: {e}") from None
        path.write_text("\n".join(lines))
        note = ""
        try:
            compile("\n".join(lines), name, "exec")
        except SyntaxError as e:
            note = f"\nWarning: {name} no longer compiles: {e.msg} (line {e.lineno})."
        lo, hi = max(1, start - 2), min(len(lines), start + n_new + 1)
        view = "\n".join(f"{n}: {lines[n - 1]}" for n in range(lo, hi + 1))
        self.open_file, self.start = name, max(1, start - self.window // 2)
        return f"Edited {name}: lines {start}-{end} replaced by {n_new} line(s).{note}\n{view}"

    def _run(self) -> tuple[float, str, dict]:
        """Restore the test files, run the task's tests in the sandbox; (pass ratio, report, sandbox info)."""
        for rel in self.task["test_files"]:
            restore(self.task_dir / "repo" / rel, self.root, rel)
        tests = self.task["FAIL_TO_PASS"] + self.task["PASS_TO_PASS"]
        # taken at each run: a sweep's point that started since has made a workspace (and a build)
        report, res = pytest_run(self.root, tests, self.limits, hidden=hidden_from_runs(self.task_dir, self.opts))
        outcomes = report.get("tests", {})
        failed = [t for t in tests if not outcomes.get(t, {}).get("passed", False)]
        mismatch = not failed and res.returncode != 0  # the report says all pass, pytest does not:
        # the tests' code wrote the report; and a run stopped by a limit or that ended other than by
        # running its tests (pytest's 0 or 1) scores nothing (before, a fix that then hung scored 0
        # and the bug kept under the same hang 0.5: the report's passes counted)
        if mismatch or res.contained or res.returncode not in (0, 1):
            outcomes, failed = {}, list(tests)
        ratio = (len(tests) - len(failed)) / len(tests)
        self.stats["runs"] += 1
        self.stats["run_seconds"] += res.seconds
        if res.contained:
            self.stats[res.contained] += 1
        elif res.returncode < 0:  # a signal: RLIMIT_CPU (SIGXCPU), RLIMIT_FSIZE (SIGXFSZ), ...
            self.stats["killed"] += 1
        text = f"{len(tests) - len(failed)}/{len(tests)} tests pass."
        if mismatch:
            self.stats["report_mismatch"] += 1
            text += f" The run's report said every test passed, but pytest exited with code {res.returncode}."
        if res.timed_out:
            text += f" The run was stopped after {self.limits.wall_s:.0f} s (time limit)."
        if res.output_limited:
            text += f" The run was stopped: more than {self.limits.max_output} bytes of output."
        elif res.returncode < 0 and not res.timed_out:
            text += f" The run was killed by signal {-res.returncode} (a resource limit)."
        for t in failed[:5]:
            text += f"\nFAILED {t}: {outcomes.get(t, {}).get('message', 'did not run')[:200]}"
        return ratio, text, {"seconds": round(res.seconds, 3), "contained": res.contained,
                             "returncode": res.returncode}

    # --------------------------------------------------------- observation
    def _admissible(self) -> tuple[str, ...]:
        task = self.task
        cmds = {"ls", "run_tests", "submit"}
        cmds |= {f"ls {d}" for d in {str(Path(f).parent) for f in task["sources"]} if d != "."}
        cmds |= {f"open {f}" for f in task["sources"]}
        for test in task["FAIL_TO_PASS"][:3]:
            name = re.sub(r"\[.*", "", test.split("::")[-1]).removeprefix("test_")
            if name:
                cmds.add(f"search {name}")
        cmds |= {f"open {f} {1 + ((n - 1) // self.window) * self.window}" for f, n in self.hits}
        if self.open_file is not None and self.folder is not None:
            try:
                path, lines = self._read(self.open_file)
            except CommandError:
                path, lines = None, []
            if path is not None:
                page = (self.start - 1) // self.window
                pages = -(-len(lines) // self.window)
                for j in PAGE_JUMPS:
                    for p in (page - j, page + j):
                        if 0 <= p < pages:
                            cmds.add(f"open {self.open_file} {1 + p * self.window}")
                cmds |= set(self._candidate_edits(path, lines))
        return tuple(sorted(c for c in cmds if fits_action(c)))

    def _candidate_edits(self, path: Path, lines: list[str]) -> list[str]:
        rel = self._rel(path)
        if rel not in self.task["sources"]:  # the only files `edit` changes
            return []
        lo, hi = self.start, min(len(lines), self.start + self.window - 1)
        text = "\n".join(lines)
        fixes = []
        if text == (self.task_dir / "repo" / rel).read_text():  # untouched: the planted bugs are where they were
            for row in self.task["mutations"]:
                m = mutate.Mutation(**row)
                if m.file == rel and lo <= m.line <= hi:
                    fixes.append(mutate.fix_command(m))
        try:
            found = mutate.candidates(rel, text, None, set(range(lo, hi + 1)))
        except SyntaxError:
            found = []
        wrong = [f"edit {rel} {m.line} {m.line} <<< {(m.mutated or '').strip()}".rstrip() for m in found]
        wrong = sorted({w for w in wrong if fits_action(w)} - set(fixes))
        # the task's identity, not its path (the same task by a relative path, or in another clone,
        # offered other distractors)
        game = self.game
        seed = hashlib.sha256(f"{game.level}/{game.split}/{game.seed}/{rel}/{lo}/{text}".encode()).hexdigest()
        k = max(0, int(self.opts["candidate_edits"]) - len(fixes))
        return fixes + random.Random(seed).sample(wrong, min(k, len(wrong)))

    def _observe(self, text: str) -> Observation:
        if len(text) > self.max_chars:
            text = text[: self.max_chars] + f"\n... (output cut at {self.max_chars} characters)"
        plan = tuple(self.plan[self.on_plan:]) if self.on_plan >= 0 else ()
        return Observation(
            text=text,
            objective=self.task["issue"],
            admissible_commands=self._admissible() if not self.done else (),
            score=self.score,
            max_score=1.0,
            won=self.won,
            lost=self.done and not self.won,
            expert_action=plan[0] if plan else None,
            expert_plan=plan,
            extra={"package": self.task["package"]},  # (the sandbox counters live in self.stats)
        )
