"""Stage build_envs: make every curriculum level's train / valid / test games and their manifest.

    python -m stages.build_envs --params params.yaml --out data/envs
"""

from __future__ import annotations

import time
from collections import Counter

from agentrecipe.envs.build import build_curriculum
from agentrecipe.envs.manifest import MANIFEST_NAME
from stages.common import load_sections, stage_args


def main() -> None:
    args = stage_args(__doc__.splitlines()[0], lambda p: p.add_argument("--out", default="data/envs"))
    env_cfg = load_sections(args.params, ["env"])["env"]

    start = time.perf_counter()
    games = build_curriculum(env_cfg, args.out)
    seconds = time.perf_counter() - start

    counts = Counter((g.level, g.split) for g in games)
    print(f"{len(games)} {env_cfg.name} games in {seconds:.1f} s "
          f"({seconds / max(len(games), 1):.2f} s/game, {env_cfg.workers} workers) -> {args.out}/{MANIFEST_NAME}")
    for level in dict.fromkeys(g.level for g in games):
        splits = ", ".join(f"{s} {counts[level, s]}" for s in ("train", "valid", "test") if counts[level, s])
        print(f"  {level:24s} {splits}")


if __name__ == "__main__":
    main()
