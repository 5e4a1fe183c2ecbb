"""SWE task generation, SWE-smith style (Yang et al. 2025, arXiv:2504.21798): plant bugs in a real
package and keep those its own tests catch.

Level names: ``KIND-fN``: KIND one of the mutation kinds of `mutate.KINDS` or ``any``
(kinds taken in turn), N in 1..3 the number of files the agent must fix (N bugs, one
per file, in one package). E.g. ``cmp-f1``, ``any-f2``.

One task per seed:
1. the pool: every mutation of the level's kinds on a line the package's tests execute
   (`packages.prepare` traced them), whose fix is a one-line action the agent can send
   (`agent.prompt.parse_reply` leaves it as is), in this split's hash bucket
   (train 0-6, valid 7, test 8-9 of 10, so splits never share a bug), shuffled by level,
   packages and kinds taken in turn;
2. seed s walks the positions p = (s mod S) + kS, k = 0, 1, ... of the pool (S = the
   stride, min(100, |pool| / 10)) and takes the first N mutations (distinct files of one
   package) that each make some of the tests that execute their line fail, with the file
   still compiling. Seeds that differ mod S walk disjoint positions, so up to S
   consecutive seeds get distinct bugs; a bug a lower seed of the split took is skipped
   too (the build gives a split one job: `WHOLE_SPLITS`). When its own positions hold no such
   bug, a seed walks on through the rest of the pool;
3. all N applied together: FAIL_TO_PASS = the tests that then fail; PASS_TO_PASS = up to
   ``p2p`` other tests of the mutated files (else of the package) that still pass.

A task folder holds ``task.json`` and ``repo/`` (the package with the bugs planted).
The issue text names the failing tests and their assertion messages, never the change.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import tempfile
import warnings
from dataclasses import asdict
from pathlib import Path

from agentrecipe.envs.base import GameSpec
from agentrecipe.envs.swe import mutate
from agentrecipe.envs.swe.packages import BrokenPackage, Package, prepare, run_tests
from agentrecipe.envs.swe.sandbox import Limits, cpu_limit

LEVEL = re.compile(r"^(any|" + "|".join(mutate.KINDS) + r")-f([1-9]\d*)$")
MAX_FILES = 3
PAGE_JUMPS = (1, 2, 4, 8, 16, 32)
"""Pages `open FILE START` may jump from the open window (offered as admissible commands)."""
BUCKETS = {"train": range(0, 7), "valid": range(7, 8), "test": range(8, 10)}
TASK_FILE = "task.json"
REQUIRED = ("package", "mutations", "FAIL_TO_PASS", "PASS_TO_PASS", "issue", "sources", "test_files")


def parse_level(name: str) -> tuple[tuple[str, ...], int]:
    """(mutation kinds, number of files) of a level; ValueError naming it otherwise."""
    m = LEVEL.match(name)
    if not m or not 1 <= int(m.group(2)) <= MAX_FILES:
        raise ValueError(f"unknown SWE level {name!r}; use KIND-fN with KIND in "
                         f"{', '.join(('any',) + mutate.KINDS)} and N in 1..{MAX_FILES} (e.g. cmp-f1, any-f2)")
    kinds = mutate.KINDS if m.group(1) == "any" else (m.group(1),)
    return kinds, int(m.group(2))


def read_task(path: str | Path) -> dict:
    """The task.json of a task folder (or the file itself); a clear error when it or a list is missing."""
    path = Path(path)
    if path.is_dir():
        path = path / TASK_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path.parent}: not a SWE task folder (no {TASK_FILE})")
    task = json.loads(path.read_text())
    missing = [k for k in REQUIRED if k not in task]
    if missing:
        raise ValueError(f"{path}: SWE task without its {', '.join(missing)} (the test lists come from the build)")
    if not task["FAIL_TO_PASS"]:
        raise ValueError(f"{path}: SWE task with an empty FAIL_TO_PASS list")
    if not (path.parent / "repo").is_dir():
        raise FileNotFoundError(f"{path.parent}: SWE task folder without its repo/")
    return task


def issue_text(package: str, f2p: list[str], messages: dict[str, str], shown: int = 3) -> str:
    """What a user would report: which tests fail and how (never where or why)."""
    lines = [f"The test suite of {package} fails."]
    for test in f2p[:shown]:
        message = (messages.get(test, "").strip().splitlines() or ["no message"])[0]
        lines.append(f"{test} fails: {message[:200]}")
    if len(f2p) > shown:
        lines.append(f"... {len(f2p)} failing tests in all.")
    lines.append("Fix the package's source code (not its tests) so that the tests pass.")
    return "\n".join(lines)


# ------------------------------------------------------------------- the pool
def fits_action(command: str) -> bool:
    """The command survives the agent's reply parsing unchanged (one line, length, no stripped ends)."""
    from agentrecipe.agent.prompt import parse_reply

    return parse_reply(command) == command


def mutation_pool(packages: list[Package], kinds: tuple[str, ...], split: str, level: str) -> list[tuple[Package, mutate.Mutation]]:
    """Step 1 of the module docstring: the split's candidate mutations in this level's order."""
    by_kind: dict[str, list] = {k: [] for k in kinds}
    for pkg in packages:
        for file in pkg.sources:
            covered = {int(n) for n, tests in pkg.coverage.get(file, {}).items() if tests}
            if not covered:
                continue
            text = (pkg.root / file).read_text()
            for m in mutate.candidates(file, text, set(kinds), covered):
                if (m.bucket() in BUCKETS[split] and "\\" not in m.original  # edit reads \\n and \\t as escapes
                        and fits_action(mutate.fix_command(m))):
                    by_kind[m.kind].append((pkg, m))
    rng = random.Random(f"swe/{level}/{split}")
    for kind, items in by_kind.items():
        items.sort(key=lambda pm: (pm[0].spec, pm[1].key))
        rng.shuffle(items)
        by_kind[kind] = _interleave([[pm for pm in items if pm[0] is pkg] for pkg in packages])
    return _interleave(list(by_kind.values()))  # kinds in turn: `any` is not dominated by the most frequent kind


def _interleave(lists: list[list]) -> list:
    """Round robin over lists: a[0], b[0], a[1], b[1], ... (packages within a kind, then kinds)."""
    return [items[i] for i in range(max(map(len, lists), default=0)) for items in lists if i < len(items)]


class Builder:
    """Validates mutations in a scratch copy of each package (one per process) and writes tasks."""

    def __init__(self, opts: dict) -> None:
        self.opts = opts
        self.limits = Limits(wall_s=float(opts["build_timeout"]), cpu_s=cpu_limit(opts["build_timeout"]),
                             memory_mb=int(opts["memory_mb"]), nproc=int(opts["nproc"]),
                             max_output=int(opts["max_output"]))
        self.scratch: dict[str, Path] = {}
        self.verdicts: dict[str, dict | None] = {}
        self.counts = {"no tests failed": 0, "did not compile": 0, "run stopped or no report": 0}
        self.last_output = ""

    def _scratch(self, pkg: Package) -> Path:
        if pkg.spec not in self.scratch:
            tmp = Path(tempfile.mkdtemp(prefix="swe-build-"))
            shutil.copytree(pkg.root, tmp / "repo", symlinks=True)
            self.scratch[pkg.spec] = tmp / "repo"
        return self.scratch[pkg.spec]

    def run_mutated(self, pkg: Package, mutations: list[mutate.Mutation], tests: list[str]) -> dict | None:
        """{nodeid: outcome} of `tests` with `mutations` applied, or None (no compile / timeout / no run)."""
        repo = self._scratch(pkg)
        try:
            for m in mutations:
                text = mutate.apply((pkg.root / m.file).read_text(), m)
                try:
                    compile(text, m.file, "exec")
                except SyntaxError:
                    self.counts["did not compile"] += 1
                    return None
                (repo / m.file).write_text(text)
            report, res = run_tests(repo, tests, self.limits)
        finally:
            for m in mutations:
                shutil.copy2(pkg.root / m.file, repo / m.file)
        if res.contained or not report["tests"]:
            self.counts["run stopped or no report"] += 1
            self.last_output = res.output[-600:]
            return None
        return report["tests"]

    def failing(self, pkg: Package, m: mutate.Mutation) -> dict | None:
        """Outcomes of the tests that execute m's line, if some of them fail with m (else None)."""
        if m.key not in self.verdicts:
            tests = sorted(pkg.coverage[m.file][str(m.line)])
            out = self.run_mutated(pkg, [m], tests)
            if out is not None and all(o["passed"] or o.get("skipped") for o in out.values()):
                self.counts["no tests failed"] += 1
                out = None
            self.verdicts[m.key] = out
        return self.verdicts[m.key]

    def close(self) -> None:
        for repo in self.scratch.values():
            shutil.rmtree(repo.parent, ignore_errors=True)
        self.scratch.clear()




def pick(builder: Builder, pool, n_files: int, seed: int, taken: set[str], max_tries: int):
    """Step 2 of the module docstring: (package, mutations) for one seed, or None."""
    tries = 0
    stride = max(1, min(100, len(pool) // 10))
    walk = [pool[p] for p in range(seed % stride, len(pool), stride)]
    walk += [pool[p] for p in range(len(pool)) if p % stride != seed % stride]  # then the rest, if need be
    for j, (pkg, first) in enumerate(walk):
        if first.key in taken or builder.verdicts.get(first.key, True) is None:
            continue
        tries += 1
        if tries > max_tries:
            return None
        if builder.failing(pkg, first) is None:
            continue
        chosen = [first]
        for other_pkg, m in walk[j + 1 :]:
            if len(chosen) == n_files:
                break
            if (other_pkg is pkg and m.file not in {c.file for c in chosen} and m.key not in taken
                    and builder.verdicts.get(m.key, True) is not None and builder.failing(pkg, m) is not None):
                chosen.append(m)
        if len(chosen) == n_files:
            return pkg, sorted(chosen, key=lambda m: m.file)
    return None


def write_task(builder: Builder, pkg: Package, chosen: list[mutate.Mutation], level: str, split: str, seed: int,
               folder: Path) -> GameSpec | None:
    """Step 3: run all bugs together, pick the test lists, write task.json + repo/; None if it does not hold."""
    opts = builder.opts
    rng = random.Random(f"swe/p2p/{level}/{split}/{seed}")
    touched = sorted({t for m in chosen for t in pkg.coverage[m.file][str(m.line)]})
    related = sorted({t for m in chosen for tests in pkg.coverage[m.file].values() for t in tests} - set(touched))
    others = sorted(t for t, o in pkg.outcomes.items() if o["passed"] and t not in set(touched) | set(related))
    sample = rng.sample(related, min(len(related), int(opts["p2p"])))
    sample += rng.sample(others, min(len(others), int(opts["p2p"]) - len(sample)))
    outcomes = builder.run_mutated(pkg, chosen, sorted(set(touched) | set(sample)))
    if outcomes is None:
        return None
    f2p = sorted(t for t, o in outcomes.items() if not o["passed"] and not o.get("skipped"))
    p2p = sorted(t for t in set(touched) | set(sample) if outcomes.get(t, {}).get("passed"))
    p2p = sorted(rng.sample(p2p, min(len(p2p), int(opts["p2p"]))))
    if not f2p:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    repo = folder / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(pkg.root, repo, symlinks=False, ignore=shutil.ignore_patterns("__pycache__", ".swe_report.json"))
    for m in chosen:
        (repo / m.file).write_text(mutate.apply((pkg.root / m.file).read_text(), m))
    window = int(opts["window"])
    plan = expert_plan(chosen, window)
    task = {
        "package": pkg.spec, "level": level, "split": split, "seed": seed,
        "mutations": [asdict(m) for m in chosen],
        "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p,
        "issue": issue_text(pkg.spec, f2p, {t: o["message"] for t, o in outcomes.items()}),
        "sources": [f for f in pkg.sources if any(pkg.coverage.get(f, {}).values())],
        "test_files": list(pkg.tests),
        "expert_plan": plan,
    }
    (folder / TASK_FILE).write_text(json.dumps(task, indent=1, sort_keys=True) + "\n")
    return GameSpec(path=str(folder / TASK_FILE), level=level, env="swe", split=split, seed=seed, max_score=1.0,
                    expert_plan=tuple(plan))


def navigation(page_from: int, page_to: int) -> list[int]:
    """Pages visited going from one page to another with the offered jumps (largest first)."""
    pages, here = [], page_from
    while here != page_to:
        step = max(j for j in PAGE_JUMPS if j <= abs(page_to - here))
        here += step if page_to > here else -step
        pages.append(here)
    return pages


def expert_plan(chosen: list[mutate.Mutation], window: int) -> list[str]:
    """Per bug: open its file, jump page by page (admissible jumps) to its line, apply the fix;
    then run the tests and submit."""
    plan = []
    for m in chosen:
        plan.append(f"open {m.file}")
        plan += [f"open {m.file} {1 + p * window}" for p in navigation(0, (m.line - 1) // window)]
        plan.append(mutate.fix_command(m))
    return plan + ["run_tests", "submit"]


def build_games(level: str, split: str, seeds, out_dir, opts: dict, cache: Path) -> list[GameSpec]:
    kinds, n_files = parse_level(level)
    packages = []
    for spec in opts["packages"]:
        try:
            packages.append(prepare(spec, cache, Limits(memory_mb=int(opts["memory_mb"]))))
        except BrokenPackage as e:
            warnings.warn(f"skipping package: {e}", stacklevel=2)
            print(f"swe: skipping package: {e}", flush=True)
    packages = [p for p in packages if sum(1 for f in p.sources if p.coverage.get(f)) >= n_files]
    if not packages:
        raise RuntimeError(f"SWE level {level}: no usable package with {n_files} tested source file(s) "
                           f"among {opts['packages']}")
    pool = mutation_pool(packages, kinds, split, level)
    if not pool:
        raise RuntimeError(f"SWE level {level} ({split}): no candidate mutation in {opts['packages']}")
    taken: set[str] = set()  # mutation keys used by lower seeds (the build gives a split one job: WHOLE_SPLITS)
    builder = Builder(opts)
    games = []
    try:
        for seed in seeds:
            for _ in range(int(opts["max_tries"])):
                got = pick(builder, pool, n_files, seed, taken, int(opts["max_tries"]))
                if got is None:
                    raise RuntimeError(f"SWE level {level} ({split}) seed {seed}: no mutation its tests catch "
                                       f"within {opts['max_tries']} tries (pool {len(pool)}; rejected so far: "
                                       f"{builder.counts}; last run's output: {builder.last_output!r}); "
                                       "use fewer tasks or more packages")
                pkg, chosen = got
                taken.update(m.key for m in chosen)
                game = write_task(builder, pkg, chosen, level, split, seed, Path(out_dir) / f"{level}-s{seed}")
                if game is not None:
                    games.append(game)
                    break
            else:
                raise RuntimeError(f"SWE level {level} ({split}) seed {seed}: no task held together")
    finally:
        builder.close()
    return games
