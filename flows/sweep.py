"""Run an ablation as DVC experiments on DVC's own queue and compare them in one table.

A sweep is a list of `dvc exp run -S` overrides in Hydra's sweep syntax
(`rl=ppo,grpo`); DVC's own expansion (`dvc.utils.hydra.get_hydra_sweeps`, what
`dvc exp run --queue -S 'rl=ppo,grpo'` runs) gives its points. Each point is
queued with `dvc exp run --queue --name <point>`, named after the values it
sweeps (`rl-ppo_reward-dense`; DVC itself would name the points of one sweep
`<name>-1`, `<name>-2`, ...). `dvc exp run --run-all -j N` runs the queue, and
`dvc exp show --json` gives each point's state, params and metrics: a Prefect
table artifact, and results.csv + results.png under data/sweeps/<name>/. A point
that fails shows no numbers, and fails the flow run once the table is written.

    python -m flows.sweep --preset algo_x_reward --override experiment=micro
    python -m flows.sweep --override 'rl=ppo,grpo' --override 'reward=sparse,dense' --jobs 2
    python -m flows.sweep --preset budget_split --point sft_fraction-0.6_seed-1

A preset (params/sweep/<preset>.yaml) is a list of such sweeps; `--override`
adds to each of them; `--point NAME` (repeatable) runs only the named points
(rerun one that failed, or finish a sweep cut short; an earlier point whose experiment has
other params than its overrides compose to now is `stale`, without numbers). `--stop-after-s S` starts no
point after S seconds (the running ones finish): a sweep cut to a time slot.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from agentrecipe.presets import load_preset
from agentrecipe.report import compare, seeds
from agentrecipe.report.provenance import git_revision
from flows.dvc_dag import dvc, dvc_env, read_dag, run

OUT_DIR = "data/sweeps"
NO_METRICS = "without_metrics"
"""run.json key: the points whose experiments hold no metrics of their own (run with --target)."""


def expand(sweeps: list[list[str]]) -> list[list[str]]:
    """Every point of every sweep, as DVC expands `dvc exp run --queue -S ...` (first key slowest)."""
    from dvc.utils.hydra import get_hydra_sweeps

    return [point["params.yaml"] for s in sweeps for point in get_hydra_sweeps({"params.yaml": list(s)})]


def override_values(overrides: list[str]) -> dict[str, str]:
    """{key: value} of `key=value` overrides, the last value of a key winning (as in Hydra)."""
    return dict(o.partition("=")[::2] for o in overrides)


def seed_major(points: list[list[str]]) -> list[list[str]]:
    """The points ordered by their `seed` value (first-seen order of the values), the order within a
    seed kept: the queue runs every setting's first seed before any second seed, so a sweep cut short
    still compares every setting."""
    seed_of = [override_values(p).get(seeds.SEED_KEY, "") for p in points]
    rank = {s: i for i, s in enumerate(dict.fromkeys(seed_of))}
    return [p for _, _, p in sorted(zip((rank[s] for s in seed_of), range(len(points)), points))]


def swept_keys(points: list[list[str]]) -> list[str]:
    """The override keys whose value differs between points, in first-seen order."""
    parsed = [override_values(p) for p in points]
    return [k for k in dict.fromkeys(k for p in parsed for k in p) if len({p.get(k) for p in parsed}) > 1]


def result_keys(points: list[list[str]]) -> list[str]:
    """The columns of the results that say what each point set: the swept keys, and `seed` where every
    point sets it even if to one value (a one-seed sweep, e.g. `seed=0`), so that its rows are summed up
    like a seed axis's (one seed per setting) and a finding page can be written from them."""
    keys = swept_keys(points)
    fixed_seed = all(seeds.SEED_KEY in override_values(p) for p in points)
    return keys if seeds.SEED_KEY in keys or not fixed_seed else [*keys, seeds.SEED_KEY]


def point_names(points: list[list[str]]) -> list[str]:
    """`key-value` of each swept override the point has, joined by `_` (`rl-ppo_reward-dense`; every
    override when nothing differs): a key's last dotted part, a value's characters outside
    [A-Za-z0-9._] as '-', a leading minus as 'm'."""
    keys = swept_keys(points)
    names: list[str] = []
    for point in points:
        given = override_values(point)
        parts = []
        for key in [k for k in keys if k in given] or list(given):
            value = re.sub(r"[^A-Za-z0-9._]+", "-", re.sub(r"^-", "m", given[key])).strip("-.")
            parts.append(f"{key.split('.')[-1]}-{value or 'none'}")
        name = base = "_".join(parts) or "default"
        while name in names:  # a suffixed name can be taken too: `[6,3]` and then `[6]` twice
            name = f"{base}-{len(names) + 1}" if name == base else f"{name}-1"
        names.append(name)
    return names


def live_queue_workers(project: str) -> list[int]:
    """PIDs of this project's DVC queue workers still running (their pid files, as dvc_task writes them)."""
    live = []
    for pidfile in sorted(Path(project, ".dvc/tmp/exps/celery").glob("dvc-exp-worker-*.pid")):
        try:
            pid = int(pidfile.read_text())
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError, PermissionError):
            continue  # unreadable, the worker is gone, or a stale file's PID reused by another user's process
        live.append(pid)
    return live


def stop_queue_workers(project: str, skip: set[int] | frozenset[int] = frozenset()) -> set[int]:
    """SIGTERM (celery's warm shutdown: a running point finishes first) to this project's live queue
    workers but those in `skip` (told already); returns the PIDs told. Not `dvc queue stop`: that is a
    broadcast which, sent when no worker is up, stays in the broker and stops the next sweep's worker
    after its first point."""
    told = set()
    for pid in set(live_queue_workers(project)) - skip:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # it left by itself meanwhile
            os.kill(pid, signal.SIGTERM)
            told.add(pid)
    return told


def wait_for_queue_workers_to_leave(project: str, timeout_s: float = 90.0) -> None:
    """A DVC queue worker stays up to 10 s after its queue empties, then shuts down (dvc_task's
    TemporaryWorker); a point queued at that moment can be taken by the leaving worker and lost:
    it shows as failed, with no log (treeverse/dvc#9143, #10673). So a sweep started right after
    another waits until this project has no worker (at most `timeout_s`, then goes on, logged)."""
    deadline = time.monotonic() + timeout_s
    while (live := live_queue_workers(project)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if live:
        get_run_logger().warning("DVC queue worker(s) %s still up after %.0f s; queuing anyway", live, timeout_s)


@task(name="queue-points", cache_policy=NO_CACHE)
def queue_points(project: str, points: dict[str, list[str]], targets: list[str] | None = None) -> None:
    """`dvc exp run --queue --name <name> [targets] -S ...` per point (targets: the stages to run with
    their upstream, default all), once the workers of an earlier queue run have left; an experiment of
    the same name on this commit is replaced. A point DVC refuses (bad override) unqueues the others
    and fails the run."""
    logger, env = get_run_logger(), dvc_env(project)
    wait_for_queue_workers_to_leave(project)
    existing = set(run(dvc("exp", "list", "--name-only"), project, env).stdout.split())
    if old := sorted(existing & set(points)):
        logger.info("replacing earlier experiments: %s", ", ".join(old))
        run(dvc("exp", "remove", *old), project, env)
    # A failed run of a point stays in DVC's queue (`exp list` shows successes only), and `exp show`
    # listed it after the point's new run: a point that failed once showed as failed for good.
    status = run(dvc("queue", "status"), project, env).stdout
    if failed := [task for task, name in queue_tasks(status, "Failed") if name in points]:
        logger.info("removing earlier failed runs of these points from the queue: %s", ", ".join(failed))
        run(dvc("queue", "remove", *failed), project, env)
    queued = []
    for name, overrides in points.items():
        cmd = dvc("exp", "run", "--queue", "--name", name, *(targets or []), *[a for o in overrides for a in ("-S", o)])
        logger.info("$ dvc %s", " ".join(cmd[3:]))
        res = run(cmd, project, env)
        if res.returncode != 0:
            if queued:
                run(dvc("queue", "remove", *queued), project, env)
            raise RuntimeError(f"dvc could not queue {name} ({' '.join(overrides)}): {res.stderr.strip()}")
        queued.append(name)


# After a stop, how long no queue worker must be up before the queue's points are taken as not run: a
# worker writes its pid file a few seconds after `--run-all` starts it.
WORKER_GRACE_S = 15.0


def queue_workers_done(live: list[int], seen: set[int], jobs: int, idle_s: float) -> bool:
    """After a stop: no queue worker is up now and none will come. `dvc exp run --run-all -j jobs`
    spawns its `jobs` workers once, as it starts: once that many (`seen`) have come and gone, no
    other comes; until then one may still be starting, and the wait is WORKER_GRACE_S with none up
    (`idle_s`)."""
    return not live and (len(seen) >= jobs or idle_s >= WORKER_GRACE_S)


@task(name="run-queue", cache_policy=NO_CACHE)
def run_queue(project: str, names: list[str], jobs: int, log_path: str, stop_after_s: float | None = None) -> list[str]:
    """`dvc exp run --run-all -j jobs`, its output in `log_path` and the run log. The task's timeout
    (Prefect's `timeout_seconds`) interrupts the wait: running experiments are killed, queued ones removed.
    stop_after_s: after this many seconds the workers get a warm shutdown (each finishes the point it
    runs and takes no other; one coming up later is told too and runs at most one), and once the workers
    have left (`queue_workers_done`) this sweep's points still queued are removed. Returns the names of
    the points removed so (none without stop_after_s)."""
    env = dvc_env(project)
    # Workers side by side share the cores (stages size their torch threads by this).
    env.setdefault("AGENTRECIPE_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, jobs))))
    logger = get_run_logger()
    # The queue's workers are detached children holding the output open: a file, not a pipe.
    with open(log_path, "wb") as log, open(log_path, "rb") as follow:
        proc = subprocess.Popen(dvc("exp", "run", "--run-all", "-j", str(jobs)), cwd=project, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
        partial, started, stopping, told, last_up = b"", time.monotonic(), False, set(), 0.0
        seen: set[int] = set()  # the queue workers up at some poll (a worker left by an earlier run is gone)
        try:
            while proc.poll() is None:  # a Python loop, so a timeout can interrupt it
                time.sleep(1.0)
                seen.update(live_queue_workers(project))
                *lines, partial = (partial + follow.read()).split(b"\n")
                for line in lines:  # the queue's output, live in the run log
                    if text := line.decode(errors="replace").split("\r")[-1].strip():
                        logger.info(text)
                now = time.monotonic()
                if stop_after_s is not None and not stopping and now - started >= stop_after_s:
                    logger.info("stop after %.0f s: the workers finish their points and take no more", stop_after_s)
                    stopping, last_up = True, now
                if stopping:
                    told |= stop_queue_workers(project, told)  # also one that comes up late (a slow start)
                    seen |= told
                    if live := live_queue_workers(project):
                        last_up = now
                    if queue_workers_done(live, seen, jobs, now - last_up):
                        proc.kill()  # `--run-all` would wait for the queued points forever
                        proc.wait()
            # Every point has run (a worker runs each as one task): let the idle workers go now rather than
            # after their 10 s wait for more work, during which a point queued next could be lost.
            stop_queue_workers(project)
            if not stopping:
                return []
            # No worker is up now, so removing the queued points races with none (during a run it can hang).
            status = run(dvc("queue", "status"), project, env)
            queued = set(queued_points(status.stdout))
            if not_run := [n for n in names if n in queued]:
                removed = run(dvc("queue", "remove", *not_run), project, env)
                if status.returncode or removed.returncode:
                    raise RuntimeError(f"could not remove the points not run ({', '.join(not_run)}) from DVC's "
                                       f"queue: {(status.stderr + removed.stderr).strip()}")
                logger.warning("stopped after %.0f s; not run: %s", stop_after_s, ", ".join(not_run))
            elif status.returncode:
                raise RuntimeError(f"dvc queue status failed after the stop: {status.stderr.strip()}")
            return not_run
        except BaseException:
            proc.kill()
            stop_queue_workers(project)  # first: no worker takes another point
            # A point a worker was starting while we stopped it turns up as running a moment later:
            # kill (Ctrl-C to each running point's process group) and clear until nothing is left.
            for _ in range(5):
                run(dvc("queue", "kill", *names), project, env)
                run(dvc("queue", "remove", "--queued"), project, env)
                status = run(dvc("queue", "status"), project, env).stdout
                if "Running" not in status and "Queued" not in status:
                    break
                time.sleep(2.0)
            raise


def queue_tasks(status: str, state: str) -> list[tuple[str, str]]:
    """(task id, name) of the tasks in `state` (Queued, Failed, ...) in `dvc queue status`'s table
    (Task, Name, Created, Status)."""
    return [(cols[0], cols[1]) for line in status.splitlines() if len(cols := line.split()) >= 4 and cols[-1] == state]


def queued_points(status: str) -> list[str]:
    """The names of the queued points in `dvc queue status`'s table."""
    return [name for _, name in queue_tasks(status, "Queued")]


NO_LOG = "no log: failed before any stage ran (DVC's worker log: .dvc/tmp/exps/celery/dvc-exp-worker-1.out)"
STALE = "stale"
"""The state of a point whose experiment (of an earlier run on this commit) ran with other params than
the point's overrides compose to now, e.g. the others of a `--point` rerun given other `--override`s."""


def params_differ(params_dir: Path, overrides: list[str], params: dict[str, Any], shown: int = 3) -> str:
    """'' when `params` (an experiment's, flat) are what `overrides` compose to from `params_dir`;
    else the first keys that differ ('env.n_test 2, not 30; ...')."""
    from agentrecipe.params import compose

    want = compare.flatten(compose(params_dir, overrides))
    keys = [k for k in dict.fromkeys([*want, *params]) if want.get(k) != params.get(k)]
    return "; ".join(f"{k} {params.get(k)!r}, not {want.get(k)!r}" for k in keys[:shown]) + (
        f"; {len(keys) - shown} more" if len(keys) > shown else "")


@task(name="collect-results", cache_policy=NO_CACHE)
def collect_results(project: str, points: dict[str, list[str]], out: str, title: str,
                    without_metrics: dict[str, str] | None = None, baseline: str | None = None) -> list[dict[str, Any]]:
    """Each point's state and metrics from `dvc exp show --json`: results.csv (every metric),
    results.png, a table artifact (swept values, RL results, the error last) and the table in the log.
    without_metrics: {name: why} of points whose runs wrote no metrics (their experiments hold the
    commit's metrics files): their rows show none. baseline: the commit the points were queued on
    (default HEAD)."""
    by_name = {r["name"]: r for r in compare.experiments(compare.exp_show(project, baseline))}
    swept = result_keys(list(points.values()))
    with params_at(project, baseline) as params_dir:  # what the points composed to when they were queued
        rows = [_result_row(name, overrides, by_name.get(name), swept, params_dir, (without_metrics or {}).get(name))
                for name, overrides in points.items()]
    folder = Path(project) / out
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)
    write_plot(rows, title, folder / "results.png")
    shown = ["experiment", "state", *swept, "rl in-domain", "rl ood", "sft in-domain", "sft ood"]
    create_table_artifact([{**{c: r[c] for c in shown}, "error": r["error"][-200:]} for r in rows],
                          key="sweep-" + re.sub(r"[^a-z0-9-]+", "-", title.lower()).strip("-"),
                          description=f"Sweep {title}: {len(rows)} experiments ({out}/results.csv has every metric)")
    narrow = ["experiment", "state", *swept, "rl in-domain", "rl ood"]  # fits 120 columns
    get_run_logger().info("sweep %s:\n%s", title, compare.format_table([{c: r[c] for c in narrow} for r in rows]))
    for stale in ("summary.csv", "summary.png"):  # an earlier run of this name with a seed axis
        (folder / stale).unlink(missing_ok=True)
    if seeds.SEED_KEY in swept:
        write_seed_summary(rows, swept, title, folder)
    return rows


SAMPLING_KEY = "eval.temperature"
"""The param of each point kept in results.csv: whether its evaluation sampled episodes at all (at
temperature 0 a model's pass@k is its greedy episode's win; eval.samples is at least 1)."""


def _result_row(name: str, overrides: list[str], rec: dict[str, Any] | None, swept: list[str], params_dir: Path,
                no_metrics: str | None) -> dict[str, Any]:
    """A point's row: state, swept values, success cells, error and flat metrics (none unless its
    experiment succeeded with the params its overrides compose to and wrote metrics of its own)."""
    rec = rec or {"state": "missing", "metrics": {}, "log": None}
    given = override_values(overrides)
    state = rec["state"]
    error = (compare.error_tail(rec["log"]) or NO_LOG) if state == "failed" else ""
    if state == "success" and (differ := params_differ(params_dir, overrides, rec["params"])):
        state, error = STALE, f"ran with other params than this point's ({differ}); rerun it: --point {name}"
        rec = {**rec, "metrics": {}}
    elif state == "success" and no_metrics:
        error, rec = no_metrics, {**rec, "metrics": {}}
    return {"experiment": name, "state": state, **{k: given.get(k, "") for k in swept},
            **({} if SAMPLING_KEY in swept else {SAMPLING_KEY: (rec.get("params") or {}).get(SAMPLING_KEY, "")}),
            "rl in-domain": compare.success(rec["metrics"], "rl", "in_domain"),
            "rl ood": compare.success(rec["metrics"], "rl", "ood"),
            "sft in-domain": compare.success(rec["metrics"], "sft", "in_domain"),
            "sft ood": compare.success(rec["metrics"], "sft", "ood"),
            "error": error, **rec["metrics"]}


@contextlib.contextmanager
def params_at(project: str, rev: str | None):
    """The params/ folder of commit `rev` (a temporary copy, unless it is HEAD or None): a sweep's
    points are checked against what they composed to when queued, wherever HEAD is since."""
    if rev is None or rev == head_commit(project):
        yield Path(project) / "params"
        return
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", rev, "params"], cwd=project, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp) / "params"


def write_seed_summary(rows: list[dict[str, Any]], swept: list[str], title: str, folder: Path) -> None:
    """Points that differ only in `seed` summed up: summary.csv (mean, t interval, per-seed values and
    the pooled Wilson interval of each cell), summary.png, a table artifact and the table in the log."""
    from agentrecipe.report.finding import write_summary

    summaries = write_summary(rows, swept, title, folder)
    table = seeds.summary_table(summaries, swept, ["rl in-domain", "rl ood"])
    create_table_artifact(seeds.summary_table(summaries, swept, list(seeds.CELLS)),
                          key="sweep-" + re.sub(r"[^a-z0-9-]+", "-", title.lower()).strip("-") + "-seeds",
                          description=f"Sweep {title} across seeds: mean [95% t interval] and per-seed values "
                                      f"({folder.name}/summary.csv also has the pooled Wilson intervals)")
    get_run_logger().info("sweep %s across seeds, mean [95%% t interval]:\n%s", title, compare.format_table(table))


def write_plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    """RL success per point, in-domain and OOD, with 95% intervals (no bar where a point failed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 3.5))
    for i, (cell, label) in enumerate((("in_domain", "in-domain"), ("ood", "out-of-domain"))):
        m = [r.get(f"rl.{cell}.{k}") for r in rows for k in ("success", "success_ci_low", "success_ci_high")]
        mid, low, high = ([v if isinstance(v, (int, float)) else float("nan") for v in m[j::3]] for j in range(3))
        ax.bar([x + 0.4 * i for x in range(len(rows))], mid, 0.4, label=label,
               yerr=[[max(0, a - b) for a, b in zip(mid, low)], [max(0, b - a) for a, b in zip(mid, high)]], capsize=3)
    labels = [r["experiment"] + ("" if r["state"] == "success" else f"\n({r['state']})") for r in rows]
    ax.set_xticks([x + 0.2 for x in range(len(rows))], labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("RL success (greedy)")
    ax.set_ylim(0, 1)
    ax.set_title(f"sweep {title}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@flow(name="sweep")
def sweep(
    preset: str | None = None,
    overrides: list[str] | None = None,
    jobs: int = 1,
    project_dir: str = ".",
    name: str | None = None,
    timeout_s: float | None = None,
    targets: list[str] | None = None,
    only: list[str] | None = None,
    stop_after_s: float | None = None,
) -> list[dict[str, Any]]:
    """Queue one DVC experiment per point, run DVC's queue, compare the points in one table.

    Args:
        preset: a sweep list in params/sweep/<preset>.yaml (algo_x_reward, budget_split, env_complexity,
            rl_algos, turn_schedule).
        overrides: `dvc exp run -S` overrides added to every sweep; `key=a,b` sweeps (e.g. ["experiment=micro"],
            or without a preset ["rl=ppo,grpo", "reward=sparse,dense"]).
        jobs: queue workers running experiments side by side (`dvc exp run --run-all -j`).
        project_dir: the DVC project.
        name: names data/sweeps/<name>/ and the artifact (default: the preset, or "sweep").
        timeout_s: Prefect's timeout of the run-queue task: running experiments are killed after it.
        targets: stages each point runs, with their upstream (`dvc exp run <targets>`); default all.
        only: run only the points of these names (default all; an unknown name is refused, naming the known).
        stop_after_s: after this many seconds of the queue's run each worker finishes the point it runs
            and takes no other; those points are collected, the others are removed from the queue (rows
            of state `missing`; run.json names them) and the run still completes, so a sweep cut to fit
            a time slot loses no finished work. Finish it later with `--point` (timeout_s, by contrast,
            kills the running points).
    """
    logger = get_run_logger()
    project = str(Path(project_dir).resolve())
    every = sweep_points(Path(project), preset, overrides)
    named = select_points(every, only)
    title = name or preset or "sweep"
    out = f"{OUT_DIR}/{title}"
    (Path(project) / out).mkdir(parents=True, exist_ok=True)
    logger.info("sweep %s: %d points: %s", title, len(named), ", ".join(named))

    # Stages that write metrics but are not among the targets' upstream: such a point's experiment
    # holds the commit's metrics files, which are not its results.
    unrun = []
    if targets:
        dag = read_dag(project)
        unrun = [s for s in dag.metric_stages if s not in dag.select(targets)]
    started, revision = time.time(), git_revision(project)  # what the queued experiments start from
    baseline = head_commit(project)  # their results are read from this commit's experiments, wherever HEAD is then
    queue_points(project, named, targets)
    ran = run_queue.with_options(timeout_seconds=timeout_s)(project, list(named), jobs, f"{project}/{out}/queue.log",
                                                             stop_after_s, return_state=True)
    not_run = ran.result() if ran.is_completed() else []
    # Points whose last run skipped them: this run's, and (with --point) those an earlier run of this
    # sweep left so and this one did not rerun (kept in run.json).
    run_json = Path(project) / out / "run.json"
    earlier = json.loads(run_json.read_text()).get(NO_METRICS, []) if only and run_json.exists() else []
    no_metrics = [n for n in every if (n in named and unrun) or (n in earlier and n not in named)]
    why = "its run stopped before the stages that write metrics (--target); rerun it without: --point {}"
    if (now := head_commit(project)) != baseline:
        logger.warning("HEAD moved from %s to %s during the sweep; its results are read from %s's experiments",
                       baseline[:12], now[:12], baseline[:12])
    # with --point, the others from earlier runs of this commit
    rows = collect_results(project, every, out, title, {n: why.format(n) for n in no_metrics}, baseline)
    record = {"command": command_line(preset, overrides, jobs, name, targets, only, stop_after_s), "revision": revision,
              "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)), "wall_s": round(time.time() - started),
              "points": len(rows), "succeeded": sum(r["state"] == "success" for r in rows), "machine": machine(),
              **({"not_run": not_run} if not_run else {}), **({NO_METRICS: no_metrics} if no_metrics else {})}
    write_run_record(Path(project) / out, record, keep_earlier=bool(only))
    if not ran.is_completed():
        raise RuntimeError(f"the queue did not finish ({ran.message}); see {out}/results.csv")
    if not_run:
        logger.warning("stopped after %.0f s: %d of %d points not run; to finish: %s", stop_after_s, len(not_run),
                       len(named), command_line(preset, overrides, jobs, name, targets, not_run))
    if failed := [r for r in rows if r["state"] != "success" and r["experiment"] in named and r["experiment"] not in not_run]:
        why = "; ".join(f"{r['experiment']}: {r['state']}" + (f", {r['error']}" if r["error"] else "") for r in failed)
        raise RuntimeError(f"{len(failed)} of {len(named)} points failed ({why}); see {out}/results.csv")
    return rows


def head_commit(project: str) -> str:
    """The full sha of the project's HEAD."""
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, text=True,
                          check=True).stdout.strip()


def sweep_points(project: Path, preset: str | None, overrides: list[str] | None) -> dict[str, list[str]]:
    """{name: overrides} of every point of the preset's sweeps (or of `overrides` alone), `overrides`
    added to each sweep, in the order the queue runs them (seed by seed)."""
    sweeps = load_preset(project, preset)["sweeps"] if preset else [[]]
    points = seed_major(expand([[*s, *(overrides or [])] for s in sweeps]))
    named = dict(zip(point_names(points), points))
    seen: dict[tuple, str] = {}
    for name, point in named.items():
        # two points that end up with the same values are one run twice, and the seed summary would
        # count its games twice
        values = tuple(sorted(override_values(point).items()))
        if values in seen:
            raise ValueError(f"points {seen[values]} and {name} are the same run ({' '.join(point)}): an "
                             "--override replaced the values that told the preset's sweeps apart; drop it or "
                             "run one sweep of the preset with --point")
        seen[values] = name
    return named


def select_points(named: dict[str, list[str]], only: list[str] | None) -> dict[str, list[str]]:
    """The points named in `only` (all when it is empty), in the sweep's order."""
    if not only:
        return named
    if unknown := [n for n in only if n not in named]:
        raise ValueError(f"no point named {', '.join(unknown)} in this sweep; its points: {', '.join(named)}")
    return {n: o for n, o in named.items() if n in only}


def command_line(preset: str | None, overrides: list[str] | None, jobs: int, name: str | None,
                 targets: list[str] | None, only: list[str] | None = None, stop_after_s: float | None = None) -> str:
    """The `python -m flows.sweep ...` command that runs this sweep."""
    args = [*(["--preset", preset] if preset else []), *[a for o in overrides or [] for a in ("--override", o)],
            *(["--jobs", str(jobs)] if jobs != 1 else []), *(["--name", name] if name else []),
            *[a for t in targets or [] for a in ("--target", t)], *[a for n in only or [] for a in ("--point", n)],
            *(["--stop-after-s", f"{stop_after_s:g}"] if stop_after_s is not None else [])]
    return shlex.join(["python", "-m", "flows.sweep", *args])


def machine() -> str:
    """Cores, memory, platform and torch's CPU kernels (AVX2, AVX512, ...) of this machine, in a line.
    Two RL runs of one seed on one machine give the same weights (tests/test_rl.py); the same point
    rerun on another host won one test game more or less (docs/results/algo_x_reward/tw_simple.md)."""
    import torch

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores, {memory:.0f} GiB, {platform.machine()}, {platform.platform()}, "
            f"Python {platform.python_version()}, torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})")


def write_run_record(folder: Path, record: dict[str, Any], keep_earlier: bool = False) -> None:
    """run.json beside results.csv: the command, git revision, start, wall time and machine of the sweep.
    keep_earlier (a run of some points only): the records of the earlier runs of this sweep stay in
    its `earlier` list, so the wall time of the whole sweep is still known."""
    path = folder / "run.json"
    if keep_earlier and path.exists():
        before = json.loads(path.read_text())
        record = {**record, "earlier": [*before.pop("earlier", []), before]}
    path.write_text(json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset")
    parser.add_argument("--override", action="append", dest="overrides", help="added to every sweep (repeatable)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--name")
    parser.add_argument("--project-dir", default=".")
    parser.add_argument("--timeout-s", type=float)
    parser.add_argument("--target", action="append", dest="targets", help="run only this stage and its upstream (repeatable)")
    parser.add_argument("--point", action="append", dest="only", help="run only the point of this name (repeatable)")
    parser.add_argument("--stop-after-s", type=float, help="start no point after this many seconds; the running ones finish")
    args = parser.parse_args(argv)
    state = sweep(preset=args.preset, overrides=args.overrides, jobs=args.jobs, project_dir=args.project_dir,
                  name=args.name, timeout_s=args.timeout_s, targets=args.targets, only=args.only,
                  stop_after_s=args.stop_after_s, return_state=True)
    return 0 if state.is_completed() else 1


if __name__ == "__main__":
    raise SystemExit(main())
