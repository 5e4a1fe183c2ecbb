"""Stage validate: check the whole params.yaml before any stage touches its outputs.

    python -m stages.validate --out data/validated

DVC deletes a stage's outputs right before it runs that stage. Every other stage depends
(through build_envs and prepare_model) on this stage's output, whose content never changes,
so a bad key or value stops `dvc repro` / `dvc exp run` here, with data/ as it was, and a
good params change reruns only the stages whose params changed.
"""

from __future__ import annotations

from pathlib import Path

from agentrecipe.config import ConfigError, load_config
from stages.common import stage_args

OK = "params.yaml validated\n"
"""The output's content: the same for every valid params file, so it never reruns anything downstream."""


def main() -> None:
    args = stage_args(__doc__.splitlines()[0], lambda p: p.add_argument("--out", default="data/validated"))
    try:
        load_config(args.params)
    except ConfigError as e:
        raise SystemExit(
            f"error: {e}\nNothing was run or deleted. Fix the value (in params/ or your -S override), or restore "
            f"the default params.yaml with `make params` (or `git checkout params.yaml`).") from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(OK)
    print(f"validate: {args.params} ok")


if __name__ == "__main__":
    main()
