"""Figures as PNG files (matplotlib, Agg backend: no display needed).

- learning curves from DVCLive logs: one TSV per metric under ``<dir>/plots/metrics/<name>.tsv``
  with a ``step`` column and one value column (named after the metric; ``value`` also read);
  RL curves in two figures: the main one (smoothed training success, validation success,
  return) and the diagnostics (losses, KL, entropy, clipping, value fit, throughput);
- success by level: policies side by side per level, with 95% Wilson intervals;
- a sweep's settings across seeds (`plot_seed_summary`): mean, t interval, a dot per seed.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_tsv(path: str | Path) -> tuple[list[float], list[float]]:
    """(steps, values) of one DVCLive metric file; rows that do not parse are skipped."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    if not rows:
        return [], []
    header = rows[0]
    value_cols = [i for i, h in enumerate(header) if h not in ("step", "timestamp")]
    if "step" not in header or not value_cols:
        return [], []
    s, v = header.index("step"), value_cols[-1]
    steps, values = [], []
    for row in rows[1:]:
        try:
            x, y = float(row[s]), float(row[v])
        except (IndexError, ValueError):
            continue
        if not math.isnan(y):
            steps.append(x)
            values.append(y)
    return steps, values


def find_curves(root: str | Path) -> dict[str, Path]:
    """{metric name: tsv path} of every TSV under `root` (names relative to plots/metrics when present)."""
    root = Path(root)
    base = root / "plots" / "metrics" if (root / "plots" / "metrics").is_dir() else root
    if not base.is_dir():
        return {}
    return {p.relative_to(base).with_suffix("").as_posix(): p for p in sorted(base.rglob("*.tsv"))}


RL_MAIN = ("rollout/success", "valid/success", "rollout/return")
"""The RL curves a reader looks at first: training success, held-out validation success, return."""


def smooth(values: list[float], weight: float) -> list[float]:
    """Exponential moving average, debiased (TensorBoard's smoothing): s_t = w s_{t-1} + (1 - w) x_t,
    divided by 1 - w^t so the first points are not pulled towards 0."""
    out, acc = [], 0.0
    for t, x in enumerate(values, 1):
        acc = weight * acc + (1 - weight) * x
        out.append(acc / (1 - weight**t) if weight > 0 else x)
    return out


def split_rl_curves(curves: dict[str, Path]) -> tuple[dict[str, Path], dict[str, Path]]:
    """(main, diagnostics): the RL_MAIN series in that order, and every other series."""
    main = {name: curves[name] for name in RL_MAIN if name in curves}
    return main, {name: p for name, p in curves.items() if name not in main}


def plot_curves(curves: dict[str, Path], out: str | Path, title: str, ncols: int = 3,
                smoothing: float = 0.0) -> Path | None:
    """One subplot per metric; with `smoothing` > 0 the raw series is drawn faint under its EMA.
    None (and no file) when no curve has a point."""
    data = {name: read_tsv(p) for name, p in curves.items()}
    data = {name: xy for name, xy in data.items() if xy[0]}
    if not data:
        return None
    ncols = min(ncols, len(data))
    nrows = math.ceil(len(data) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows + 0.5), squeeze=False)
    for ax, (name, (steps, values)) in zip(axes.flat, data.items()):
        if smoothing > 0 and len(values) > 2:
            ax.plot(steps, values, linewidth=0.8, alpha=0.3, color="C0")
            ax.plot(steps, smooth(values, smoothing), linewidth=1.6, color="C0", label=f"EMA {smoothing}")
            ax.legend(fontsize=7, loc="best")
        else:
            ax.plot(steps, values, marker="." if len(steps) < 30 else None, linewidth=1.2)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(data):]:
        ax.axis("off")
    width, height = fig.get_size_inches()
    fig.suptitle(title, y=1 - 0.12 / height, va="top")
    # fixed margins in inches, not tight_layout: its measuring pass over every tick label cost
    # seconds per figure with the RL diagnostics' dozens of panels, and every panel is alike
    fig.subplots_adjust(left=0.6 / width, right=1 - 0.2 / width, bottom=0.5 / height, top=1 - 0.85 / height,
                        wspace=0.3, hspace=0.5)
    return _save(fig, out)


def plot_success_by_level(metrics: dict, out: str | Path, levels: list[str] | None = None) -> Path:
    """Grouped bars: greedy success per level (x) and policy (colour), 95% Wilson interval as error bars."""
    from agentrecipe.report.tables import levels_of

    levels = levels or levels_of(metrics)
    policies = list(metrics)
    width = 0.8 / max(len(policies), 1)
    fig, ax = plt.subplots(figsize=(min(14.0, max(5.0, 1.5 + 0.35 * len(levels) * len(policies))), 3.6))
    for j, policy in enumerate(policies):
        xs, ys, err = [], [], [[], []]
        for i, lvl in enumerate(levels):
            c = metrics[policy].get(lvl)
            if not c or c.get("success") is None:
                continue
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(c["success"])
            err[0].append(max(0.0, c["success"] - c.get("success_ci_low", c["success"])))
            err[1].append(max(0.0, c.get("success_ci_high", c["success"]) - c["success"]))
        ax.bar(xs, ys, width, yerr=err, capsize=2, label=policy, error_kw={"ecolor": "0.35", "elinewidth": 0.8})
    ax.set_xticks(range(len(levels)), levels, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success (greedy)")
    ax.set_title("Success by level (95% Wilson interval)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncols=min(len(policies), 6), loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    return _save(fig, out)


def plot_seed_summary(summaries: list[dict[str, Any]], keys: list[str], title: str, path: str | Path) -> Path:
    """RL success per setting (`keys`: the swept keys other than the seed), in-domain and OOD: the mean
    across seeds with its t interval, a dot per seed."""
    labels = ["\n".join(f"{k.split('.')[-1]}={s[k]}" for k in keys) or "all" for s in summaries]
    per_setting = max(1.3, 0.075 * max(len(line) for label in labels for line in label.split("\n")))  # 7 pt text
    fig, ax = plt.subplots(figsize=(max(6, per_setting * len(summaries)), 3.8))
    for i, (column, label) in enumerate((("rl in-domain", "in-domain"), ("rl ood", "out-of-domain"))):
        xs = [x + 0.4 * i for x in range(len(summaries))]
        mean = [s[f"{column} mean"] for s in summaries]
        err = [[0 if math.isnan(s[f"{column} low"]) else s[f"{column} mean"] - s[f"{column} low"] for s in summaries],
               [0 if math.isnan(s[f"{column} high"]) else s[f"{column} high"] - s[f"{column} mean"] for s in summaries]]
        ax.bar(xs, mean, 0.4, label=label, yerr=err, capsize=3, alpha=0.8)
        for x, s in zip(xs, summaries):
            values = [float(v) for v in s[f"{column} per seed"].split()]
            ax.plot([x] * len(values), values, "k.", markersize=5)
    ax.set_xticks([x + 0.2 for x in range(len(summaries))], labels, fontsize=7)
    ax.set_ylabel("RL success (greedy)")
    ax.set_ylim(0, 1)
    ax.set_title(f"sweep {title}: mean of seeds, 95% t interval, dots = seeds", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def _save(fig, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
