"""Run each ablation command of the README on the micro preset and check that it does what it says.

    make ablation-effects                      # or: python scripts/ablation_effects.py [--workdir DIR]

In a fresh clone of this repository's HEAD (under a temporary folder, or --workdir), with
the project's venv: `dvc exp run -S experiment=micro` as the baseline, then one
`dvc exp run -S experiment=micro -S <override>...` per ablation. After each run it reads what
the run produced (the games' manifest, the SFT dataset, the RL curves, the RL model's weights,
the evaluation) and checks the effect the README claims, e.g. that `reward=dense` on games
with intermediate score trains on returns that follow the score, not the win. It prints one
row per ablation (pass or FAIL, and the facts it checked), then `agentrecipe compare` over
the experiments, and exits 1 if any check failed.

Micro runs are tiny (2 test games per level): they show that each command changes what it
says, not which setting is better. About 15-25 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
MICRO = ["experiment=micro"]


# ------------------------------------------------------------------ what a run produced
def curve(run: Path, name: str) -> list[float]:
    """One RL curve (DVCLive TSV under data/metrics/rl/plots/metrics), [] if not logged."""
    path = run / "data/metrics/rl/plots/metrics" / f"{name}.tsv"
    if not path.exists():
        return []
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:] if line]
    return [float(r[1]) for r in rows]


def sft_demos(run: Path) -> int:
    """Distinct (game, seed) demonstrations in the SFT dataset (0 when none were bought)."""
    files = sorted((run / "data/sft/dataset").glob("data-*.arrow"))
    pairs = set()
    for f in files:
        with pa.memory_map(str(f)) as src:
            table = pa.ipc.open_stream(src).read_all()
        pairs |= set(zip(table.column("game").to_pylist(), table.column("seed").to_pylist()))
    return len(pairs)


def facts(run: Path) -> dict:
    manifest = [json.loads(line) for line in (run / "data/envs/manifest.jsonl").read_text().splitlines() if line]
    rl_metrics = run / "data/metrics/rl/metrics.json"
    weights = sorted((run / "data/models/rl").glob("*.safetensors"))
    evaluation = json.loads((run / "data/eval/metrics.json").read_text())
    return {
        "train_levels": sorted({m["level"] for m in manifest if m["split"] == "train"}),
        "demos": sft_demos(run),
        "rl_steps": json.loads(rl_metrics.read_text()).get("step", 0) if rl_metrics.exists() else 0,
        "success": curve(run, "rollout/success"),
        "score": curve(run, "rollout/score"),
        "return": curve(run, "rollout/return"),
        "turns": curve(run, "rollout/turns"),
        "max_turns": curve(run, "schedule/max_turns"),
        "invalid": curve(run, "rollout/invalid_rate"),
        "value_loss": curve(run, "losses/value"),
        "anchor_hit": curve(run, "gigpo/anchor_hit_rate"),
        "rl_weights": hashlib.sha256(b"".join(w.read_bytes() for w in weights)).hexdigest()[:12],
        "eval_invalid": evaluation["rl"]["in_domain"].get("invalid_rate", 0.0),
    }


# ------------------------------------------------------------------ the ablations and their claims
@dataclass
class Ablation:
    name: str
    overrides: list[str]  # after experiment=micro
    claim: str
    check: Callable[[dict, dict], bool]  # (this run's facts, its reference run's facts)
    shows: Callable[[dict], str]
    against: str = "baseline"  # the run it is compared with


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-9 for x, y in zip(a, b))


def reward_modes(name: str, env: str, levels: list[str], games: str, score: str) -> list[Ablation]:
    """`env=<env>` with sparse reward (the return is the win) and with dense (the return follows the score)."""
    return [
        Ablation(f"{name}_sparse", [f"env={env}"], f"{games}sparse reward: the return is the win (return = success)",
                 lambda f, _: f["train_levels"] == levels and _close(f["return"], f["success"]),
                 lambda f: f"levels {f['train_levels']}, return {_fmt(f['return'])}, success {_fmt(f['success'])}"),
        Ablation(f"{name}_dense", [f"env={env}", "reward=dense"], f"dense reward: the return follows {score}",
                 lambda f, s: _close(f["return"], f["score"]) and not _close(f["score"], f["success"])
                 and not _close(f["return"], s["return"]),
                 lambda f: f"return {_fmt(f['return'])}, score {_fmt(f['score'])}, success {_fmt(f['success'])}",
                 against=f"{name}_sparse"),
    ]


ABLATIONS = [
    Ablation("baseline", [], "the micro recipe runs", lambda f, _: f["rl_steps"] > 0 and f["demos"] > 0,
             lambda f: f"demos {f['demos']}, RL steps {f['rl_steps']}, levels {f['train_levels']}"),
    Ablation("pure_rl", ["budget.sft_fraction=0"], "no demonstrations; the whole budget goes to RL",
             lambda f, b: f["demos"] == 0 and f["rl_steps"] > b["rl_steps"],
             lambda f: f"demos {f['demos']}, RL steps {f['rl_steps']}"),
    Ablation("pure_sft", ["budget.sft_fraction=1"], "every unit buys demonstrations; no RL step",
             lambda f, b: f["demos"] > b["demos"] and f["rl_steps"] == 0,
             lambda f: f"demos {f['demos']}, RL steps {f['rl_steps']}"),
    *reward_modes("dense_games", "textworld_dense", ["simple-dense-detailed"], "",
                  "the score, which moves before the win"),
    *reward_modes("quests", "textworld_quests", ["w2-o3-q2-p2"], "custom games of two quests (finding 2's); ",
                  "the score, a point per quest before the win"),
    Ablation("ppo", ["rl=ppo"], "PPO trains a critic (value loss logged), other weights than GRPO",
             lambda f, b: bool(f["value_loss"]) and f["rl_weights"] != b["rl_weights"],
             lambda f: f"value loss {_fmt(f['value_loss'])}, weights {f['rl_weights']}"),
    Ablation("rloo", ["rl=rloo"], "RLOO's leave-one-out baseline: other weights than GRPO, no critic",
             lambda f, b: not f["value_loss"] and f["rl_weights"] != b["rl_weights"],
             lambda f: f"weights {f['rl_weights']}"),
    Ablation("reinforce_pp", ["rl=reinforce_pp"], "REINFORCE++: other weights than GRPO, no critic",
             lambda f, b: not f["value_loss"] and f["rl_weights"] != b["rl_weights"],
             lambda f: f"weights {f['rl_weights']}"),
    Ablation("gigpo", ["rl=gigpo"], "GiGPO's step groups (anchor hit rate logged), other weights than GRPO",
             lambda f, b: bool(f["anchor_hit"]) and f["rl_weights"] != b["rl_weights"],
             lambda f: f"anchor hit rate {_fmt(f['anchor_hit'])}, weights {f['rl_weights']}"),
    Ablation("complex", ["env=textworld_complex"], "trains on the complex levels",
             lambda f, _: f["train_levels"] == ["w2-o3-q4", "w4-o6-q8"],
             lambda f: f"levels {f['train_levels']}"),
    Ablation("turn_schedule", ["rl.turn_schedule=[6,10,14]", "rl.turn_schedule_every=2"],
             "the turn limit moves 6, 10, 14 every 2 steps; no episode runs past it",
             lambda f, b: f["max_turns"] == [float([6, 10, 14][min(s // 2, 2)]) for s in range(b["rl_steps"])]
             and all(t <= m for t, m in zip(f["turns"], f["max_turns"])),
             lambda f: f"limit {_fmt(f['max_turns'], 0)}, mean turns {_fmt(f['turns'], 1)}"),
    Ablation("max_turns", ["rollout.max_turns=6"], "RL episodes stop at 6 turns (micro plays up to 12)",
             lambda f, b: set(f["max_turns"]) == {6.0} and max(f["turns"]) <= 6 < max(b["turns"]),
             lambda f: f"limit {_fmt(f['max_turns'], 0)}, mean turns {_fmt(f['turns'], 1)}"),
    Ablation("free_decoding", ["agent.decoding=free"], "free text: the model writes invalid commands",
             lambda f, b: max(f["invalid"]) > 0 and max(b["invalid"]) == 0,
             lambda f: f"invalid rate {_fmt(f['invalid'])} (eval {f['eval_invalid']:.2f})"),
]


def _fmt(xs: list[float], digits: int = 2) -> str:
    return "[" + " ".join(f"{x:.{digits}f}" for x in xs) + "]"


# ------------------------------------------------------------------ running
def run(cmd: list[str], cwd: Path) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, help="clone here instead of a temporary folder (kept)")
    ap.add_argument("--only", nargs="*", help="run only these ablations (baseline always runs)")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="ablation-effects-"))
    project = work / "project"
    if not project.exists():
        run(["git", "clone", "-q", str(REPO), str(project)], work)
    wanted = set(args.only or [a.name for a in ABLATIONS])
    wanted |= {"baseline"} | {a.against for a in ABLATIONS if a.name in wanted}  # and what they compare with
    todo = [a for a in ABLATIONS if a.name in wanted]
    seen: dict[str, dict] = {}
    rows = []
    for ab in todo:
        start = time.time()
        run(["dvc", "exp", "run", "--name", f"abl-{ab.name.replace('_', '-')}",
             *sum((["-S", o] for o in MICRO + ab.overrides), [])], project)
        f = facts(project)
        seen[ab.name] = f
        ref = seen.get(ab.against, f)
        ok = ab.check(f, ref)
        rows.append((ab, ok, ab.shows(f), time.time() - start))
        print(f"-> {ab.name}: {'pass' if ok else 'FAIL'}: {ab.shows(f)}", flush=True)
    print("\n| ablation | `dvc exp run -S experiment=micro` plus | claim | result | what the run shows | wall |")
    print("|---|---|---|---|---|---:|")
    for ab, ok, shown, secs in rows:
        extra = " ".join(f"-S {o}" for o in ab.overrides) or "(nothing)"
        print(f"| {ab.name} | `{extra}` | {ab.claim} | {'pass' if ok else '**FAIL**'} | {shown} | {secs:.0f} s |")
    print()
    subprocess.run([sys.executable, "-m", "agentrecipe.cli", "compare"], cwd=project)
    print(f"\nproject: {project}")
    return 0 if all(ok for _, ok, _, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
