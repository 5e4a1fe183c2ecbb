"""Killing the rl stage mid-run and rerunning it resumes from the last checkpoint and finishes."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def stage(name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", f"stages.{name}", *args]


def run(cmd: list[str], env: dict) -> str:
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
    return res.stdout + res.stderr


@pytest.mark.slow
def test_killed_rl_stage_resumes_from_its_last_checkpoint(tmp_path, subprocess_env):
    env = subprocess_env
    params = tmp_path / "params.yaml"
    # micro: 20 RL episodes of 2 games x 2 rollouts = 5 steps; a checkpoint after every step
    run([sys.executable, "-m", "agentrecipe.cli", "compose-params", "experiment=micro", "rl.checkpoint_every=1",
         "budget.sft_fraction=0", "budget.total_units=20", "--output", str(params)], env)
    d = tmp_path / "data"
    run(stage("build_envs", "--params", str(params), "--out", str(d / "envs")), env)
    run(stage("prepare_model", "--params", str(params), "--envs", str(d / "envs"), "--out", str(d / "base")), env)
    rl = stage("rl", "--params", str(params), "--envs", str(d / "envs"), "--model", str(d / "base"),
               "--out", str(d / "rl_model"), "--checkpoints", str(d / "ckpt"), "--metrics", str(d / "metrics"))

    log = tmp_path / "rl_killed.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(rl, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 600
    while not (d / "ckpt" / "step_000002").exists():
        assert proc.poll() is None, f"rl stage ended before its second checkpoint:\n{log.read_text()[-3000:]}"
        assert time.time() < deadline, "no second checkpoint within 10 minutes"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the stage and its environment workers
    proc.wait()
    assert not (d / "rl_model").exists()

    out = run(rl, env)
    resumed = [line for line in out.splitlines() if "resumed from" in line]
    assert resumed and "step_00000" in resumed[0], out[-2000:]
    assert int(resumed[0].split("after step ")[1].rstrip(")")) >= 2
    assert (d / "rl_model" / "model.safetensors").exists()
    assert (d / "ckpt" / "step_000005").exists()
    steps = [int(line.split("\t")[0]) for line in
             (d / "metrics" / "plots" / "metrics" / "rollout" / "success.tsv").read_text().splitlines()[1:]]
    assert steps[-1] == 5 and sorted(set(steps)) == list(range(1, 6))

    # A different config never resumes from these checkpoints.
    params.write_text(params.read_text().replace("lr: 0.0005", "lr: 0.001", 1))
    out = run(rl, env)
    assert "resumed from" not in out

    # Pure SFT (the whole budget on demonstrations): no RL step, the model passes through and every
    # declared output of the stage still exists.
    run([sys.executable, "-m", "agentrecipe.cli", "compose-params", "experiment=micro", "budget.sft_fraction=1",
         "--output", str(params)], env)
    out = run(stage("rl", "--params", str(params), "--envs", str(d / "envs"), "--model", str(d / "base"),
                    "--out", str(d / "pure_sft"), "--checkpoints", str(d / "ckpt_pure_sft"),
                    "--metrics", str(d / "metrics_pure_sft")), env)
    assert "passed through" in out
    for path in ("pure_sft/model.safetensors", "ckpt_pure_sft", "metrics_pure_sft"):
        assert (d / path).exists(), path
