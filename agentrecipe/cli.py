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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrecipe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compose-params", help="compose params/ into params.yaml (what `dvc exp run` does)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. rl=ppo reward=dense")
    p.add_argument("--config-dir", default="params")
    p.add_argument("--output", default="params.yaml")
    p.set_defaults(func=_compose_params)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
