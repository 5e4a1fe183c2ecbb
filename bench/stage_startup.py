"""CPU and wall time of a stage process that only starts and exits: with and without the garbage
collector pause of stages/__init__.py (no collections while the stage imports, its imports frozen
once it runs).

    python bench/stage_startup.py                       # every stage, 3 repeats
    python bench/stage_startup.py --stage rl --repeats 5

Each run is `python -m stages.<name> --help` (imports, argument parsing, exit: what every stage
process pays before and after its work). "without" runs the same module through
`runpy.run_module`, where sys.argv[0] is not "-m" while the package imports, so the pause is off.
The two are run alternately, so a busy machine slows both alike. Prints one line per stage (median
of the repeats) and a JSON summary on the last line.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["validate", "build_envs", "prepare_model", "gen_sft_data", "sft", "rl", "evaluate", "report"]


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of the child: user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", action="append", choices=STAGES, help="default: every stage")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    summary = {}
    print(f"{'stage':14s} {'with pause: wall / CPU s':>26s} {'without: wall / CPU s':>24s} {'CPU saved':>10s}")
    for stage in args.stage or STAGES:
        runs: dict[str, list[tuple[float, float]]] = {"with": [], "without": []}
        for _ in range(args.repeats):
            runs["with"].append(timed([sys.executable, "-m", f"stages.{stage}", "--help"]))
            runs["without"].append(timed([sys.executable, "-c", "import runpy, sys; sys.argv = ['x', '--help']; "
                                          f"runpy.run_module('stages.{stage}', run_name='__main__', alter_sys=True)"]))
        med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
        saved = med["without"][1] - med["with"][1]
        print(f"{stage:14s} {med['with'][0]:12.2f} / {med['with'][1]:5.2f} {med['without'][0]:13.2f} / "
              f"{med['without'][1]:5.2f} {saved:10.2f}")
        summary[stage] = {"with_wall_s": round(med["with"][0], 2), "with_cpu_s": round(med["with"][1], 2),
                          "without_wall_s": round(med["without"][0], 2), "without_cpu_s": round(med["without"][1], 2)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
