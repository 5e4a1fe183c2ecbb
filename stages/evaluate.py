"""Stage evaluate: base, SFT and RL policies and the baselines on the test games of every level.

    python -m stages.evaluate --envs data/envs --models data/models --out data/eval

In-domain levels are env.levels, out-of-domain env.ood_levels; eval.episodes test games of
each (first by seed). Writes metrics.json ({policy: {level: cell}}, plus pooled `in_domain`
and `ood` cells), episodes.jsonl and transcripts.jsonl. Fails, writing nothing, when more than
eval.max_failed_share of a policy's episodes failed (broken games or environments).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from agentrecipe.envs.feasibility import check_feasible
from agentrecipe.envs.check_games import failed_share_error
from agentrecipe.envs.manifest import read_manifest
from agentrecipe.eval.baselines import get_baseline
from agentrecipe.eval.evaluate import ModelPolicy, evaluate_policy, select_games, write_results
from agentrecipe.eval.metrics import context_cut_warnings
from agentrecipe.models.registry import DTYPES
from agentrecipe.report.tables import results_table
from stages.common import env_pool, load_sections, stage_args, torch_threads

MODELS = ("base", "sft", "rl")
BASELINES = ("expert", "random", "first")


def main() -> None:
    args = stage_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--envs", default="data/envs"),
        p.add_argument("--models", default="data/models"),
        p.add_argument("--out", default="data/eval"),
        p.add_argument("--batch-size", type=int, default=32, help="episodes played at once"),
    ))
    cfg = load_sections(args.params, ["eval", "agent", "env", "model"])
    env, eval_cfg = cfg["env"], cfg["eval"]
    missing = [str(Path(args.models) / m) for m in MODELS if not (Path(args.models) / m / "config.json").exists()]
    if missing:
        raise SystemExit(f"error: no model in {', '.join(missing)}; run the stages that write them (dvc repro)")
    torch_threads()
    device = "cuda" if torch.cuda.is_available() else "cpu"

    levels = env.levels + env.ood_levels
    games = select_games(read_manifest(args.envs, "test", levels), levels, eval_cfg.episodes)
    check_feasible(games, [eval_cfg.max_turns], "eval.max_turns")
    groups = {"in_domain": env.levels, "ood": env.ood_levels}
    start = time.perf_counter()
    results = []
    with env_pool(env) as pool:
        for name in MODELS + BASELINES:
            if name in MODELS:
                policy = ModelPolicy.from_folder(Path(args.models) / name, cfg["agent"], name, device,
                                                 DTYPES[cfg["model"].dtype])
            else:
                policy = get_baseline(name)
            results.append(evaluate_policy(policy, games, pool, eval_cfg, groups, args.batch_size))
            del policy
        failures = pool.failures
    error = failed_share_error([rec for r in results for rec in r.records], eval_cfg.max_failed_share,
                               "eval.max_failed_share")
    if error:  # before anything is written: DVC must not cache a table built on failures
        raise SystemExit(error)
    write_results(args.out, results)

    metrics = {r.policy: r.summary for r in results}
    print(results_table(metrics))
    for line in context_cut_warnings(metrics, levels, cfg["agent"].max_context):
        print(line)
    print(f"evaluate: {len(MODELS + BASELINES)} policies x {len(games)} games ({len(levels)} levels) in "
          f"{time.perf_counter() - start:.1f} s on {device}; {failures} environment failures -> {args.out}")


if __name__ == "__main__":
    main()
