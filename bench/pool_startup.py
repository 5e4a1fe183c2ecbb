"""Seconds from opening an EnvPool to its first answer, from a main module that imports what a stage imports.

    python -m bench.pool_startup --workers 2 --repeats 3

A stage (`python -m stages.evaluate`) imports torch and transformers at the top. multiprocessing's
spawn re-runs the parent's main module in every worker, so each worker imported them again before
it could play; `main_module_hidden` (agentrecipe/envs/pool.py) starts workers without it. This
module imports torch and transformers like a stage, then times, side by side in one run, the first
reset of a fresh pool of `--workers` workers on bench/fixed_turn_env.py with the main module
re-run (as before) and hidden (as now), alternating, and prints the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch  # noqa: F401  (what a stage's main module imports)
from transformers import AutoModelForCausalLM  # noqa: F401

from agentrecipe.envs import pool as pool_module
from agentrecipe.envs import registry

sys.path.insert(0, str(Path(__file__).resolve().parent))  # env workers import fixed_turn_env by name
import fixed_turn_env  # noqa: E402

registry.FAMILIES["fixed"] = "fixed_turn_env"
HIDDEN = pool_module.main_module_hidden


def first_answer_seconds(workers: int, hide_main: bool) -> float:
    pool_module.main_module_hidden = HIDDEN if hide_main else contextlib.nullcontext
    try:
        start = time.perf_counter()
        with pool_module.EnvPool("fixed", {}, n_workers=workers, timeout=120) as pool:
            pool.reset(fixed_turn_env.build_games("t4", "train", list(range(workers)), None, {}))
            return time.perf_counter() - start
    finally:
        pool_module.main_module_hidden = HIDDEN


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"main re-run (before)": [], "main hidden (now)": []}
    for _ in range(args.repeats):
        for label, hide in (("main re-run (before)", False), ("main hidden (now)", True)):
            times[label].append(first_answer_seconds(args.workers, hide))
    for label, values in times.items():
        print(f"{label:22s} first reset of {args.workers} workers: median {statistics.median(values):.2f} s "
              f"({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
