"""The rl stage under `dvc repro`: a kill resumes exactly (weights and learning curves), a forced
rerun never silently trains nothing, a code change never resumes another config's checkpoints,
and pure RL (no demonstrations) runs through gen_sft_data and sft (issue 13, issue 14 item 1)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.dvc_project import copy_project

ROOT = Path(__file__).resolve().parents[1]
STEPS = list(range(1, 6))  # micro with 20 RL episodes of 2 games x 2 rollouts: 5 steps, a checkpoint each


def run(cmd: list[str], cwd: Path, env: dict) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout + res.stderr


def logged_steps(project: Path) -> list[int]:
    """The steps of the rollout/success curve, as written (duplicates and gaps would show)."""
    tsv = project / "data/metrics/rl/plots/metrics/rollout/success.tsv"
    return [int(line.split("\t")[0]) for line in tsv.read_text().splitlines()[1:]]


def fingerprint_dirs(project: Path) -> list[Path]:
    return sorted(p for p in (project / "data/rl/checkpoints").iterdir() if p.is_dir())


@pytest.mark.slow
def test_rl_under_dvc_resumes_exactly_and_never_reuses_stale_checkpoints(tmp_path, subprocess_env):
    env = subprocess_env
    project = copy_project(tmp_path / "project", env)
    run([sys.executable, "-m", "agentrecipe.cli", "compose-params", "experiment=micro", "rl.checkpoint_every=1",
         "budget.sft_fraction=0", "budget.total_units=20"], project, env)

    # 1. kill -9 the whole `dvc repro` (stage and environment workers) after the second checkpoint
    log = tmp_path / "killed.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(["dvc", "repro", "rl"], cwd=project, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.time() + 900
        while not list((project / "data/rl/checkpoints").glob("*/step_000002/checkpoint.json")):
            assert proc.poll() is None, f"dvc repro ended before the second checkpoint:\n{log.read_text()[-3000:]}"
            assert time.time() < deadline, "no second checkpoint within 15 minutes"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the stage and its environment workers
        proc.wait()
    text = log.read_text()
    assert "no demonstrations" in text and "passed through" in text  # pure RL: 0 demos, base model through sft

    # 2. the rerun resumes from its last checkpoint; the curve holds every step exactly once
    out = run(["dvc", "repro", "rl"], project, env)
    resumed = [line for line in out.splitlines() if "resumed from" in line]
    assert resumed, out[-3000:]
    after = int(resumed[0].split("after step ")[1].rstrip(")"))
    assert after >= 2
    assert f"steps {after + 1}..5 of 5 ({(5 - after) * 4} episodes this run)" in out
    assert logged_steps(project) == STEPS
    # the run's episode count (the failure guard's) goes on from the checkpoint: 5 steps x 4 episodes
    totals = project / "data/metrics/rl/plots/metrics/rollout/episodes_total.tsv"
    assert [float(line.split("\t")[1]) for line in totals.read_text().splitlines()[1:]] == [4.0 * s for s in STEPS]
    # so does its training time, and the stage's wall time counts the steps trained before the resume
    # (before, only this run's: a run killed near its end reported minutes for hours)
    seconds = project / "data/metrics/rl/plots/metrics/perf/total_seconds.tsv"
    total = [float(line.split("\t")[1]) for line in seconds.read_text().splitlines()[1:]]
    assert len(total) == 5 and all(a < b for a, b in zip(total, total[1:])), total
    timing = json.loads((project / "data/timings/rl.json").read_text())
    assert timing["resumed"] == f"resumed after step {after}: {total[after - 1]:.1f} s of it trained the steps before"
    assert timing["seconds"] == pytest.approx(timing["this_run_seconds"] + total[after - 1], abs=0.11)
    model = (project / "data/models/rl/model.safetensors").read_bytes()
    [first_config] = fingerprint_dirs(project)

    # 3. `dvc repro -f rl`: same params, code and inputs; says so, trains nothing, keeps model and curves
    out = run(["dvc", "repro", "-f", "-s", "rl"], project, env)  # -s: upstream stays cached (the drill runs the full -f)
    assert "already trained all 5 steps" in out and "resumed from" not in out
    assert json.loads((project / "data/timings/rl.json").read_text())["resumed"].startswith("all 5 steps trained before")
    assert logged_steps(project) == STEPS
    assert json.loads((project / "data/metrics/rl/metrics.json").read_text())["step"] == 5
    assert (project / "data/models/rl/model.safetensors").read_bytes() == model

    # 4. a change to the RL code: a new config, trained from step 0; the old checkpoints are left alone
    rewards = project / "agentrecipe/rewards.py"
    rewards.write_text(rewards.read_text() + "\n# a change to the code of the rl stage\n")
    out = run(["dvc", "repro", "rl"], project, env)
    assert "resumed from" not in out and "already trained" not in out, out[-3000:]
    assert "other config(s)" in out and first_config.name in out
    assert "steps 1..5 of 5 (20 episodes this run)" in out
    assert logged_steps(project) == STEPS
    assert len(fingerprint_dirs(project)) == 2
    assert sorted(p.name for p in first_config.glob("step_*")) == ["step_000004", "step_000005"]
