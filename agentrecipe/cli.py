"""The `agentrecipe` command line."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def _compose_params(args: argparse.Namespace) -> int:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from agentrecipe.config import ConfigError, parse_config
    from agentrecipe.params import compose, compose_yaml

    try:  # one line naming the bad key or group, not a traceback that ends with it
        parse_config(compose(args.config_dir, args.overrides), None, f"{args.config_dir} {' '.join(args.overrides)}")
    except (ConfigError, HydraException, OmegaConfBaseException) as e:
        print(f"error: {str(e).strip()}", file=sys.stderr)
        return 2
    Path(args.output).write_text(compose_yaml(args.config_dir, args.overrides))
    print(f"wrote {args.output}")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from agentrecipe.config import AgentConfig, EnvConfig, EvalConfig, ModelConfig, load_config
    from agentrecipe.envs.check_games import failed_share_error, playable
    from agentrecipe.envs.manifest import MANIFEST_NAME
    from agentrecipe.envs.pool import open_pool
    from agentrecipe.eval.baselines import BASELINES
    from agentrecipe.eval.evaluate import evaluate_policy, games_from_folder, load_policy, select_games, write_results
    from agentrecipe.eval.metrics import context_cut_warnings
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

    source = args.params if Path(args.params).exists() else "built-in defaults (no params file)"
    for spec in args.model:  # a typo in a model folder fails before any game is loaded
        if not (spec in BASELINES and not Path(spec).is_dir()) and not (Path(spec) / "config.json").exists():
            print(f"error: --model {spec}: not a baseline ({', '.join(BASELINES)}) nor a HF model folder "
                  f"(no {Path(spec) / 'config.json'})", file=sys.stderr)
            return 2
    print(f"evaluate: settings from {source}: decoding={agent.decoding}, history={agent.history}, "
          f"max_turns={eval_cfg.max_turns}, episodes={eval_cfg.episodes}, samples={eval_cfg.samples}, "
          f"temperature={eval_cfg.temperature}, pass_k={eval_cfg.pass_k}, seed={eval_cfg.seed}")
    try:
        games = games_from_folder(args.games, args.levels)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: --games {args.games}: {e}", file=sys.stderr)
        return 2
    loose = not (Path(args.games) / MANIFEST_NAME).exists()
    if loose:  # loose files: numbered in file-name order (not all seed 0), and all played unless --episodes
        games = [dataclasses.replace(g, seed=i) for i, g in enumerate(games)]
    env_name = games[0].env if games else cfg["env"].name
    options = cfg["env"].family_options if env_name == cfg["env"].name else {}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = []
    remote = args.remote or (cfg["env"].remote if env_name == cfg["env"].name else [])
    if remote:
        print(f"evaluate: playing {env_name} games through {', '.join(remote)}")
    with open_pool(env_name, options, args.workers or cfg["env"].workers, cfg["env"].step_timeout, remote) as pool:
        games = playable(pool, games, lambda msg: print(msg, file=sys.stderr))  # each game started once
        if not games:
            print(f"error: no game in {args.games} starts (see above)", file=sys.stderr)
            return 1
        levels = args.levels or list(dict.fromkeys(g.level for g in games))
        games = select_games(games, levels, args.episodes or (len(games) if loose else eval_cfg.episodes))
        for spec in args.model:
            name = Path(spec).name  # the folder's name, or the whole path where two folders share it
            name = spec if sum(Path(m).name == name for m in args.model) > 1 else name
            policy = load_policy(spec, agent, device, DTYPES[cfg["model"].dtype], name)
            results.append(evaluate_policy(policy, games, pool, eval_cfg))
    path = write_results(args.out, results)
    metrics = {r.policy: r.summary for r in results}
    print(results_table(metrics, levels))
    for line in context_cut_warnings(metrics, levels, agent.max_context):
        print(line, file=sys.stderr)
    print(f"wrote {path}")
    error = failed_share_error([rec for r in results for rec in r.records], eval_cfg.max_failed_share,
                               "eval.max_failed_share")
    if error:
        print(error, file=sys.stderr)
        return 1
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


def _compare(args: argparse.Namespace) -> int:
    from agentrecipe.report.compare import compare

    try:
        print(compare(args.project, args.experiments, args.param, args.policy, args.width))
    except (ValueError, RuntimeError) as e:
        print(e, file=sys.stderr)
        return 1
    return 0


def _show_transcript(args: argparse.Namespace) -> int:
    from agentrecipe.report.transcripts import format_transcript, read_transcripts, select

    try:
        records = select(read_transcripts(args.transcripts), args.policy, args.level)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 1
    if not records:
        print(f"no transcript for policy={args.policy} level={args.level} in {args.transcripts}", file=sys.stderr)
        return 1
    if args.index >= len(records):
        print(f"--index {args.index}: only {len(records)} matching transcripts", file=sys.stderr)
        return 1
    print(format_transcript(records[args.index]))
    return 0


def _serve_env(args: argparse.Namespace) -> int:
    from agentrecipe.envs.registry import get_family

    try:
        get_family(args.env)  # an unknown family fails before anything starts
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    options = {}
    if Path(args.params).exists():
        from agentrecipe.config import load_config

        env_cfg = load_config(args.params, ["env"])["env"]
        options = env_cfg.family_options if env_cfg.name == args.env else {}
    from agentrecipe.envs.server import serve

    serve(args.env, args.host, args.port, options, args.max_episodes, args.idle_timeout, args.game_root)
    return 0


def _check_envs(args: argparse.Namespace) -> int:
    from agentrecipe.envs.check import check_families, format_table

    try:
        rows = check_families(args.env, args.games, args.levels,
                              progress=lambda r: print(f"checked {r.family} {r.level}", file=sys.stderr, flush=True))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(rows))
    return 0 if all(r.ok for r in rows) else 1


def _finding_page(args: argparse.Namespace) -> int:
    from agentrecipe.presets import load_preset
    from agentrecipe.report.finding import merge_sweeps, write_page

    preset = load_preset(Path(args.project), args.preset)
    if "paper" not in preset:
        print(f"error: params/sweep/{args.preset}.yaml has no `paper` (what the papers report)", file=sys.stderr)
        return 2
    folders = [Path(f) for f in args.sweep or [Path(args.project) / "data" / "sweeps" / args.preset]]
    out = Path(args.out or Path(args.project) / "docs" / "results" / f"{args.preset}.md")
    verdict = Path(args.verdict[1:]).read_text().strip() if args.verdict.startswith("@") else args.verdict
    with tempfile.TemporaryDirectory() as tmp:
        # one folder too: its summary is recomputed with this code's columns (a sweep's own summary.csv
        # is as the code of its day wrote it)
        folder = merge_sweeps(folders, Path(tmp) / args.preset, args.preset)
        print(f"wrote {write_page(folder, out, preset['description'], preset['paper'], verdict)}")
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
    p.add_argument("--games", required=True,
                   help="folder with manifest.jsonl, of TextWorld .z8/.ulx + .json, or of ALFWorld game folders")
    p.add_argument("--episodes", type=int, help="games per level (default: eval.episodes)")
    p.add_argument("--levels", nargs="+", help="only these levels (default: every level found)")
    p.add_argument("--decoding", choices=["free", "admissible"], help="default: agent.decoding")
    p.add_argument("--samples", type=int, help="sampled episodes per game for pass@k (default: eval.samples)")
    p.add_argument("--temperature", type=float, help="of sampled episodes (default: eval.temperature)")
    p.add_argument("--max-turns", type=int, help="default: eval.max_turns")
    p.add_argument("--workers", type=int, help="environment processes (default: env.workers)")
    p.add_argument("--remote", nargs="+", metavar="URL",
                   help="play through these environment servers (`agentrecipe serve-env`; default: env.remote)")
    p.add_argument("--params", default="params.yaml", help="agent/eval settings (defaults when the file is absent)")
    p.add_argument("--out", default="eval_results", help="folder for metrics.json, episodes.jsonl, transcripts.jsonl")
    p.set_defaults(func=_evaluate)

    p = sub.add_parser("check-envs", help="build a few games per level of each environment family, replay the "
                       "experts (all must win), check resets are deterministic, time steps; print a table")
    p.add_argument("--env", action="append", help="only this family (repeatable; default: every installed one)")
    p.add_argument("--levels", nargs="+", help="these levels instead of the family's check levels (one --env)")
    p.add_argument("--games", type=int, default=2, help="games per level (default 2)")
    p.set_defaults(func=_check_envs)

    p = sub.add_parser("show-results", help="print the results table of the last evaluation")
    p.add_argument("--metrics", default="data/eval/metrics.json")
    p.set_defaults(func=_show_results)

    p = sub.add_parser("compare", help="DVC experiments side by side: the params that differ, success in and out of domain")
    p.add_argument("experiments", nargs="*", help="experiment names (default: every experiment of this commit)")
    p.add_argument("--param", action="append", help="params columns to show (default: the ones that differ)")
    p.add_argument("--policy", default="rl", help="policy whose success is shown (default: rl)")
    p.add_argument("--width", type=int, default=120, help="cut cells until a line fits (default: 120)")
    p.add_argument("--project", default=".", help="the DVC project")
    p.set_defaults(func=_compare)

    p = sub.add_parser("show-transcript", help="print one evaluation episode readably")
    p.add_argument("--transcripts", default="data/eval/transcripts.jsonl")
    p.add_argument("--policy", help="e.g. rl, sft, expert (default: any)")
    p.add_argument("--level", help="default: any")
    p.add_argument("--index", type=int, default=0, help="which of the matching episodes (default: the first)")
    p.set_defaults(func=_show_transcript)

    p = sub.add_parser("serve-env", help="serve an environment family over HTTP (OpenEnv protocol) for env.remote")
    p.add_argument("--env", required=True, help="environment family, e.g. textworld")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--max-episodes", type=int, default=256, help="episodes (sessions) at once (default: 256)")
    p.add_argument("--idle-timeout", type=float, default=600.0,
                   help="seconds after which a silent episode is closed (default: 600)")
    p.add_argument("--game-root", help="only play game files under this folder (default: any path)")
    p.add_argument("--params", default="params.yaml", help="family options (env section) when its env.name matches")
    p.set_defaults(func=_serve_env)

    p = sub.add_parser("finding-page", help="docs/results/<preset>.md from a finished sweep with a seed axis")
    p.add_argument("preset", help="the sweep preset (params/sweep/<preset>.yaml: its description and `paper`)")
    p.add_argument("--verdict", required=True,
                   help="the sentence on whether the paper's shape holds here (or @FILE holding it), written after reading the numbers")
    p.add_argument("--sweep", action="append",
                   help="the sweep's folder (default: data/sweeps/<preset>); repeat it for a sweep run in parts "
                        "(e.g. seed 0 in one clone, seeds 1-2 in another): their rows are joined")
    p.add_argument("--out", help="the page (default: docs/results/<preset>.md; its files go to docs/results/<preset>/)")
    p.add_argument("--project", default=".", help="the DVC project")
    p.set_defaults(func=_finding_page)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
