"""What every stage script shares: reading its params sections and its command line."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any

from agentrecipe.config import ConfigError, load_config


def stage_args(description: str, add_arguments=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default="params.yaml", help="composed params file")
    if add_arguments:
        add_arguments(parser)
    return parser.parse_args()


def load_sections(path: str, sections: list[str]) -> dict[str, Any]:
    """Typed sections of params.yaml; a bad key stops the stage before any work."""
    try:
        return load_config(path, sections)
    except ConfigError as e:
        sys.exit(f"error: {e}")


def torch_threads() -> None:
    """Half the cores for torch (AGENTRECIPE_THREADS overrides): environment workers and other
    stages need the rest, and oversubscribed OpenMP threads spin. Measured on 2 cores with the
    other core busy: one rollout took 38.6 s of generation with 2 threads, 2.5 s with 1."""
    import torch

    n = int(os.environ.get("AGENTRECIPE_THREADS", "0")) or max(1, (os.cpu_count() or 1) // 2)
    torch.set_num_threads(n)


def is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


@contextlib.contextmanager
def live_metrics(path: str, resume: bool = False):
    """DVCLive on rank 0 (None on other ranks, whose logger then does nothing)."""
    if not is_rank0():
        yield None
        return
    from dvclive import Live

    with Live(path, save_dvc_exp=False, dvcyaml=None, report=None, resume=resume) as live:
        yield live


def dvclive_logger(live):
    """A `log(step, metrics)` callback writing DVCLive metrics at `step` (no-op without a Live)."""

    def log(step: int, metrics: dict) -> None:
        if live is None:
            return
        live.step = step
        for key, value in metrics.items():
            live.log_metric(key, value)
        live.make_summary()

    return log
