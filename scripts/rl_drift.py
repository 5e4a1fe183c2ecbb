"""How far RL moved each experiment's policy from its SFT start, read from a sweep's DVC project.

    python scripts/rl_drift.py [--project DIR] NAME_PART

For every DVC experiment whose name contains NAME_PART (e.g. `_lr-` for the rl_lr sweep) it
prints one row: the first RL step's approx_kl (mean per action token, between the rollout
policy and the updated one) and the largest of the later steps', the mean rollout success of
the first and the last 10 steps, the final validation success, and the relative L2 change of
the RL policy's weights against the SFT model it started from, ||w_rl - w_sft|| / ||w_sft||.

It reads what each experiment committed: its dvc.lock (in the experiment's git ref,
refs/exps/...) names the md5 of data/metrics/rl (DVCLive's per-step TSVs), data/models/sft and
data/models/rl, whose files it reads from the project's DVC cache. Nothing in the workspace
changes (`dvc exp apply` would). The same curves are drawn by `dvc plots diff EXP1 EXP2`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from agentrecipe.report.plots import read_tsv


def git(project: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(project), *args], capture_output=True, text=True, check=True).stdout


def cached(project: Path, md5: str) -> Path:
    """A file in the project's DVC cache (content-addressed: the file itself, under its md5)."""
    return project / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]


def dir_files(project: Path, md5: str) -> dict[str, str]:
    """relpath -> md5 of a DVC-tracked folder (its .dir manifest)."""
    return {f["relpath"]: f["md5"] for f in json.loads(cached(project, md5).read_bytes())}


def series(project: Path, metrics_md5: str, key: str) -> list[float]:
    """One DVCLive metric (e.g. losses/approx_kl) by step, from data/metrics/rl's TSV."""
    files = dir_files(project, metrics_md5)
    path = next(p for p in files if p.endswith(f"metrics/{key}.tsv"))
    return read_tsv(cached(project, files[path]))[1]


def weight_change(project: Path, sft_md5: str, rl_md5: str) -> float:
    a = load_file(cached(project, dir_files(project, sft_md5)["model.safetensors"]))
    b = load_file(cached(project, dir_files(project, rl_md5)["model.safetensors"]))
    num = sum(float(((b[k].float() - a[k].float()) ** 2).sum()) for k in a)
    den = sum(float((a[k].float() ** 2).sum()) for k in a)
    return (num / den) ** 0.5


def drift(project: Path, ref: str) -> dict:
    lock = yaml.safe_load(git(project, "show", f"{ref}:dvc.lock"))
    outs = {o["path"]: o["md5"] for stage in lock["stages"].values() for o in stage.get("outs", [])}
    metrics = outs["data/metrics/rl"]
    kl = series(project, metrics, "losses/approx_kl")
    success = series(project, metrics, "rollout/success")
    return {"approx_kl step 1": kl[0], "approx_kl max later": max(kl[1:]),
            "rollout success steps 1-10": sum(success[:10]) / len(success[:10]),
            "rollout success last 10": sum(success[-10:]) / len(success[-10:]),
            "valid success last": series(project, metrics, "valid/success")[-1],
            "weight change": weight_change(project, outs["data/models/sft"], outs["data/models/rl"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name_part", help="the part of the experiment names to select, e.g. _lr-")
    ap.add_argument("--project", type=Path, default=Path("."), help="the DVC project that ran the sweep")
    args = ap.parse_args()
    refs = [r for r in git(args.project, "for-each-ref", "--format=%(refname)", "refs/exps").split()
            if args.name_part in r.rsplit("/", 1)[-1]]
    if not refs:
        raise SystemExit(f"no experiment in {args.project} has {args.name_part!r} in its name")
    rows = {ref.rsplit("/", 1)[-1]: drift(args.project, ref) for ref in refs}
    cols = list(next(iter(rows.values())))
    print("| experiment | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name, row in sorted(rows.items()):
        print(f"| {name} | " + " | ".join(f"{v:.4f}" if c.startswith(("approx", "weight")) else f"{v:.2f}"
                                           for c, v in row.items()) + " |")


if __name__ == "__main__":
    main()
