"""Stage rl: multi-turn RL from the SFT model (the base model when SFT was skipped).

Runs the whole steps budget.rl_episodes pays for (rl.games_per_step x rl.group_size episodes
per step and rank; the remainder is left unspent and printed),
logs DVCLive metrics each step, checkpoints every rl.checkpoint_every steps
under --checkpoints/<fingerprint>/ (persistent) and resumes from the newest intact
checkpoint of the same fingerprint when rerun after a kill. The fingerprint covers
everything DVC reruns the stage for: its params, its code and its inputs, so other
code or params never resume from these checkpoints (and never delete them).
The DVCLive history is kept beside the checkpoints and cut back to the checkpoint's
step on resume. A run that already finished (DVC reran the stage with nothing changed,
e.g. `dvc repro -f`) writes out its final checkpoint's model and curves and says so.
More than rl.max_failed_share failed episodes (broken games or environments) stop it.
"""

import shutil
import sys
import time
from pathlib import Path

from agentrecipe import dist
from agentrecipe.envs.check_games import more_than_share
from agentrecipe.envs.feasibility import check_feasible, reward_density_warning
from agentrecipe.envs.manifest import read_manifest
from agentrecipe.envs.registry import get_family
from agentrecipe.rollout import make_backend
from agentrecipe.schedules import unreached_phases
from agentrecipe.train.checkpoint import (BEST_DIR, aside_path, checkpoint_step, copy_model,
                                         latest_checkpoint, read_best, read_state, save_hf, settle_best,
                                         step_dirs, tallies_of)
from agentrecipe.train.rl import RLRun, rl_train
from stages.common import (copy_live, count_earlier_runs, dvclive_logger, env_pool, is_rank0, live_metrics,
                           load_sections, stage_args, stage_fingerprint, torch_threads)

SECTIONS = ["rl", "reward", "agent", "rollout", "deepspeed", "model", "env", "budget"]
HISTORY = "dvclive"
"""The DVCLive state of a config, beside its checkpoints."""


def rl_fingerprint(params: str = "params.yaml", envs: str = "data/envs", model: str = "data/models/sft") -> str:
    """The fingerprint of this config's checkpoint folder (scripts/fault_drill.sh reads it too). The
    ranks count: they set the steps the budget buys, and ZeRO's state is split among them."""
    return stage_fingerprint("rl", params, [Path(envs), Path(model)], {"world_size": dist.world_size()})


def other_configs(checkpoints: Path, fingerprint: str) -> list[str]:
    """Checkpoint folders of other fingerprints (left alone), e.g. ['0123abcd (step_000010)']."""
    out = []
    for folder in sorted(p for p in checkpoints.iterdir() if p.is_dir() and p.name != fingerprint):
        steps = step_dirs(folder)
        out.append(f"{folder.name} ({steps[-1].name if steps else 'no checkpoint'})")
    return out


def failure_guard(log, limit: float):
    """`log` that also stops the run once more than `limit` of this run's episodes failed: the
    run's counts over all ranks (`rollout/failed_total` of `rollout/episodes_total`, kept across a
    resume), so that every rank stops at the same step (one rank's exit left its peers waiting in
    the next step's collectives for good)."""

    def guarded(step: int, stats: dict) -> None:
        log(step, stats)
        failed, played = stats["rollout/failed_total"], stats["rollout/episodes_total"]
        if more_than_share(failed, played, limit):
            sys.exit(f"error: {failed:.0f} of {played:.0f} RL episodes failed by step {step}, "
                     f"more than rl.max_failed_share={limit:g}: broken games or environments (see the errors above); "
                     "the last checkpoint is kept, fix them and rerun")

    return guarded


def best_to_export(keep_best: bool, checkpoint_dir: Path) -> dict | None:
    """The best validation's record when rl.keep_best and one was kept: its model is the stage's then."""
    return read_best(checkpoint_dir) if keep_best else None


def export_best(best: dict, checkpoint_dir: Path, out: str, last_step: int) -> None:
    """The best validated model (with its best.json) becomes the stage's model."""
    copy_model(checkpoint_dir / BEST_DIR, out)
    which = "the last step's too" if best["step"] == last_step else "not the last step's"
    print(f"rl: keep_best: exported the model of step {best['step']} (valid success {best['valid/success']:.2f}, "
          f"score {best['valid/score']:.2f}), {which}")


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
    n_steps = cfg["budget"].rl_steps(rl.episodes_per_step, dist.world_size())
    played = n_steps * rl.episodes_per_step * dist.world_size()
    if is_rank0() and played < cfg["budget"].rl_episodes:
        print(f"rl: budget.rl_episodes {cfg['budget'].rl_episodes} buys {n_steps} whole steps of "
              f"{rl.episodes_per_step} episodes x {dist.world_size()} rank(s) = {played} episodes; "
              f"{cfg['budget'].rl_episodes - played} left unspent")
    checkpoints, metrics = Path(args.checkpoints), Path(args.metrics)
    fingerprint = rl_fingerprint(args.params, args.envs, args.model)
    run = RLRun(rl=rl, reward=cfg["reward"], agent=cfg["agent"], rollout=cfg["rollout"], deepspeed=cfg["deepspeed"], dtype=cfg["model"].dtype,
                levels=env.levels, n_steps=n_steps, checkpoint_dir=checkpoints / fingerprint, fingerprint=fingerprint)
    checkpoints.mkdir(parents=True, exist_ok=True)  # a declared out, even when no step runs
    error = cfg["budget"].no_rl_step(rl.episodes_per_step, dist.world_size())  # validation counted one rank
    if error:
        sys.exit(f"error: budget.sft_fraction: {error}")
    if n_steps == 0:  # pure SFT
        if is_rank0():
            copy_model(args.model, args.out)
            with live_metrics(args.metrics) as live:
                live.log_metric("rollout/success", float("nan"))
        print(f"rl: budget leaves {cfg['budget'].rl_episodes} episodes, less than one step; SFT model passed through")
        return
    # A schedule whose last phase the budget never reaches is a mistake (every = 0 fits any run of
    # at least as many steps as phases).
    for error in (unreached_phases("rl.turn_schedule_every", len(rl.turn_schedule), rl.turn_schedule_every, n_steps),
                  unreached_phases("rl.curriculum_every", len(rl.curriculum), rl.curriculum_every, n_steps)):
        if error:
            sys.exit(f"error: {error}")
    levels = sorted({lvl for phase in rl.curriculum for lvl in phase} | set(env.levels))
    train_games = read_manifest(args.envs, split="train", levels=levels)
    missing = sorted(set(levels) - {g.level for g in train_games})
    if missing:
        sys.exit(f"error: rl.curriculum / env.levels: no train games for {missing} in {args.envs}")
    # Before any step: dense reward where it equals sparse is said; a turn limit below every expert
    # plan of a level trains on games no policy can win (before, such a run took every step without
    # one optimizer step and exited 0).
    if is_rank0() and (note := reward_density_warning(levels, get_family(env.name), cfg["reward"].mode)):
        print(note)
    check_feasible(train_games, rl.turn_schedule or [cfg["rollout"].max_turns],
                   "rl.turn_schedule" if rl.turn_schedule else "rollout.max_turns")

    # Resume: the newest intact checkpoint of this fingerprint, and its DVCLive history.
    rank0 = is_rank0()
    if rank0 and (others := other_configs(checkpoints, fingerprint)):
        print(f"rl: left alone under {checkpoints}: checkpoints of {len(others)} other config(s): {', '.join(others)}")
    ckpt = latest_checkpoint(run.checkpoint_dir, fingerprint, print if rank0 else None)
    first = checkpoint_step(ckpt) if ckpt is not None else 0
    if ckpt is not None:
        earlier = tallies_of(read_state(ckpt))["seconds"]
        count_earlier_runs(earlier, f"resumed after step {first}: {earlier:.1f} s of it trained the steps before"
                           if first < n_steps else f"all {n_steps} steps trained before ({earlier:.1f} s of it); "
                           "this run wrote them out")
    history = run.checkpoint_dir / HISTORY
    if not history.exists() and aside_path(history).exists():
        history = aside_path(history)  # killed while replacing it
    if rank0:
        shutil.rmtree(metrics, ignore_errors=True)
        if ckpt is not None and history.exists():
            copy_live(history, metrics, upto=first)
        elif ckpt is not None:
            print(f"rl: no DVCLive history beside {ckpt}: the curves start after step {first}")
    if first >= n_steps:
        if rank0 and rl.keep_best:
            settle_best(run.checkpoint_dir, ckpt)  # killed before the last checkpoint promoted it
        if rank0 and (best := best_to_export(rl.keep_best, run.checkpoint_dir)):
            export_best(best, run.checkpoint_dir, args.out, n_steps)
        elif rank0:
            copy_model(ckpt / "model", args.out)
        print(f"rl: this config (fingerprint {fingerprint}: the same params, code and inputs) already trained all "
              f"{n_steps} steps; DVC reran the stage (dvc repro -f, or its outputs were removed): its final checkpoint "
              f"{ckpt} and its curves are written out unchanged, no step is run. "
              f"To train again, delete {run.checkpoint_dir}")
        return

    with env_pool(env) as pool, \
            live_metrics(args.metrics, resume=ckpt is not None) as live:
        log = dvclive_logger(live)

        def log_and_keep(step: int, stats: dict) -> None:
            log(step, stats)
            if live is not None:
                copy_live(metrics, run.checkpoint_dir / HISTORY)  # before the step's checkpoint is written

        guarded = failure_guard(log_and_keep, rl.max_failed_share)
        valid_games = read_manifest(args.envs, split="valid", levels=env.levels)

        def backend(policy, tok):
            return make_backend(run.rollout.backend, policy, tok, run.agent.max_context)

        actor, tokenizer, first = rl_train(args.model, train_games, run, pool, backend, guarded,
                                           valid_games=valid_games)
        if best := best_to_export(rl.keep_best, run.checkpoint_dir):
            if rank0:
                export_best(best, run.checkpoint_dir, args.out, n_steps)
        else:
            save_hf(actor, tokenizer, Path(args.out))  # every rank: ZeRO-3 gathers the weights
        print(f"rl: {rl.algo}, steps {first + 1}..{n_steps} of {n_steps} "
              f"({(n_steps - first) * rl.episodes_per_step * dist.world_size()} episodes this run), "
              f"{pool.failures} env failures, {time.time() - start:.1f}s -> {args.out}")


if __name__ == "__main__":
    main()
