"""Stage rl: multi-turn RL from the SFT model (the base model when SFT was skipped).

Runs budget.rl_episodes episodes (rl.games_per_step x rl.group_size per step),
logs DVCLive metrics each step, checkpoints every rl.checkpoint_every steps
under --checkpoints (persistent), and resumes from the last complete
checkpoint of the same config when rerun after a kill.
"""

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

from dvclive import Live

from agentrecipe.envs.manifest import read_manifest
from agentrecipe.envs.pool import EnvPool
from agentrecipe.rollout import make_backend
from agentrecipe.train.checkpoint import copy_model, latest_checkpoint, save_hf
from agentrecipe.train.rl import RLRun, num_steps, rl_train
from stages.common import dvclive_logger, load_sections, stage_args, torch_threads

SECTIONS = ["rl", "reward", "agent", "rollout", "deepspeed", "env", "budget"]


def fingerprint(cfg: dict, policy_dir: Path) -> str:
    """Hash of the params this stage reads and of the start model's weights."""
    h = hashlib.sha256(json.dumps({k: dataclasses.asdict(v) for k, v in cfg.items()}, sort_keys=True).encode())
    for f in sorted(policy_dir.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def main() -> None:
    args = stage_args(__doc__, lambda p: (
        p.add_argument("--envs", default="data/envs"),
        p.add_argument("--model", default="data/models/sft"),
        p.add_argument("--out", default="data/models/rl"),
        p.add_argument("--checkpoints", default="data/rl/checkpoints"),
        p.add_argument("--metrics", default="data/metrics/rl"),
    ))
    cfg = load_sections(args.params, SECTIONS)
    torch_threads()
    start = time.time()
    env, rl = cfg["env"], cfg["rl"]
    n_steps = num_steps(cfg["budget"].rl_episodes, rl, int(os.environ.get("WORLD_SIZE", "1")))
    run = RLRun(rl=rl, reward=cfg["reward"], agent=cfg["agent"], rollout=cfg["rollout"], deepspeed=cfg["deepspeed"],
                levels=env.levels, n_steps=n_steps, checkpoint_dir=Path(args.checkpoints),
                fingerprint=fingerprint(cfg, Path(args.model)))
    if n_steps == 0:
        copy_model(args.model, args.out)
        with Live(args.metrics, save_dvc_exp=False, dvcyaml=None, report=None) as live:
            live.log_metric("rollout/success", float("nan"))
        print(f"rl: budget leaves {cfg['budget'].rl_episodes} episodes, less than one step; SFT model passed through")
        return
    resuming = latest_checkpoint(run.checkpoint_dir, run.fingerprint) is not None
    train_games = read_manifest(Path(args.envs) / "manifest.jsonl", split="train", levels=sorted({lvl for phase in rl.curriculum for lvl in phase} | set(env.levels)))
    with EnvPool(env.name, env.family_options, n_workers=env.workers, timeout=env.step_timeout) as pool, \
            Live(args.metrics, save_dvc_exp=False, dvcyaml=None, report=None, resume=resuming) as live:
        actor, tokenizer, first = rl_train(args.model, train_games, run, pool,
                                           lambda m, t: make_backend(run.rollout.backend, m, t), dvclive_logger(live))
        save_hf(actor, tokenizer, Path(args.out))
        print(f"rl: {rl.algo}, steps {first}..{n_steps} ({n_steps * rl.episodes_per_step} episodes), "
              f"{pool.failures} env failures, {time.time() - start:.1f}s -> {args.out}")


if __name__ == "__main__":
    main()
