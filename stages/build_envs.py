"""Stage build_envs: make every curriculum level's train / valid / test games and their manifest.

    python -m stages.build_envs --params params.yaml --out data/envs
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

from agentrecipe.envs.build import build_curriculum
from agentrecipe.envs.manifest import MANIFEST_NAME
from stages.common import load_sections, stage_args


HASH_SEED = "0"


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        # TextWorld writes some sets in hash order (grammar names_to_exclude, quests' fail_events):
        # a build in another process gave other bytes for the same tw-simple and tw-cooking games,
        # so other DVC hashes and another RL fingerprint (a killed run could not resume after a
        # rebuild). The build restarts with a fixed hash seed; its spawned workers inherit it.
        os.execve(sys.executable, [sys.executable, "-m", "stages.build_envs", *sys.argv[1:]],
                  {**os.environ, "PYTHONHASHSEED": HASH_SEED})
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
