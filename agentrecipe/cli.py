"""The `agentrecipe` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _compose_params(args: argparse.Namespace) -> int:
    from agentrecipe.config import parse_config
    from agentrecipe.params import compose, compose_yaml

    parse_config(compose(args.config_dir, args.overrides), None, f"{args.config_dir} {' '.join(args.overrides)}")
    Path(args.output).write_text(compose_yaml(args.config_dir, args.overrides))
    print(f"wrote {args.output}")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from agentrecipe.config import AgentConfig, EnvConfig, EvalConfig, ModelConfig, load_config
    from agentrecipe.envs.pool import EnvPool
    from agentrecipe.eval.evaluate import evaluate_policy, games_from_folder, load_policy, select_games, write_results
    from agentrecipe.models.registry import DTYPES
    from agentrecipe.report.tables import results_table

    if Path(args.params).exists():
        cfg = load_config(args.params, ["agent", "eval", "env", "model"])
    else:
        cfg = {"agent": AgentConfig(), "eval": EvalConfig(), "env": EnvConfig(), "model": ModelConfig()}
    agent = dataclasses.replace(cfg["agent"], **({"decoding": args.decoding} if args.decoding else {}))
    overrides = {k: v for k, v in (("episodes", args.episodes), ("samples", args.samples),
                                   ("max_turns", args.max_turns), ("temperature", args.temperature)) if v is not None}
    if args.samples is not None and args.samples < max(cfg["eval"].pass_k, default=1):
        overrides["pass_k"] = [k for k in cfg["eval"].pass_k if k <= args.samples] or [1]
    eval_cfg = dataclasses.replace(cfg["eval"], **overrides)

    games = games_from_folder(args.games, args.levels)
    levels = args.levels or list(dict.fromkeys(g.level for g in games))
    games = select_games(games, levels, eval_cfg.episodes)
    env_name = games[0].env if games else cfg["env"].name
    options = cfg["env"].family_options if env_name == cfg["env"].name else {}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = []
    with EnvPool(env_name, options, args.workers or cfg["env"].workers, cfg["env"].step_timeout) as pool:
        for spec in args.model:
            name = Path(spec).name  # the folder's name, or the whole path where two folders share it
            name = spec if sum(Path(m).name == name for m in args.model) > 1 else name
            policy = load_policy(spec, agent, device, DTYPES[cfg["model"].dtype], name)
            results.append(evaluate_policy(policy, games, pool, eval_cfg))
    path = write_results(args.out, results)
    print(results_table({r.policy: r.summary for r in results}, levels))
    print(f"wrote {path}")
    return 0


def _show_results(args: argparse.Namespace) -> int:
    import json

    from agentrecipe.report.tables import results_table

    path = Path(args.metrics)
    if not path.exists():
        print(f"{path} not found: run the pipeline first (dvc repro)", file=sys.stderr)
        return 1
    print(results_table(json.loads(path.read_text())))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrecipe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compose-params", help="compose params/ into params.yaml (what `dvc exp run` does)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. rl=ppo reward=dense")
    p.add_argument("--config-dir", default="params")
    p.add_argument("--output", default="params.yaml")
    p.set_defaults(func=_compose_params)

    p = sub.add_parser("evaluate", help="evaluate model folders or baselines on a folder of games, print the table")
    p.add_argument("--model", nargs="+", required=True,
                   help="HF model folder(s) or baseline name(s): expert, random, first")
    p.add_argument("--games", required=True, help="folder with manifest.jsonl, or of TextWorld .z8/.ulx + .json")
    p.add_argument("--episodes", type=int, help="games per level (default: eval.episodes)")
    p.add_argument("--levels", nargs="+", help="only these levels (default: every level found)")
    p.add_argument("--decoding", choices=["free", "admissible"], help="default: agent.decoding")
    p.add_argument("--samples", type=int, help="sampled episodes per game for pass@k (default: eval.samples)")
    p.add_argument("--temperature", type=float, help="of sampled episodes (default: eval.temperature)")
    p.add_argument("--max-turns", type=int, help="default: eval.max_turns")
    p.add_argument("--workers", type=int, help="environment processes (default: env.workers)")
    p.add_argument("--params", default="params.yaml", help="agent/eval settings (defaults when the file is absent)")
    p.add_argument("--out", default="eval_results", help="folder for metrics.json, episodes.jsonl, transcripts.jsonl")
    p.set_defaults(func=_evaluate)

    p = sub.add_parser("show-results", help="print the results table of the last evaluation")
    p.add_argument("--metrics", default="data/eval/metrics.json")
    p.set_defaults(func=_show_results)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
