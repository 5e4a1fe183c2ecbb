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
import sys
import time
from pathlib import Path


from agentrecipe.envs.manifest import read_manifest
from agentrecipe.envs.pool import EnvPool
from agentrecipe.rollout import make_backend
from agentrecipe.train.checkpoint import copy_model, latest_checkpoint, save_hf
from agentrecipe.train.rl import RLRun, num_steps, rl_train
from stages.common import dvclive_logger, is_rank0, live_metrics, load_sections, stage_args, torch_threads

SECTIONS = ["rl", "reward", "agent", "rollout", "deepspeed", "env", "budget"]


def fingerprint(cfg: dict, policy_dir: Path) -> str:
    """Hash of the params that shape training and of the start model's weights (read in chunks)."""
    shaping = {k: dataclasses.asdict(v) for k, v in cfg.items() if k != "env"}
    shaping["env"] = {"name": cfg["env"].name, "levels": cfg["env"].levels, "alfworld": cfg["env"].alfworld}
    h = hashlib.sha256(json.dumps(shaping, sort_keys=True).encode())
    for f in sorted(policy_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                h.update(chunk)
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
    if cfg["rollout"].temperature == 0:
        sys.exit("error: rollout.temperature must be > 0 for RL (sampling is how the policy explores)")
    Path(args.checkpoints).mkdir(parents=True, exist_ok=True)  # a declared out, even when no step runs
    if n_steps == 0:
        if is_rank0():
            copy_model(args.model, args.out)
            with live_metrics(args.metrics) as live:
                live.log_metric("rollout/success", float("nan"))
        print(f"rl: budget leaves {cfg['budget'].rl_episodes} episodes, less than one step; SFT model passed through")
        return
    resuming = latest_checkpoint(run.checkpoint_dir, run.fingerprint) is not None
    levels = sorted({lvl for phase in rl.curriculum for lvl in phase} | set(env.levels))
    train_games = read_manifest(Path(args.envs) / "manifest.jsonl", split="train", levels=levels)
    missing = sorted(set(levels) - {g.level for g in train_games})
    if missing:
        sys.exit(f"error: rl.curriculum / env.levels: no train games for {missing} (ood levels have test games only)")
    with EnvPool(env.name, env.family_options, n_workers=env.workers, timeout=env.step_timeout) as pool, \
            live_metrics(args.metrics, resume=resuming) as live:
        actor, tokenizer, first = rl_train(args.model, train_games, run, pool,
                                           lambda m, t: make_backend(run.rollout.backend, m, t), dvclive_logger(live))
        save_hf(actor, tokenizer, Path(args.out))
        print(f"rl: {rl.algo}, steps {first}..{n_steps} ({n_steps * rl.episodes_per_step} episodes), "
              f"{pool.failures} env failures, {time.time() - start:.1f}s -> {args.out}")


if __name__ == "__main__":
    main()
